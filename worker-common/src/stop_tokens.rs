//! [`WithStopTokens`]: an engine that also stops on a model's end-of-generation tokens.
//!
//! The wire's `SamplingParams` carries no token ids to stop on, and the router only knows the
//! model's EOS. A real model has more (SmolLM2: `<|im_end|>` and `<|endoftext|>`): the worker
//! reads them from the model file and adds them to every request here, unless the request
//! asks to ignore EOS.

use std::sync::Arc;

use dolphin_engine::{
    BatchWait, DriveStart, Engine, EngineError, EngineInfo, Generated, KvEvent, LoadSnapshot,
    OutputStream, PrefillOutput, Reservation, SeqDriver, SeqId, SeqRequest, StepProfile,
};

/// Delegates to `inner`, adding `stops` to each request's `stop_token_ids`.
pub struct WithStopTokens {
    inner: Arc<dyn Engine>,
    stops: Vec<u32>,
}

impl std::fmt::Debug for WithStopTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithStopTokens")
            .field("engine", &self.inner.info().engine)
            .field("stops", &self.stops)
            .finish()
    }
}

impl WithStopTokens {
    /// Wraps `inner`; `stops` are token ids that end a generation.
    pub fn new(inner: Arc<dyn Engine>, stops: Vec<u32>) -> Self {
        Self { inner, stops }
    }

    /// The stop tokens added to requests.
    pub fn stops(&self) -> &[u32] {
        &self.stops
    }

    fn with_stops(&self, mut req: SeqRequest) -> SeqRequest {
        if !req.sampling.ignore_eos {
            for &t in &self.stops {
                if !req.sampling.stop_token_ids.contains(&t) {
                    req.sampling.stop_token_ids.push(t);
                }
            }
        }
        req
    }
}

#[tonic::async_trait]
impl Engine for WithStopTokens {
    fn info(&self) -> &EngineInfo {
        self.inner.info()
    }

    async fn generate(&self, req: SeqRequest) -> Result<OutputStream, EngineError> {
        self.inner.generate(self.with_stops(req)).await
    }

    async fn prefill(
        &self,
        req: SeqRequest,
        skip_blocks: u32,
    ) -> Result<PrefillOutput, EngineError> {
        self.inner.prefill(self.with_stops(req), skip_blocks).await
    }

    async fn prefill_streaming(
        &self,
        req: SeqRequest,
        skip_blocks: u32,
        blocks: tokio::sync::mpsc::UnboundedSender<dolphin_engine::KvBlock>,
    ) -> Result<PrefillOutput, EngineError> {
        self.inner
            .prefill_streaming(self.with_stops(req), skip_blocks, blocks)
            .await
    }

    async fn reserve(&self, req: SeqRequest) -> Result<Reservation, EngineError> {
        self.inner.reserve(self.with_stops(req)).await
    }

    fn import(&self, seq: SeqId, index: u32, data: &[u8]) -> Result<(), EngineError> {
        self.inner.import(seq, index, data)
    }

    async fn resume(&self, seq: SeqId, first: Generated) -> Result<OutputStream, EngineError> {
        self.inner.resume(seq, first).await
    }

    async fn resume_local(&self, seq: SeqId) -> Result<OutputStream, EngineError> {
        self.inner.resume_local(seq).await
    }

    fn cancel(&self, request_id: &str) {
        self.inner.cancel(request_id);
    }

    fn subscribe(&self) -> (Vec<KvEvent>, tokio::sync::broadcast::Receiver<KvEvent>) {
        self.inner.subscribe()
    }

    fn load(&self) -> LoadSnapshot {
        self.inner.load()
    }

    fn set_batch_wait(&self, wait: BatchWait) -> Result<(), EngineError> {
        self.inner.set_batch_wait(wait)
    }

    fn step_profile(&self) -> StepProfile {
        self.inner.step_profile()
    }

    async fn drive(
        &self,
        req: SeqRequest,
        start: DriveStart,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<SeqId, EngineError> {
        self.inner.drive(self.with_stops(req), start, driver).await
    }

    fn append(&self, seq: SeqId, tokens: &[u32], resume: bool) -> Result<(), EngineError> {
        self.inner.append(seq, tokens, resume)
    }

    async fn resume_driven(
        &self,
        seq: SeqId,
        first: Generated,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        self.inner.resume_driven(seq, first, driver).await
    }

    async fn resume_local_driven(
        &self,
        seq: SeqId,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        self.inner.resume_local_driven(seq, driver).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dolphin_engine::{FinishReason, SeqOutput, SimConfig, SimProfile, sim_engine};

    fn engine(stops: Vec<u32>) -> WithStopTokens {
        let mut cfg = SimConfig::new(SimProfile::builtin("dynamo-mocker").expect("profile"));
        cfg.time_scale = 0.0;
        WithStopTokens::new(sim_engine(cfg).expect("sim"), stops)
    }

    fn request(id: &str, max_tokens: u32, ignore_eos: bool) -> SeqRequest {
        let mut req = SeqRequest {
            request_id: id.into(),
            prompt: vec![5, 6, 7, 8],
            sampling: Default::default(),
        };
        req.sampling.max_tokens = max_tokens;
        req.sampling.ignore_eos = ignore_eos;
        req
    }

    async fn run(e: &WithStopTokens, req: SeqRequest) -> (Vec<u32>, FinishReason) {
        let mut out = e.generate(req).await.expect("generate");
        let mut tokens = Vec::new();
        while let Some(ev) = out.recv().await {
            match ev {
                SeqOutput::Token(t) => tokens.push(t.id),
                SeqOutput::Finished { reason, .. } => return (tokens, reason),
                SeqOutput::Error(e) => panic!("engine error: {e}"),
            }
        }
        panic!("stream ended without Finished");
    }

    #[tokio::test]
    async fn a_stop_token_ends_the_request_unless_eos_is_ignored() {
        // The sim's output is deterministic: learn it, then make its third token a stop token.
        let (tokens, reason) = run(&engine(Vec::new()), request("a", 8, false)).await;
        assert_eq!(reason, FinishReason::Length);
        let stop = tokens[2];
        let first = tokens.iter().position(|&t| t == stop).expect("present");
        let e = engine(vec![stop]);
        let (stopped, reason) = run(&e, request("b", 8, false)).await;
        assert_eq!(reason, FinishReason::Stop);
        assert_eq!(stopped, tokens[..=first]);
        let (all, reason) = run(&e, request("c", 8, true)).await;
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(all, tokens);
    }
}

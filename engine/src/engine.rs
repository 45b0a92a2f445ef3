//! The `Engine` trait: the engine as the workers use it.

use std::sync::Arc;

use dolphin_kv_block::KvBlock;

use crate::drive::{DriveStart, SeqDriver};
use crate::error::EngineError;
use crate::scheduler::{BatchWait, StepProfile};
use crate::types::{
    EngineInfo, Generated, KvEvent, LoadSnapshot, OutputStream, PrefillOutput, Reservation, SeqId,
    SeqRequest,
};

/// The engine as the workers use it. Implemented by [`crate::Scheduler`] (continuous batching,
/// chunked prefill, paged KV pool with prefix cache) over any [`crate::Backend`]; object-safe so
/// workers hold `Arc<dyn Engine>`.
#[async_trait::async_trait]
pub trait Engine: Send + Sync + 'static {
    /// What the engine serves.
    fn info(&self) -> &EngineInfo;

    /// Local path: prefill (chunked, mixed into decode steps) and decode. Fails at once with
    /// `InvalidRequest` or `QueueFull`; later failures arrive on the stream.
    async fn generate(&self, req: SeqRequest) -> Result<OutputStream, EngineError>;

    /// Prefill worker: prefill the prompt (reusing this engine's prefix cache), sample the first
    /// token, export blocks from `skip_blocks` on, and release the sequence (its full blocks stay
    /// cached). Dropping the future cancels the request.
    async fn prefill(
        &self,
        req: SeqRequest,
        skip_blocks: u32,
    ) -> Result<PrefillOutput, EngineError>;

    /// Like [`prefill`](Self::prefill), but hands each exported block to `blocks` as soon as its
    /// KV is final, in index order from `skip_blocks`: a full block once the chunk that fills it
    /// is computed, the last (maybe partial) one with the first token. So a prefill worker can
    /// send the first chunks' KV while it computes the rest. The returned output's `blocks` is
    /// empty. If the prefill fails, `blocks` is closed with fewer blocks than the prompt has.
    /// The default runs `prefill` and hands over the blocks at the end.
    async fn prefill_streaming(
        &self,
        req: SeqRequest,
        skip_blocks: u32,
        blocks: tokio::sync::mpsc::UnboundedSender<KvBlock>,
    ) -> Result<PrefillOutput, EngineError> {
        let mut out = self.prefill(req, skip_blocks).await?;
        for b in std::mem::take(&mut out.blocks) {
            if blocks.send(b).is_err() {
                break;
            }
        }
        Ok(out)
    }

    /// Decode worker, remote path: allocate KV for the prompt and its `max_tokens` (admission
    /// control applies: waits in the queue while KV is full; a full queue is `QueueFull`).
    /// Dropping the future cancels the request; once it returns, the caller must end the
    /// reservation with `resume`, `resume_local` or `cancel`.
    async fn reserve(&self, req: SeqRequest) -> Result<Reservation, EngineError>;

    /// Write a received block (index relative to the first non-cached block) into a reservation.
    /// The backend checks the bytes (the sim backend verifies their content): `CorruptKv` if they
    /// are not what the block must hold.
    fn import(&self, seq: SeqId, index: u32, data: &[u8]) -> Result<(), EngineError>;

    /// All blocks imported: start decoding with the prefill worker's first token (streamed first,
    /// with the log probabilities the prefill worker computed for it).
    async fn resume(&self, seq: SeqId, first: Generated) -> Result<OutputStream, EngineError>;

    /// Remote prefill failed: prefill the reservation locally instead (same output as `generate`).
    async fn resume_local(&self, seq: SeqId) -> Result<OutputStream, EngineError>;

    /// Drop a request wherever it is (client gone), by request id; frees its blocks. A stream
    /// still open gets `Finished { reason: Cancelled }`.
    fn cancel(&self, request_id: &str);

    /// Every block cached now (as `Stored` events, parents first) plus a receiver of every later
    /// event, atomically: no event is missed or seen twice. A receiver that lags gets
    /// `RecvError::Lagged` and should subscribe again.
    fn subscribe(&self) -> (Vec<KvEvent>, tokio::sync::broadcast::Receiver<KvEvent>);

    /// Current load.
    fn load(&self) -> LoadSnapshot;

    /// Sets delayed batching: step once `wait.min_batch` sequences are ready, or after
    /// `wait.max_wait`. Engines without it say `InvalidRequest`.
    fn set_batch_wait(&self, wait: BatchWait) -> Result<(), EngineError> {
        let _ = wait;
        Err(EngineError::InvalidRequest(
            "this engine does not delay batches".into(),
        ))
    }

    /// Step times measured so far, by batch size (empty where not measured).
    fn step_profile(&self) -> StepProfile {
        StepProfile::default()
    }

    /// Starts a driven sequence (see `crate::drive`): every token it samples goes to `driver`,
    /// which steers it. Admission as for `generate`. Engines that cannot drive say
    /// `InvalidRequest`.
    async fn drive(
        &self,
        req: SeqRequest,
        start: DriveStart,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<SeqId, EngineError> {
        let _ = (req, start, driver);
        Err(not_driven())
    }

    /// Appends tokens another model wrote to a paused driven sequence; with `resume` it computes
    /// them in one chunk, samples after the last and decodes on; without, it stays paused.
    fn append(&self, seq: SeqId, tokens: &[u32], resume: bool) -> Result<(), EngineError> {
        let _ = (seq, tokens, resume);
        Err(not_driven())
    }

    /// Like `resume`, for a driven sequence: `first` goes to `driver` (without statistics).
    async fn resume_driven(
        &self,
        seq: SeqId,
        first: Generated,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        let _ = (seq, first, driver);
        Err(not_driven())
    }

    /// Like `resume_local`, for a driven sequence.
    async fn resume_local_driven(
        &self,
        seq: SeqId,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        let _ = (seq, driver);
        Err(not_driven())
    }
}

fn not_driven() -> EngineError {
    EngineError::InvalidRequest("this engine does not drive sequences".into())
}

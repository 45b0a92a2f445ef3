//! Streaming a request's engine output to the client as `DecodeResponse` messages: token ids as
//! they come (coalescing what is already waiting), then one last message with the finish reason,
//! usage and timings.

use std::time::{Duration, Instant};

use dolphin_engine::{Engine, FinishReason, Generated, OutputStream, SeqOutput, SeqUsage};
use dolphin_proto::v1;
use dolphin_worker_common::logprobs;
use dolphin_worker_common::metrics as m;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// Most token ids put in one message when several are already waiting.
const MAX_TOKENS_PER_MESSAGE: usize = 64;

/// How the prompt's KV was made, for the final message's timings.
#[derive(Debug, Clone, Copy)]
pub struct PrefillTimings {
    /// Waiting for admission: this worker's reservation, plus the prefill worker's queue.
    pub queued: Duration,
    /// Prefill time when a prefill worker reported it; `None`: measured here from
    /// `prefill_started` to the first token (local prefill, whose admission the engine does not
    /// report, so its queueing counts as prefill).
    pub prefill: Option<Duration>,
    /// When the prefill started, as this worker saw it.
    pub prefill_started: Instant,
    /// Time the prefill worker spent pushing the KV.
    pub kv_transfer: Duration,
    /// KV bytes received from the prefill worker and imported here.
    pub kv_bytes: u64,
    /// The path the prefill really took (the router's decision, unless this worker held the
    /// prompt or the remote prefill failed).
    pub path: v1::PrefillPath,
    /// Prompt tokens the prefill worker found in its cache.
    pub remote_cached_tokens: u32,
}

impl PrefillTimings {
    /// A local prefill that started on arrival.
    pub fn local(arrived: Instant) -> Self {
        Self {
            queued: Duration::ZERO,
            prefill: None,
            prefill_started: arrived,
            kv_transfer: Duration::ZERO,
            kv_bytes: 0,
            path: v1::PrefillPath::Local,
            remote_cached_tokens: 0,
        }
    }

    /// Whether a remote prefill failed and the prompt was prefilled here.
    pub fn fell_back(&self) -> bool {
        self.path == v1::PrefillPath::LocalFallback
    }
}

/// How forwarding ended.
#[derive(Debug)]
pub enum Forwarded {
    /// The engine finished the request (the final message is sent).
    Finished(FinishReason),
    /// The client went away.
    ClientGone,
}

/// One request's output being streamed.
pub struct Forwarder<'a> {
    /// Where messages go.
    pub tx: &'a mpsc::Sender<Result<v1::DecodeResponse, Status>>,
    /// The engine (to cancel the request when the worker stops).
    pub engine: &'a dyn Engine,
    /// The request's id.
    pub request_id: &'a str,
    /// When the request reached this worker.
    pub arrived: Instant,
    /// How the prompt was prefilled.
    pub prefill: PrefillTimings,
    /// `local` or `remote`, for metrics.
    pub mode: &'static str,
}

impl Forwarder<'_> {
    /// Streams `output` until the engine finishes it. When `abort` fires (drain grace over),
    /// the request is cancelled in the engine, which then finishes it with reason `Cancelled`.
    pub async fn run(
        &self,
        output: &mut OutputStream,
        abort: &CancellationToken,
    ) -> Result<Forwarded, Status> {
        let mut first_token_at: Option<Instant> = None;
        let mut aborted = false;
        let mut pending: Option<SeqOutput> = None;
        loop {
            let item = match pending.take() {
                Some(item) => Some(item),
                None => tokio::select! {
                    item = output.recv() => item,
                    () = abort.cancelled(), if !aborted => {
                        aborted = true;
                        self.engine.cancel(self.request_id);
                        continue;
                    }
                },
            };
            match item {
                Some(SeqOutput::Token(token)) => {
                    let mut token_ids = Vec::with_capacity(1);
                    // Only the first token carries them.
                    let prompt_logprobs: Vec<v1::TokenLogprobs> = token
                        .prompt_logprobs
                        .iter()
                        .map(logprobs::to_wire)
                        .collect();
                    // Either every token of a request has log probabilities or none has.
                    let mut logprobs = Vec::new();
                    let mut add = |t: Generated, ids: &mut Vec<u32>| {
                        ids.push(t.id);
                        logprobs.extend(t.logprobs.as_deref().map(logprobs::to_wire));
                    };
                    add(token, &mut token_ids);
                    while token_ids.len() < MAX_TOKENS_PER_MESSAGE {
                        match output.try_recv() {
                            Ok(SeqOutput::Token(t)) => add(t, &mut token_ids),
                            Ok(other) => {
                                pending = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    if first_token_at.is_none() {
                        let now = Instant::now();
                        first_token_at = Some(now);
                        metrics::histogram!(m::DECODE_TTFT_SECONDS, "mode" => self.mode)
                            .record(now.duration_since(self.arrived).as_secs_f64());
                    }
                    metrics::counter!(m::DECODE_OUTPUT_TOKENS_TOTAL)
                        .increment(token_ids.len() as u64);
                    let message = v1::DecodeResponse {
                        token_ids,
                        logprobs,
                        prompt_logprobs,
                        fell_back: self.prefill.fell_back(),
                        path: self.prefill.path as i32,
                        ..Default::default()
                    };
                    if self.tx.send(Ok(message)).await.is_err() {
                        return Ok(Forwarded::ClientGone);
                    }
                }
                Some(SeqOutput::Finished { reason, usage }) => {
                    let message = self.final_message(reason, usage, first_token_at, Instant::now());
                    if self.tx.send(Ok(message)).await.is_err() {
                        return Ok(Forwarded::ClientGone);
                    }
                    return Ok(Forwarded::Finished(reason));
                }
                Some(SeqOutput::Error(message)) => {
                    return Err(Status::internal(format!("engine failed: {message}")));
                }
                None => {
                    return Err(Status::internal(
                        "engine ended the output stream without finishing",
                    ));
                }
            }
        }
    }

    /// The last message: no tokens, the finish reason, usage and timings.
    fn final_message(
        &self,
        reason: FinishReason,
        usage: SeqUsage,
        first_token_at: Option<Instant>,
        now: Instant,
    ) -> v1::DecodeResponse {
        v1::DecodeResponse {
            token_ids: Vec::new(),
            finish_reason: finish_reason(reason) as i32,
            usage: Some(v1::Usage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                // Tokens from any cache: this worker's leading blocks or the prefill worker's
                // (both count from the prompt's start, so the larger covers the other).
                cached_tokens: usage.cached_tokens.max(self.prefill.remote_cached_tokens),
                by_model: usage
                    .by_model
                    .iter()
                    .map(|m| v1::ModelUsage {
                        model: m.model.clone(),
                        completion_tokens: m.tokens,
                    })
                    .collect(),
                handoffs: usage.handoffs,
                handoff_algorithm: usage.handoff_algorithm.clone(),
            }),
            timings: Some(timings(
                &self.prefill,
                self.arrived,
                first_token_at,
                now,
                usage.completion_tokens,
            )),
            fell_back: self.prefill.fell_back(),
            path: self.prefill.path as i32,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        }
    }
}

/// The wire's finish reason.
pub fn finish_reason(reason: FinishReason) -> v1::FinishReason {
    match reason {
        FinishReason::Length => v1::FinishReason::Length,
        FinishReason::Stop => v1::FinishReason::Stop,
        FinishReason::Cancelled => v1::FinishReason::Cancelled,
    }
}

/// Timings of a finished request, in microseconds since it reached this worker.
pub fn timings(
    prefill: &PrefillTimings,
    arrived: Instant,
    first_token_at: Option<Instant>,
    now: Instant,
    completion_tokens: u32,
) -> v1::Timings {
    let first = first_token_at.unwrap_or(now);
    let ttft = first.saturating_duration_since(arrived);
    let e2e = now.saturating_duration_since(arrived);
    let prefill_time = prefill
        .prefill
        .unwrap_or_else(|| first.saturating_duration_since(prefill.prefill_started));
    let tpot = if completion_tokens > 1 {
        (e2e.saturating_sub(ttft)) / (completion_tokens - 1)
    } else {
        Duration::ZERO
    };
    v1::Timings {
        queued_us: micros(prefill.queued),
        prefill_us: micros(prefill_time),
        kv_transfer_us: micros(prefill.kv_transfer),
        ttft_us: micros(ttft),
        e2e_us: micros(e2e),
        tpot_us: micros(tpot),
        kv_bytes: prefill.kv_bytes,
    }
}

/// Microseconds, saturating.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_measure_from_arrival() {
        let arrived = Instant::now();
        let prefill = PrefillTimings {
            queued: Duration::from_millis(5),
            prefill: None,
            prefill_started: arrived + Duration::from_millis(10),
            kv_transfer: Duration::ZERO,
            kv_bytes: 0,
            path: v1::PrefillPath::LocalFallback,
            remote_cached_tokens: 0,
        };
        let first = arrived + Duration::from_millis(30);
        let end = arrived + Duration::from_millis(130);
        let t = timings(&prefill, arrived, Some(first), end, 11);
        assert_eq!(t.queued_us, 5_000);
        assert_eq!(t.prefill_us, 20_000, "first token minus prefill start");
        assert_eq!(t.ttft_us, 30_000);
        assert_eq!(t.e2e_us, 130_000);
        assert_eq!(t.tpot_us, 10_000, "100 ms over 10 tokens after the first");
    }

    #[test]
    fn reported_prefill_time_wins_and_single_token_has_no_tpot() {
        let arrived = Instant::now();
        let prefill = PrefillTimings {
            prefill: Some(Duration::from_millis(7)),
            kv_transfer: Duration::from_millis(3),
            kv_bytes: 4096,
            ..PrefillTimings::local(arrived)
        };
        let t = timings(
            &prefill,
            arrived,
            None,
            arrived + Duration::from_millis(50),
            1,
        );
        assert_eq!(t.prefill_us, 7_000);
        assert_eq!(t.kv_transfer_us, 3_000);
        assert_eq!(t.kv_bytes, 4096);
        assert_eq!(t.ttft_us, 50_000, "no token: ttft is the whole request");
        assert_eq!(t.tpot_us, 0);
    }

    #[test]
    fn finish_reasons_map_one_to_one() {
        assert_eq!(
            finish_reason(FinishReason::Length),
            v1::FinishReason::Length
        );
        assert_eq!(finish_reason(FinishReason::Stop), v1::FinishReason::Stop);
        assert_eq!(
            finish_reason(FinishReason::Cancelled),
            v1::FinishReason::Cancelled
        );
    }
}

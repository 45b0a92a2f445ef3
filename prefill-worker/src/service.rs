//! `dolphin.v1.PrefillWorker`: prefill a prompt and push its KV to the decode worker that asked;
//! the first token and timings go with the last block, in the transfer's end frame.

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use dolphin_kv_transfer::KvTransport;
use dolphin_proto::prost::Message;
use dolphin_proto::v1::{self, prefill_worker_server::PrefillWorker};
use dolphin_worker_common::{
    WorkerState, engine_status, logprobs,
    metrics::{self as m, outcome},
    seq_request,
};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::kv_link::KvLinks;
use crate::transfer_status::transfer_status;

/// `dolphin.v1.PrefillWorker` over a worker's engine and a KV transport (TCP's pooled
/// `KvSender`; NCCL's sender implements the same trait).
#[derive(Debug, Clone)]
pub struct PrefillService {
    state: Arc<WorkerState>,
    sender: Arc<dyn KvTransport>,
    links: KvLinks,
}

impl PrefillService {
    /// The service for one prefill worker.
    pub fn new(state: Arc<WorkerState>, sender: Arc<dyn KvTransport>, links: KvLinks) -> Self {
        Self {
            state,
            sender,
            links,
        }
    }

    /// Refuses to compute KV for a decode worker of another build or KV layout: during a
    /// rolling upgrade the router pairs only compatible workers, and this is the check at the
    /// other end, so KV never crosses versions even when the router's view is stale.
    #[allow(clippy::result_large_err)] // tonic::Status is the handler's error type
    fn check_compat(&self, decode: &v1::KvCompat) -> Result<(), Status> {
        self.state
            .kv_compat()
            .check(&dolphin_cluster::KvCompat::from(decode))
            .map_err(|mismatch| {
                metrics::counter!(m::PREFILL_INCOMPATIBLE_TOTAL, "reason" => mismatch.as_str())
                    .increment(1);
                tracing::warn!(%mismatch, "refused a prefill for an incompatible decode worker");
                Status::failed_precondition(format!(
                    "this prefill worker's KV cannot go to that decode worker: {mismatch}"
                ))
            })
    }

    /// Validates, prefills and pushes the blocks, the result in the end frame's trailer.
    /// Dropping the future (the caller's deadline passed, or it went away) drops the engine
    /// call, which cancels the request there.
    async fn prefill_and_push(
        &self,
        req: v1::PrefillRequest,
    ) -> Result<v1::PrefillResponse, Status> {
        let engine = self.state.engine();
        let info = engine.info();
        if req.target_kv_addr.is_empty() {
            return Err(Status::invalid_argument("target_kv_addr is required"));
        }
        if let Some(decode) = &req.decode_compat {
            self.check_compat(decode)?;
        }
        let prompt_blocks = req
            .token_ids
            .len()
            .div_ceil(info.block_size.max(1) as usize);
        if req.skip_blocks as usize >= prompt_blocks && !req.token_ids.is_empty() {
            // The decode worker holds the whole prompt: it has nothing to ask for.
            return Err(Status::invalid_argument(format!(
                "skip_blocks {} leaves nothing to send of a {prompt_blocks}-block prompt",
                req.skip_blocks
            )));
        }
        let target = req.target_kv_addr;
        let transfer_id = req.transfer_id;
        let skip_blocks = req.skip_blocks;
        if req
            .sampling
            .as_ref()
            .is_some_and(|s| s.prompt_logprobs.is_some())
        {
            // They would have to travel with the KV; the router prefills such requests locally.
            // (The engine refuses them too; refused here, no transfer is opened.)
            return Err(Status::invalid_argument(
                "sampling.prompt_logprobs is computed on the decode worker: prefill locally",
            ));
        }
        let seq = seq_request(req.request_id, req.token_ids, req.sampling, info)?;

        // The engine hands over each block once its chunk is computed, and the sender pushes
        // it at once: the transfer overlaps the rest of the prefill. The first error of either
        // side ends both (dropping the engine call cancels the prefill; dropping the sender
        // breaks the transfer, so the decode worker never sees a short one).
        let n_blocks = (prompt_blocks as u32).saturating_sub(skip_blocks);
        let (blocks_tx, blocks_rx) = tokio::sync::mpsc::unbounded_channel();
        let (result_tx, result_rx) = tokio::sync::oneshot::channel();
        let started = Instant::now();
        let compute =
            tracing::trace_span!(target: dolphin_cluster::otel::TARGET, "prefill.compute");
        let transfer = tracing::trace_span!(
            target: dolphin_cluster::otel::TARGET,
            "prefill.kv_transfer",
            blocks = n_blocks,
        );
        let prefill = async {
            let out = engine
                .prefill_streaming(seq, skip_blocks, blocks_tx)
                .instrument(compute)
                .await
                .map_err(|e| engine_status(&e))?;
            // The result goes with the last block; a prefill that failed drops `result_tx`,
            // which breaks the transfer.
            let result = v1::PrefillResult {
                first_token: out.first_token,
                first_logprobs: out.first_logprobs.as_deref().map(logprobs::to_wire),
                cached_tokens: out.cached_tokens,
                prefill_us: micros(out.prefill),
                queued_us: micros(out.queued),
            };
            let _ = result_tx.send(Bytes::from(result.encode_to_vec()));
            Ok::<_, Status>(out)
        };
        let push = async {
            self.sender
                .send_stream(&target, transfer_id, n_blocks, blocks_rx, result_rx)
                .instrument(transfer)
                .await
                .map_err(|e| transfer_status(&e))
        };
        let (out, stats) = tokio::try_join!(prefill, push)?;
        let pushed_after_prefill = started.elapsed().saturating_sub(out.prefill + out.queued);
        metrics::histogram!(m::PREFILL_SECONDS).record(out.prefill.as_secs_f64());
        metrics::counter!(m::PREFILL_CACHED_TOKENS_TOTAL).increment(u64::from(out.cached_tokens));
        metrics::histogram!(m::PREFILL_KV_SEND_SECONDS).record(pushed_after_prefill.as_secs_f64());
        metrics::counter!(m::PREFILL_KV_BYTES_SENT_TOTAL).increment(stats.bytes);
        tracing::debug!(
            blocks = stats.blocks,
            bytes = stats.bytes,
            cached_tokens = out.cached_tokens,
            after_prefill_us = micros(pushed_after_prefill),
            "prefilled and pushed"
        );
        Ok(v1::PrefillResponse {
            blocks_sent: stats.blocks,
            bytes_sent: stats.bytes,
        })
    }
}

/// Microseconds, saturating.
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[tonic::async_trait]
impl PrefillWorker for PrefillService {
    async fn open_kv_link(
        &self,
        request: Request<v1::OpenKvLinkRequest>,
    ) -> Result<Response<v1::OpenKvLinkResponse>, Status> {
        let target = request.into_inner().target_kv_addr;
        let nccl_id = self.links.open(target).await?;
        Ok(Response::new(v1::OpenKvLinkResponse { nccl_id }))
    }

    async fn prefill(
        &self,
        request: Request<v1::PrefillRequest>,
    ) -> Result<Response<v1::PrefillResponse>, Status> {
        let guard = match self.state.admit() {
            Ok(guard) => guard,
            Err(status) => {
                metrics::counter!(m::WORKER_REQUESTS_TOTAL, "role" => "prefill", "outcome" => outcome::REJECTED)
                    .increment(1);
                return Err(status);
            }
        };
        // The trace continues under the call's span (`ServerSpanLayer`, itself under the
        // decode worker's remote-prefill span): compute and the KV transfer, which overlap.
        let trace = tracing::trace_span!(target: dolphin_cluster::otel::TARGET, "prefill.request");
        let req = request.into_inner();
        let span = tracing::info_span!(
            "prefill",
            request_id = %req.request_id,
            transfer_id = req.transfer_id,
            prompt_tokens = req.token_ids.len(),
            skip_blocks = req.skip_blocks,
        );
        let abort = guard.abort_token();
        let result = tokio::select! {
            result = self.prefill_and_push(req).instrument(trace).instrument(span.clone()) => result,
            // The drain grace period is over: give up (dropping the work cancels it).
            () = abort.cancelled() => Err(Status::unavailable("the prefill worker is stopping")),
        };
        let label = match &result {
            Ok(_) => outcome::OK,
            Err(s)
                if s.code() == tonic::Code::InvalidArgument
                    || s.code() == tonic::Code::ResourceExhausted =>
            {
                outcome::REJECTED
            }
            Err(_) => outcome::ERROR,
        };
        metrics::counter!(m::WORKER_REQUESTS_TOTAL, "role" => "prefill", "outcome" => label)
            .increment(1);
        if let Err(status) = &result {
            span.in_scope(|| tracing::warn!(code = ?status.code(), message = status.message(), "prefill failed"));
        }
        drop(guard);
        result.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_saturates() {
        assert_eq!(micros(std::time::Duration::from_millis(3)), 3000);
        assert_eq!(micros(std::time::Duration::MAX), u64::MAX);
    }
}

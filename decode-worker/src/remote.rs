//! The remote path: with KV reserved here, ask a prefill worker to compute the prompt and push
//! the blocks this worker lacks, import them as they arrive, then decode. The first token comes
//! with the last block, in the transfer's end frame: decoding starts then, without waiting for
//! the call's reply. Any failure (prefill worker unreachable or failing, timeout, broken or
//! corrupt transfer) falls back to prefilling locally: the client sees a slower request, never a
//! lost one.

use std::time::{Duration, Instant};

use dolphin_engine::{Engine, EngineError, Generated, OutputStream, Reservation, SeqId};
use dolphin_kv_transfer::{TransferError, TransferSlot};
use dolphin_proto::prost::Message;
use dolphin_proto::v1::{self, PrefillPath};
use dolphin_worker_common::{
    engine_status, logprobs,
    metrics::{self as m, fallback_reason},
};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::{forward::PrefillTimings, service::DecodeContext};

/// A prefill call prepared before the reservation: the client and the request fields known then.
#[derive(Debug)]
pub struct PrefillCall {
    /// Client of the chosen prefill worker.
    pub client: crate::clients::PrefillClient,
    /// Its address, for logs.
    pub prefill_addr: String,
    /// Request id, prompt and sampling; transfer id, target and skip are filled in here.
    pub request: v1::PrefillRequest,
    /// Give up on the prefill worker after this long.
    pub timeout: Duration,
}

/// Why a remote prefill was abandoned.
#[derive(Debug, thiserror::Error)]
pub enum RemoteFailure {
    /// The prefill worker answered with an error or could not be reached.
    #[error("prefill worker answered {}: {}", .0.code(), .0.message())]
    Prefill(Box<Status>),
    /// The KV transfer failed.
    #[error("KV transfer failed")]
    Transfer(#[source] TransferError),
    /// The engine refused a received block.
    #[error("received KV block rejected")]
    Import(#[source] EngineError),
    /// The transfer's end frame did not carry a readable prefill result.
    #[error("the transfer's result is unreadable")]
    BadResult(#[source] dolphin_proto::prost::DecodeError),
    /// The transfer completed with fewer blocks than reserved.
    #[error("KV transfer ended after {imported} of {expected} blocks")]
    Incomplete {
        /// Blocks imported.
        imported: u32,
        /// Blocks reserved.
        expected: u32,
    },
    /// No complete answer within the timeout.
    #[error("no complete remote prefill within {0:?}")]
    Timeout(Duration),
}

impl RemoteFailure {
    /// The `reason` label of the fallback metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Prefill(status) if status.code() == tonic::Code::DeadlineExceeded => {
                fallback_reason::TIMEOUT
            }
            Self::Prefill(_) => fallback_reason::PREFILL_ERROR,
            Self::Transfer(_) | Self::Incomplete { .. } | Self::BadResult(_) => {
                fallback_reason::TRANSFER_ERROR
            }
            Self::Import(_) => fallback_reason::IMPORT_ERROR,
            Self::Timeout(_) => fallback_reason::TIMEOUT,
        }
    }
}

/// Gets the reserved sequence's KV from the prefill worker, or computes it here when that fails,
/// and returns the decode output stream with how the prefill went.
///
/// A reservation whose prompt this worker already holds up to its last block ([`holds_prompt`])
/// is prefilled here without asking anyone: what is left to compute is at most one block, which
/// the engine computes for the first token anyway, and a round trip would only add the prefill
/// worker's queue, its own compute of whatever it does not cache, and the transfer. The path is
/// reported as `LocalHeld`, so the router and the learner do not credit it to remote prefill.
pub async fn prefill(
    ctx: &DecodeContext,
    reservation: Reservation,
    call: PrefillCall,
    queued: Duration,
    abort: &CancellationToken,
) -> Result<(OutputStream, PrefillTimings), Status> {
    let engine = ctx.state().engine();
    if holds_prompt(&reservation) {
        metrics::counter!(m::DECODE_HELD_PROMPTS_TOTAL).increment(1);
        return local(
            engine.as_ref(),
            reservation.seq,
            queued,
            PrefillPath::LocalHeld,
        )
        .await;
    }
    let started = Instant::now();
    let prefill_addr = call.prefill_addr.clone();
    let result = tokio::select! {
        // Bounded by the call's deadline (see `attempt`).
        result = attempt(ctx, &reservation, call) => result,
        // Drain grace period over: the caller cancels the reservation.
        () = abort.cancelled() => return Err(Status::unavailable("the decode worker is stopping")),
    };
    match result {
        Ok((answer, kv_bytes)) => {
            let waited = started.elapsed();
            metrics::histogram!(m::DECODE_REMOTE_PREFILL_SECONDS).record(waited.as_secs_f64());
            let output = engine
                .resume(
                    reservation.seq,
                    Generated {
                        id: answer.first_token,
                        logprobs: answer
                            .first_logprobs
                            .as_ref()
                            .map(|lp| Box::new(logprobs::from_wire(lp))),
                        prompt_logprobs: Vec::new(),
                    },
                )
                .await
                .map_err(|e| engine_status(&e))?;
            let remote_queued = Duration::from_micros(answer.queued_us);
            let prefill = Duration::from_micros(answer.prefill_us);
            Ok((
                output,
                PrefillTimings {
                    queued: queued + remote_queued,
                    prefill: Some(prefill),
                    prefill_started: started,
                    // What the remote path added to the prefill worker's queue and compute:
                    // the call, and the blocks that were not hidden behind the prefill.
                    kv_transfer: waited.saturating_sub(remote_queued + prefill),
                    kv_bytes,
                    path: PrefillPath::Remote,
                    remote_cached_tokens: answer.cached_tokens,
                },
            ))
        }
        Err(failure) => {
            let reason = failure.reason();
            tracing::warn!(
                prefill_addr,
                reason,
                error = %dolphin_worker_common::error_chain(&failure),
                "remote prefill failed; prefilling locally"
            );
            metrics::counter!(m::DECODE_FALLBACKS_TOTAL, "reason" => reason).increment(1);
            local(
                engine.as_ref(),
                reservation.seq,
                queued,
                PrefillPath::LocalFallback,
            )
            .await
        }
    }
}

/// Whether this worker holds the reserved prompt up to its last block: some leading blocks are
/// cached here and at most one block is left to fill. (The engine never counts the last block
/// as cached, because computing its last token yields the first output token, so at least one
/// block is always expected.)
pub fn holds_prompt(reservation: &Reservation) -> bool {
    reservation.cached_blocks > 0 && reservation.blocks_expected <= 1
}

/// Prefills the reservation here.
async fn local(
    engine: &dyn Engine,
    seq: SeqId,
    queued: Duration,
    path: PrefillPath,
) -> Result<(OutputStream, PrefillTimings), Status> {
    let started = Instant::now();
    let output = engine
        .resume_local(seq)
        .await
        .map_err(|e| engine_status(&e))?;
    Ok((
        output,
        PrefillTimings {
            queued,
            prefill: None,
            prefill_started: started,
            kv_transfer: Duration::ZERO,
            kv_bytes: 0,
            path,
            remote_cached_tokens: 0,
        },
    ))
}

/// One remote prefill: announce the transfer, call the prefill worker and import the blocks as
/// they arrive, both at once; the first failure ends both (dropping the slot rejects the rest of
/// the transfer, dropping the call cancels it on the prefill worker). Done when the transfer is:
/// its end frame carries the prefill's result. Returns that result and the KV bytes imported.
async fn attempt(
    ctx: &DecodeContext,
    reservation: &Reservation,
    call: PrefillCall,
) -> Result<(v1::PrefillResult, u64), RemoteFailure> {
    let transfer_id = ctx.transfer_ids().next_id();
    let mut slot = ctx
        .receiver()
        .expect(transfer_id, reservation.blocks_expected);
    let mut request = call.request;
    request.transfer_id = transfer_id;
    request.skip_blocks = reservation.cached_blocks;
    request.target_kv_addr = ctx.kv_addr().to_string();
    request.decode_compat = Some(ctx.kv_compat().clone());
    let mut request = tonic::Request::new(request);
    // The client's deadline layer ends the call (and with it this attempt) when the time is
    // up, and the prefill worker stops working on it then too; its trace layer puts the
    // prefill worker's spans under this worker's remote-prefill span.
    let timeout = call.timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    request.set_timeout(timeout);
    let mut client = call.client;
    let prefill_addr = call.prefill_addr;
    #[cfg(feature = "nccl")]
    if let Some(links) = ctx.nccl_links() {
        links.ensure(&prefill_addr, client.clone(), ctx.kv_addr());
    }
    let mut rpc = Box::pin(async move {
        client
            .prefill(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| RemoteFailure::Prefill(Box::new(status)))
    });
    let engine = ctx.state().engine();
    let mut replied = false;
    let kv_bytes = {
        let import = import_blocks(
            engine.as_ref(),
            reservation.seq,
            &mut slot,
            reservation.blocks_expected,
        );
        tokio::pin!(import);
        tokio::select! {
            biased;
            imported = &mut import => imported?,
            // A failed call ends the attempt at once (the prefill worker refused, or died
            // before its transfer broke); a reply before the transfer completed cannot come
            // from a healthy worker (it answers after the ack), but the blocks decide.
            answer = &mut rpc => {
                answer?;
                replied = true;
                tokio::time::timeout_at(deadline, import)
                    .await
                    .map_err(|_| RemoteFailure::Timeout(timeout))??
            }
        }
    };
    let trailer = slot.trailer().cloned().unwrap_or_default();
    let result = v1::PrefillResult::decode(trailer).map_err(RemoteFailure::BadResult)?;
    // The call ends on its own once the prefill worker has read our ack; cancelling it now
    // would only cost that worker its pooled connection.
    if !replied {
        tokio::spawn(async move {
            if let Err(failure) = rpc.await {
                tracing::debug!(prefill_addr, error = %failure, "prefill call failed after its transfer completed");
            }
        });
    }
    Ok((result, kv_bytes))
}

/// Writes each arriving block into the reservation; done once the transfer completes. Returns
/// the bytes imported.
async fn import_blocks(
    engine: &dyn Engine,
    seq: SeqId,
    slot: &mut TransferSlot,
    expected: u32,
) -> Result<u64, RemoteFailure> {
    let mut imported = 0u32;
    let mut bytes_imported = 0u64;
    while let Some(block) = slot.recv().await {
        let (index, bytes) = block.map_err(RemoteFailure::Transfer)?;
        engine
            .import(seq, index, &bytes)
            .map_err(RemoteFailure::Import)?;
        imported += 1;
        bytes_imported += bytes.len() as u64;
    }
    metrics::counter!(m::DECODE_KV_BLOCKS_IMPORTED_TOTAL).increment(u64::from(imported));
    if imported != expected {
        return Err(RemoteFailure::Incomplete { imported, expected });
    }
    Ok(bytes_imported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_fixed_reasons() {
        let status = |code| RemoteFailure::Prefill(Box::new(Status::new(code, "x")));
        assert_eq!(status(tonic::Code::Unavailable).reason(), "prefill_error");
        assert_eq!(status(tonic::Code::DeadlineExceeded).reason(), "timeout");
        assert_eq!(
            RemoteFailure::Timeout(Duration::from_secs(1)).reason(),
            "timeout"
        );
        assert_eq!(
            RemoteFailure::Transfer(TransferError::Aborted { id: 1 }).reason(),
            "transfer_error"
        );
        assert_eq!(
            RemoteFailure::Incomplete {
                imported: 1,
                expected: 2
            }
            .reason(),
            "transfer_error"
        );
        assert_eq!(
            RemoteFailure::Import(EngineError::UnknownSequence(1)).reason(),
            "import_error"
        );
    }
}

//! `dolphin.v1.DecodeWorker`: admit a request, get the engine to accept it (generate locally, or
//! reserve KV for a remote prefill), then stream its output from a task of its own.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use dolphin_cluster::otel;
use dolphin_engine::FinishReason;
use dolphin_kv_transfer::KvReceiver;
use dolphin_proto::v1::{self, decode_worker_server::DecodeWorker};
use dolphin_worker_common::{
    AdmissionGuard, WorkerState, engine_status,
    metrics::{self as m, outcome},
    seq_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::{
    cancel::CancelOnDrop,
    clients::PrefillClients,
    forward::{Forwarded, Forwarder, PrefillTimings},
    remote::{self, PrefillCall},
    transfer_ids::TransferIds,
};

/// Messages buffered per response stream; beyond that the stream waits for the client.
const RESPONSE_BUFFER: usize = 64;

/// What the decode service shares across requests.
#[derive(Debug)]
pub struct DecodeContext {
    state: Arc<WorkerState>,
    receiver: KvReceiver,
    /// The published KV address prefill workers push to.
    kv_addr: String,
    /// This worker's build and KV layout, sent with every remote prefill.
    compat: v1::KvCompat,
    clients: PrefillClients,
    transfer_ids: TransferIds,
    default_prefill_timeout: Duration,
    #[cfg(feature = "nccl")]
    nccl: Option<Arc<crate::kv_link::NcclLinks>>,
}

impl DecodeContext {
    /// Context over a worker's state, its bound KV receiver and its clients to prefill workers.
    pub fn new(
        state: Arc<WorkerState>,
        receiver: KvReceiver,
        clients: PrefillClients,
        default_prefill_timeout: Duration,
    ) -> Self {
        let kv_addr = state
            .identity()
            .public_kv_addr
            .clone()
            .unwrap_or_else(|| receiver.local_addr().to_string());
        let compat = v1::KvCompat::from(state.kv_compat());
        Self {
            state,
            receiver,
            kv_addr,
            compat,
            clients,
            transfer_ids: TransferIds::new(),
            default_prefill_timeout,
            #[cfg(feature = "nccl")]
            nccl: None,
        }
    }

    /// KV from prefill workers over NCCL where they agree (`--kv-transport nccl`), joined on
    /// CUDA device `device`.
    #[cfg(feature = "nccl")]
    #[must_use]
    pub fn with_nccl(mut self, device: usize) -> Self {
        let acceptor = self.receiver.nccl_acceptor();
        self.nccl = Some(Arc::new(crate::kv_link::NcclLinks::new(acceptor, device)));
        self
    }

    /// The NCCL links, when this worker takes KV over NCCL.
    #[cfg(feature = "nccl")]
    pub fn nccl_links(&self) -> Option<&Arc<crate::kv_link::NcclLinks>> {
        self.nccl.as_ref()
    }

    /// The worker's shared state.
    pub fn state(&self) -> &Arc<WorkerState> {
        &self.state
    }

    /// The KV transfer listener.
    pub fn receiver(&self) -> &KvReceiver {
        &self.receiver
    }

    /// Where prefill workers push KV: the KV listener's published address.
    pub fn kv_addr(&self) -> &str {
        &self.kv_addr
    }

    /// This worker's build and KV layout (prefill workers refuse a mismatch).
    pub fn kv_compat(&self) -> &v1::KvCompat {
        &self.compat
    }

    /// Transfer id generator.
    pub fn transfer_ids(&self) -> &TransferIds {
        &self.transfer_ids
    }
}

/// `dolphin.v1.DecodeWorker` over a [`DecodeContext`].
#[derive(Debug, Clone)]
pub struct DecodeService {
    ctx: Arc<DecodeContext>,
}

impl DecodeService {
    /// The service for one decode worker.
    pub fn new(ctx: Arc<DecodeContext>) -> Self {
        Self { ctx }
    }
}

/// A request the engine has accepted.
enum Accepted {
    /// Prefilling and decoding locally.
    Local(dolphin_engine::OutputStream),
    /// KV reserved; the prefill worker is to be called.
    Remote {
        reservation: dolphin_engine::Reservation,
        /// Boxed: the client and prompt copy dwarf the local variant.
        call: Box<PrefillCall>,
        queued: Duration,
    },
}

impl DecodeService {
    /// Validates the request and hands it to the engine. Errors here are the call's status. If
    /// the client goes away meanwhile, this future is dropped, and with it the engine call
    /// (which cancels the request there).
    async fn accept(
        &self,
        req: v1::DecodeRequest,
        arrived: Instant,
        deadline: Option<Duration>,
    ) -> Result<Accepted, Status> {
        let engine = self.ctx.state.engine();
        let v1::DecodeRequest {
            request_id,
            token_ids,
            sampling,
            remote,
        } = req;
        let Some(remote) = remote else {
            let seq = seq_request(request_id, token_ids, sampling, engine.info())?;
            let output = engine.generate(seq).await.map_err(|e| engine_status(&e))?;
            return Ok(Accepted::Local(output));
        };
        let client = self.ctx.clients.client(&remote.prefill_addr)?;
        let asked = if remote.timeout_ms == 0 {
            self.ctx.default_prefill_timeout
        } else {
            Duration::from_millis(u64::from(remote.timeout_ms))
        };
        // Never longer than what remains of the request's own deadline (the caller's
        // `grpc-timeout`): the prefill worker gets that as its `grpc-timeout` in turn.
        let timeout = match deadline {
            Some(d) => asked.min(d.saturating_sub(arrived.elapsed())),
            None => asked,
        };
        let request = v1::PrefillRequest {
            request_id: request_id.clone(),
            token_ids: token_ids.clone(),
            sampling: sampling.clone(),
            ..Default::default()
        };
        let seq = seq_request(request_id, token_ids, sampling, engine.info())?;
        let reservation = engine.reserve(seq).await.map_err(|e| engine_status(&e))?;
        Ok(Accepted::Remote {
            reservation,
            call: Box::new(PrefillCall {
                client,
                prefill_addr: remote.prefill_addr,
                request,
                timeout,
            }),
            queued: arrived.elapsed(),
        })
    }
}

#[tonic::async_trait]
impl DecodeWorker for DecodeService {
    type DecodeStream = ReceiverStream<Result<v1::DecodeResponse, Status>>;

    async fn decode(
        &self,
        request: Request<v1::DecodeRequest>,
    ) -> Result<Response<Self::DecodeStream>, Status> {
        let arrived = Instant::now();
        let guard = self
            .ctx
            .state
            .admit()
            .inspect_err(|_| count(outcome::REJECTED))?;
        let deadline = dolphin_proto::deadline::of(request.metadata());
        // The request's trace span on this worker, under the call's span (`ServerSpanLayer`,
        // itself under the router's dispatch span): admit (queue and reservation), then the
        // remote prefill wait, then decode.
        let trace = tracing::trace_span!(target: otel::TARGET, "decode.request");
        let req = request.into_inner();
        let mode = if req.remote.is_some() {
            "remote"
        } else {
            "local"
        };
        let span = tracing::info_span!(
            "decode",
            request_id = %req.request_id,
            mode,
            prompt_tokens = req.token_ids.len(),
        );
        let request_id = req.request_id.clone();
        let admit = tracing::trace_span!(target: otel::TARGET, parent: &trace, "decode.admit");
        let accepted = self
            .accept(req, arrived, deadline)
            .instrument(admit)
            .instrument(span.clone())
            .await
            .inspect_err(|status| {
                count(outcome::REJECTED);
                span.in_scope(|| {
                    tracing::debug!(code = ?status.code(), message = status.message(), "refused");
                });
            })?;
        metrics::counter!(m::DECODE_REQUESTS_TOTAL, "mode" => mode).increment(1);
        // From here on the engine holds the request: end it there whatever happens to us.
        let cancel = CancelOnDrop::new(Arc::clone(self.ctx.state.engine()), request_id);
        let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
        let ctx = Arc::clone(&self.ctx);
        tokio::spawn(
            stream_request(ctx, accepted, tx, guard, cancel, arrived, mode)
                .instrument(trace)
                .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn count(label: &'static str) {
    metrics::counter!(m::WORKER_REQUESTS_TOTAL, "role" => "decode", "outcome" => label)
        .increment(1);
}

/// Runs an accepted request to its end; the admission guard keeps it counted for the drain.
async fn stream_request(
    ctx: Arc<DecodeContext>,
    accepted: Accepted,
    tx: mpsc::Sender<Result<v1::DecodeResponse, Status>>,
    guard: AdmissionGuard,
    mut cancel: CancelOnDrop,
    arrived: Instant,
    mode: &'static str,
) {
    let abort = guard.abort_token();
    let engine = Arc::clone(ctx.state.engine());
    let work = async {
        let (mut output, prefill) = match accepted {
            Accepted::Local(output) => (output, PrefillTimings::local(arrived)),
            Accepted::Remote {
                reservation,
                call,
                queued,
            } => {
                let wait = tracing::trace_span!(target: otel::TARGET, "decode.remote_prefill");
                remote::prefill(&ctx, reservation, *call, queued, &abort)
                    .instrument(wait)
                    .await?
            }
        };
        let forwarder = Forwarder {
            tx: &tx,
            engine: engine.as_ref(),
            request_id: cancel.request_id(),
            arrived,
            prefill,
            mode,
        };
        forwarder
            .run(&mut output, &abort)
            .instrument(tracing::trace_span!(target: otel::TARGET, "decode.generate"))
            .await
    };
    let result = tokio::select! {
        result = work => result,
        // Nobody is listening: stop at once (dropping `cancel` ends the request in the engine).
        () = tx.closed() => Ok(Forwarded::ClientGone),
    };
    match result {
        Ok(Forwarded::Finished(reason)) => {
            cancel.disarm();
            count(if reason == FinishReason::Cancelled {
                outcome::CANCELLED
            } else {
                outcome::OK
            });
        }
        Ok(Forwarded::ClientGone) => {
            tracing::debug!("client went away; cancelling");
            count(outcome::CANCELLED);
        }
        Err(status) => {
            tracing::warn!(code = ?status.code(), message = status.message(), "decode failed");
            count(outcome::ERROR);
            // The client may be gone too; then there is no one to tell.
            let _ = tx.send(Err(status)).await;
        }
    }
    drop(cancel);
    drop(guard);
}

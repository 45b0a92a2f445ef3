//! Starting a decode worker: bind the gRPC and KV listeners, build the state, serve. Used by
//! `run` and by in-process tests.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use dolphin_cluster::{Advertise, Role, WorkerId};
use dolphin_engine::Engine;
use dolphin_kv_transfer::{KvReceiver, TransferConfig};
use dolphin_proto::v1::decode_worker_server::DecodeWorkerServer;
use dolphin_tls::Tls;
use dolphin_worker_common::{
    ConfigError, RunningWorker, WorkerError, WorkerIdentity, WorkerState, bind,
};
use tonic::{server::NamedService, service::Routes};

use crate::{
    clients::PrefillClients,
    error::DecodeError,
    service::{DecodeContext, DecodeService},
};

/// What a decode worker needs besides its engine.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// Worker id.
    pub worker_id: WorkerId,
    /// Model name served.
    pub model: String,
    /// gRPC listen address (port 0 allowed).
    pub grpc_addr: SocketAddr,
    /// Published gRPC address (`None`: the bound one, which must then be concrete).
    pub advertise: Option<Advertise>,
    /// KV transfer listen address (port 0 allowed).
    pub kv_addr: SocketAddr,
    /// Published KV transfer address, where prefill workers push blocks (`None`: the bound
    /// one, which must then be concrete).
    pub kv_advertise: Option<Advertise>,
    /// Remote prefill timeout for requests that set none.
    pub prefill_timeout: Duration,
    /// KV transport settings (should match the prefill workers').
    pub transfer: TransferConfig,
    /// CUDA device for NCCL communicators (`--kv-transport nccl`); `None`: TCP only.
    pub nccl_device: Option<usize>,
    /// Mutual TLS on the gRPC and KV listeners and to prefill workers; `None`: plaintext.
    pub tls: Option<Tls>,
}

/// gRPC name of the decode service, for health reporting.
const SERVICE_NAME: &str = <DecodeWorkerServer<DecodeService> as NamedService>::NAME;

/// Binds both listeners and serves `DecodeWorker` plus the common services on `engine`.
pub async fn start(
    engine: Arc<dyn Engine>,
    opts: DecodeOptions,
) -> Result<RunningWorker, DecodeError> {
    let (listener, grpc_addr) = bind(opts.grpc_addr, "gRPC").await?;
    let receiver = KvReceiver::bind_with_tls(opts.kv_addr, opts.transfer, opts.tls.as_ref())
        .await
        .map_err(DecodeError::KvListener)?;
    let identity = WorkerIdentity::new(
        opts.worker_id,
        Role::Decode,
        opts.model,
        (grpc_addr, opts.advertise.as_ref()),
        Some((receiver.local_addr(), opts.kv_advertise.as_ref())),
    )
    .map_err(WorkerError::from)?;
    let state = WorkerState::new(identity, engine, SERVICE_NAME);
    let clients = PrefillClients::new(opts.tls.as_ref())
        .map_err(|e| WorkerError::from(ConfigError::invalid("tls-ca", e.to_string())))?;
    let ctx = DecodeContext::new(Arc::clone(&state), receiver, clients, opts.prefill_timeout);
    let ctx = Arc::new(match opts.nccl_device {
        None => ctx,
        Some(device) => with_nccl(ctx, device)?,
    });
    let service = DecodeService::new(ctx);
    let worker = RunningWorker::start(
        listener,
        state,
        Routes::new(DecodeWorkerServer::new(service)),
        opts.tls.as_ref(),
    )
    .await?;
    Ok(worker)
}

#[cfg(feature = "nccl")]
fn with_nccl(ctx: DecodeContext, device: usize) -> Result<DecodeContext, DecodeError> {
    let devices = dolphin_kv_transfer::nccl::probe().map_err(|e| {
        WorkerError::from(ConfigError::invalid(
            "kv-transport",
            format!("nccl cannot run here: {e}"),
        ))
    })?;
    if device >= devices {
        return Err(WorkerError::from(ConfigError::invalid(
            "nccl-device",
            format!("device {device} does not exist ({devices} CUDA devices)"),
        ))
        .into());
    }
    Ok(ctx.with_nccl(device))
}

#[cfg(not(feature = "nccl"))]
fn with_nccl(_ctx: DecodeContext, _device: usize) -> Result<DecodeContext, DecodeError> {
    Err(WorkerError::from(dolphin_worker_common::args::nccl_not_built()).into())
}

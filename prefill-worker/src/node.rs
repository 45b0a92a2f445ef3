//! Starting a prefill worker: bind, build the state, serve. Used by `run` and by in-process tests.

use std::{net::SocketAddr, sync::Arc};

use dolphin_cluster::{Advertise, Role, WorkerId};
use dolphin_engine::Engine;
use dolphin_kv_transfer::{KvSender, KvTransport, TransferConfig};
use dolphin_proto::v1::prefill_worker_server::PrefillWorkerServer;
use dolphin_tls::Tls;
use dolphin_worker_common::{RunningWorker, WorkerError, WorkerIdentity, WorkerState, bind};
use tonic::{server::NamedService, service::Routes};

use crate::kv_link::KvLinks;
use crate::service::PrefillService;

/// What a prefill worker needs besides its engine.
#[derive(Debug, Clone)]
pub struct PrefillOptions {
    /// Worker id.
    pub worker_id: WorkerId,
    /// Model name served.
    pub model: String,
    /// gRPC listen address (port 0 allowed).
    pub grpc_addr: SocketAddr,
    /// Published gRPC address (`None`: the bound one, which must then be concrete).
    pub advertise: Option<Advertise>,
    /// KV transport settings (should match the decode workers').
    pub transfer: TransferConfig,
    /// CUDA device for NCCL communicators (`--kv-transport nccl`); `None`: TCP only.
    pub nccl_device: Option<usize>,
    /// Mutual TLS on the gRPC listener and the KV connections; `None`: plaintext.
    pub tls: Option<Tls>,
}

impl PrefillOptions {
    /// Options for a worker `worker_id` serving `model` on `grpc_addr`: the bound address
    /// published, default KV transport, TCP only, plaintext.
    pub fn new(worker_id: WorkerId, model: impl Into<String>, grpc_addr: SocketAddr) -> Self {
        Self {
            worker_id,
            model: model.into(),
            grpc_addr,
            advertise: None,
            transfer: TransferConfig::default(),
            nccl_device: None,
            tls: None,
        }
    }
}

/// gRPC name of the prefill service, for health reporting.
const SERVICE_NAME: &str = <PrefillWorkerServer<PrefillService> as NamedService>::NAME;

/// Binds the gRPC listener and serves `PrefillWorker` plus the common services on `engine`.
pub async fn start(
    engine: Arc<dyn Engine>,
    opts: PrefillOptions,
) -> Result<RunningWorker, WorkerError> {
    let (listener, grpc_addr) = bind(opts.grpc_addr, "gRPC").await?;
    let identity = WorkerIdentity::new(
        opts.worker_id,
        Role::Prefill,
        opts.model,
        (grpc_addr, opts.advertise.as_ref()),
        None,
    )?;
    let state = WorkerState::new(identity, engine, SERVICE_NAME);
    let (sender, links) = transport(opts.transfer, opts.nccl_device, opts.tls.as_ref())?;
    let service = PrefillService::new(Arc::clone(&state), sender, links);
    RunningWorker::start(
        listener,
        state,
        Routes::new(PrefillWorkerServer::new(service)),
        opts.tls.as_ref(),
    )
    .await
}

/// TCP, or NCCL where a decode worker opened a communicator and TCP elsewhere.
fn transport(
    cfg: TransferConfig,
    nccl_device: Option<usize>,
    tls: Option<&Tls>,
) -> Result<(Arc<dyn KvTransport>, KvLinks), WorkerError> {
    let tcp = KvSender::with_tls(cfg, tls)
        .map_err(|e| dolphin_worker_common::ConfigError::invalid("tls-cert", e.to_string()))?;
    let Some(device) = nccl_device else {
        return Ok((Arc::new(tcp), KvLinks::tcp_only()));
    };
    nccl_transport(tcp, device)
}

#[cfg(feature = "nccl")]
fn nccl_transport(
    tcp: KvSender,
    device: usize,
) -> Result<(Arc<dyn KvTransport>, KvLinks), WorkerError> {
    use dolphin_kv_transfer::nccl::{NcclOrTcp, NcclSender, probe};
    let devices = probe().map_err(|e| {
        dolphin_worker_common::ConfigError::invalid(
            "kv-transport",
            format!("nccl cannot run here: {e}"),
        )
    })?;
    if device >= devices {
        return Err(dolphin_worker_common::ConfigError::invalid(
            "nccl-device",
            format!("device {device} does not exist ({devices} CUDA devices)"),
        )
        .into());
    }
    let nccl = Arc::new(NcclSender::new());
    Ok((
        Arc::new(NcclOrTcp::new(Arc::clone(&nccl), tcp)),
        KvLinks::nccl(nccl, device),
    ))
}

#[cfg(not(feature = "nccl"))]
fn nccl_transport(
    _tcp: KvSender,
    _device: usize,
) -> Result<(Arc<dyn KvTransport>, KvLinks), WorkerError> {
    Err(dolphin_worker_common::args::nccl_not_built().into())
}

//! Starting a prefill worker: bind, build the state, serve. Used by `run` and by in-process tests.

use std::{net::SocketAddr, sync::Arc};

use dolphin_cluster::{Advertise, Role, WorkerId};
use dolphin_engine::Engine;
use dolphin_kv_transfer::{KvSender, TransferConfig};
use dolphin_proto::v1::prefill_worker_server::PrefillWorkerServer;
use dolphin_worker_common::{RunningWorker, WorkerError, WorkerIdentity, WorkerState, bind};
use tonic::{server::NamedService, service::Routes};

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
    let sender = Arc::new(KvSender::new(opts.transfer));
    let service = PrefillService::new(Arc::clone(&state), sender);
    RunningWorker::start(
        listener,
        state,
        Routes::new(PrefillWorkerServer::new(service)),
    )
    .await
}

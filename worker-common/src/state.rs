//! What one running worker is and holds, shared by its gRPC services: identity, engine,
//! admission gate and health.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use dolphin_cluster::{
    Advertise, AdvertiseError, BUILD_VERSION, KvCompat, Role, WorkerId, WorkerRecord, advertised,
};
use dolphin_engine::Engine;
use dolphin_engine::policy::StepLimits;
use dolphin_proto::v1;
use tokio_util::sync::CancellationToken;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    admission::{Admission, AdmissionGuard},
    metrics as m,
};

/// gRPC name of the `Worker` service every worker serves.
const WORKER_SERVICE: &str = <dolphin_proto::v1::worker_server::WorkerServer<
    crate::service::WorkerService,
> as tonic::server::NamedService>::NAME;

/// Load reports go out this often unless a subscriber asks for another interval.
pub const DEFAULT_LOAD_INTERVAL: Duration = Duration::from_millis(200);

/// Who a worker is and where it listens.
#[derive(Debug, Clone)]
pub struct WorkerIdentity {
    /// Unique name in the cluster.
    pub id: WorkerId,
    /// Prefill or decode.
    pub role: Role,
    /// The model name served (from `--model`; clients name it).
    pub model: String,
    /// The bound gRPC address (the real port when the flag said 0).
    pub grpc_addr: SocketAddr,
    /// Decode workers: the bound KV transfer listener.
    pub kv_addr: Option<SocketAddr>,
    /// The published gRPC address (`host:port`): the advertise address, else the bound one.
    pub public_grpc_addr: String,
    /// Decode workers: the published KV transfer address, where prefill workers push blocks.
    pub public_kv_addr: Option<String>,
}

impl WorkerIdentity {
    /// An identity for listeners bound at `grpc_addr` (and `kv_addr`), published as
    /// `advertise` (and `kv_advertise`) or, without one, as bound. Refuses a listener bound to
    /// an unspecified address with nothing to advertise.
    pub fn new(
        id: WorkerId,
        role: Role,
        model: String,
        (grpc_addr, advertise): (SocketAddr, Option<&Advertise>),
        kv: Option<(SocketAddr, Option<&Advertise>)>,
    ) -> Result<Self, AdvertiseError> {
        let public_grpc_addr = advertised(grpc_addr, advertise, "gRPC")?;
        let public_kv_addr = kv
            .map(|(bound, adv)| advertised(bound, adv, "KV transfer"))
            .transpose()?;
        Ok(Self {
            id,
            role,
            model,
            grpc_addr,
            kv_addr: kv.map(|(bound, _)| bound),
            public_grpc_addr,
            public_kv_addr,
        })
    }
}

/// State shared by every service of one worker process.
pub struct WorkerState {
    identity: WorkerIdentity,
    engine: Arc<dyn Engine>,
    admission: Arc<Admission>,
    health: HealthReporter,
    /// gRPC name of the role's own service (`dolphin.v1.DecodeWorker`, ...), reported
    /// NOT_SERVING with the server as a whole while draining.
    role_service: &'static str,
    /// Cancelled when the process stops: ends Subscribe streams so the server can close.
    closing: CancellationToken,
    /// Build version, model, block size and KV layout, fixed for the process's life.
    compat: KvCompat,
}

impl std::fmt::Debug for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerState")
            .field("identity", &self.identity)
            .field("engine", &self.engine.info().engine)
            .field("draining", &self.admission.is_draining())
            .finish_non_exhaustive()
    }
}

impl WorkerState {
    /// State for a worker whose listeners are bound (the identity carries the real addresses).
    /// `role_service` is the gRPC name of the role's service, e.g.
    /// `<DecodeWorkerServer<_> as NamedService>::NAME`.
    pub fn new(
        identity: WorkerIdentity,
        engine: Arc<dyn Engine>,
        role_service: &'static str,
    ) -> Arc<Self> {
        let info = engine.info();
        let compat = KvCompat {
            version: BUILD_VERSION.to_string(),
            model: identity.model.clone(),
            block_size: info.block_size,
            kv_layout: info.kv_layout.clone(),
        };
        Arc::new(Self {
            identity,
            engine,
            compat,
            admission: Admission::new(),
            health: HealthReporter::new(),
            role_service,
            closing: CancellationToken::new(),
        })
    }

    /// Who this worker is.
    pub fn identity(&self) -> &WorkerIdentity {
        &self.identity
    }

    /// The engine requests run on.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// The admission gate.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// Admits one request, or answers UNAVAILABLE while draining (the router retries elsewhere).
    #[allow(clippy::result_large_err)] // tonic::Status is the handler's error type
    pub fn admit(&self) -> Result<AdmissionGuard, tonic::Status> {
        self.admission
            .try_admit()
            .map_err(|e| tonic::Status::unavailable(e.to_string()))
    }

    /// The health reporter the gRPC health service reads.
    pub fn health(&self) -> &HealthReporter {
        &self.health
    }

    /// gRPC name of the role's own service.
    pub fn role_service(&self) -> &'static str {
        self.role_service
    }

    /// Cancelled when the process stops.
    pub fn closing(&self) -> &CancellationToken {
        &self.closing
    }

    /// The record published in etcd (or listed in a static workers file).
    pub fn record(&self) -> WorkerRecord {
        WorkerRecord {
            id: self.identity.id.clone(),
            role: self.identity.role,
            grpc_addr: self.identity.public_grpc_addr.clone(),
            kv_addr: self.identity.public_kv_addr.clone(),
            model: self.compat.model.clone(),
            block_size: self.compat.block_size,
            version: self.compat.version.clone(),
            kv_layout: self.compat.kv_layout.clone(),
            context_length: self.engine.info().context_length,
        }
    }

    /// The answer to `Worker.Info`.
    pub fn info(&self) -> v1::WorkerInfo {
        let info = self.engine.info();
        // 0: unknown (an engine no scheduler runs).
        let limits = info.step_limits.unwrap_or(StepLimits::new(0));
        v1::WorkerInfo {
            worker_id: self.identity.id.0.clone(),
            role: i32::from(self.identity.role),
            model: self.identity.model.clone(),
            grpc_addr: self.identity.public_grpc_addr.clone(),
            kv_addr: self.identity.public_kv_addr.clone().unwrap_or_default(),
            block_size: info.block_size,
            total_blocks: info.total_blocks,
            kv_bytes_per_token: info.kv_bytes_per_token,
            engine: info.engine.to_string(),
            context_length: info.context_length,
            vocab_size: info.vocab_size,
            version: self.compat.version.clone(),
            kv_layout: self.compat.kv_layout.clone(),
            max_batched_tokens: limits.max_batched_tokens,
            prefill_chunk_tokens: limits.prefill_chunk_tokens,
            mixed_prefill_tokens: limits.mixed_prefill_tokens,
        }
    }

    /// What must match for KV to move to or from this worker.
    pub fn kv_compat(&self) -> &KvCompat {
        &self.compat
    }

    /// Marks the worker serving in the health service (at start).
    pub async fn mark_serving(&self) {
        self.health
            .set_service_status("", ServingStatus::Serving)
            .await;
        self.health
            .set_service_status(self.role_service, ServingStatus::Serving)
            .await;
        // Info and Subscribe keep serving through a drain, so this one never turns NOT_SERVING.
        self.health
            .set_service_status(WORKER_SERVICE, ServingStatus::Serving)
            .await;
        metrics::gauge!(m::WORKER_DRAINING).set(0.0);
    }

    /// Stops admitting requests and reports NOT_SERVING (the server as a whole and the role's
    /// service; `Worker` itself keeps serving Info and Subscribe). Idempotent. Returns the
    /// number of requests still running.
    pub async fn begin_drain(&self) -> usize {
        if self.admission.start_drain() {
            tracing::info!(
                worker_id = %self.identity.id,
                running = self.admission.inflight(),
                "draining: no new requests"
            );
            metrics::gauge!(m::WORKER_DRAINING).set(1.0);
            self.health
                .set_service_status("", ServingStatus::NotServing)
                .await;
            self.health
                .set_service_status(self.role_service, ServingStatus::NotServing)
                .await;
        }
        self.admission.inflight()
    }
}

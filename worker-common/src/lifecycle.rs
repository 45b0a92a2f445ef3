//! A worker process's life after its server runs: register, announce, wait for a stop signal,
//! drain, leave etcd, stop.

use std::time::Duration;

use dolphin_cluster::{DiscoveryError, EtcdConfig, Registration, WorkerRecord};

use crate::{StopSignals, error::WorkerError, ready::print_ready, server::RunningWorker};

/// How the process joins and leaves the cluster.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    /// etcd to register in; `None`: static discovery, nothing to register.
    pub etcd: Option<EtcdConfig>,
    /// How long running requests may finish after a stop signal.
    pub drain_grace: Duration,
}

/// How often a worker whose key is still held retries (see [`register`]).
const TAKEN_RETRY: Duration = Duration::from_millis(500);

/// Registers `record`. A key still held by another lease is retried for one lease TTL (plus a
/// margin): a worker restarted under the same id (a Kubernetes container restart keeps the pod
/// name, `dolphinctl up` keeps ids with static discovery) finds its predecessor's record until
/// that lease expires. A key still held after that belongs to a live twin: the error stands.
async fn register(cfg: &EtcdConfig, record: WorkerRecord) -> Result<Registration, WorkerError> {
    let ttl = Duration::from_secs(cfg.lease_ttl_secs.max(1).unsigned_abs());
    let deadline = tokio::time::Instant::now() + ttl + Duration::from_secs(3);
    let mut announced = false;
    loop {
        match Registration::register(cfg, record.clone()).await {
            Err(DiscoveryError::AlreadyRegistered { key })
                if tokio::time::Instant::now() < deadline =>
            {
                if !announced {
                    tracing::warn!(%key, ttl_secs = cfg.lease_ttl_secs,
                        "worker id still registered (a previous run's lease?); retrying until it expires");
                    announced = true;
                }
                tokio::time::sleep(TAKEN_RETRY).await;
            }
            result => return result.map_err(WorkerError::Registration),
        }
    }
}

/// Runs a started worker until SIGTERM/SIGINT: registers it (when etcd is configured), prints
/// the READY line, waits, then drains (NOT_SERVING, UNAVAILABLE for new requests, running ones
/// finish within the grace period), revokes the lease and stops the server. `Ok` means a clean
/// stop: the process exits 0.
pub async fn run_until_stopped(
    worker: RunningWorker,
    mut signals: StopSignals,
    lifecycle: Lifecycle,
) -> Result<(), WorkerError> {
    let state = worker.state();
    let registration = match &lifecycle.etcd {
        Some(cfg) => {
            let registration = register(cfg, state.record()).await?;
            tracing::info!(endpoints = ?cfg.endpoints, cluster = %cfg.cluster, "registered in etcd");
            Some(registration)
        }
        None => None,
    };
    // Announce only once the worker is discoverable, so whoever reads the line can use it.
    let identity = state.identity();
    print_ready(
        identity.role,
        &identity.id,
        &identity.public_grpc_addr,
        identity.public_kv_addr.as_deref(),
    )
    .map_err(WorkerError::Ready)?;
    tracing::info!(
        worker_id = %identity.id,
        role = %identity.role,
        version = dolphin_cluster::BUILD_VERSION,
        grpc_addr = %identity.public_grpc_addr,
        kv_addr = ?identity.public_kv_addr,
        grpc_bound = %identity.grpc_addr,
        kv_bound = ?identity.kv_addr,
        "worker ready"
    );

    let unexpected_stop = tokio::select! {
        signal = signals.recv() => {
            tracing::info!(signal = signal.as_str(), "stop signal: draining");
            false
        }
        () = worker.server_exited() => {
            tracing::error!("gRPC server stopped on its own; leaving the cluster");
            true
        }
    };

    let clean = worker.drain(lifecycle.drain_grace).await;
    if let Some(registration) = registration {
        // Leave membership at once rather than after the TTL; a failure here only delays it.
        match registration.shutdown().await {
            Ok(()) => tracing::info!("etcd lease revoked"),
            Err(err) => {
                tracing::warn!(error = %err, "could not revoke the etcd lease; it expires with its TTL")
            }
        }
    }
    let stopped = worker.stop().await;
    tracing::info!(all_requests_finished = clean, "worker stopped");
    stopped?;
    if unexpected_stop {
        return Err(WorkerError::ServerStopped);
    }
    Ok(())
}

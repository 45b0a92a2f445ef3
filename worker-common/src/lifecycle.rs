//! A worker process's life after its server runs: register, announce, wait for a stop signal,
//! drain, leave etcd, stop.

use std::time::Duration;

use dolphin_cluster::{EtcdConfig, Registration};

use crate::{error::WorkerError, ready::print_ready, server::RunningWorker, signal::StopSignals};

/// How the process joins and leaves the cluster.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    /// etcd to register in; `None`: static discovery, nothing to register.
    pub etcd: Option<EtcdConfig>,
    /// How long running requests may finish after a stop signal.
    pub drain_grace: Duration,
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
            let registration = Registration::register(cfg, state.record())
                .await
                .map_err(WorkerError::Registration)?;
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

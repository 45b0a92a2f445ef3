//! The optional Prometheus endpoint of a worker.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use crate::{error::WorkerError, metrics};

/// Installs the Prometheus recorder and serves `/metrics` on `addr` until `shutdown` is
/// cancelled. Binds before returning, so a taken port fails the start; returns the bound address.
pub async fn start_metrics(
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> Result<SocketAddr, WorkerError> {
    let handle = dolphin_cluster::init_metrics();
    metrics::describe();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| WorkerError::Bind {
            what: "metrics",
            addr,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| WorkerError::Bind {
        what: "metrics",
        addr,
        source,
    })?;
    tokio::spawn(async move {
        if let Err(err) = dolphin_cluster::serve_metrics_on(listener, handle, shutdown).await {
            tracing::error!(error = %err, "metrics endpoint failed");
        }
    });
    tracing::info!(metrics_addr = %bound, "serving Prometheus metrics");
    Ok(bound)
}

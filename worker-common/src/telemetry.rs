//! The optional Prometheus endpoint of a worker.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dolphin_engine::metrics as em;
use dolphin_engine::{Engine, LoadSnapshot};
use tokio_util::sync::CancellationToken;

use crate::{error::WorkerError, metrics};

/// How often the engine's state gauges are refreshed (scrapes are seconds apart).
const ENGINE_GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// Installs the Prometheus recorder and serves `/metrics` on `addr` until `shutdown` is
/// cancelled. Binds before returning, so a taken port fails the start; returns the bound address.
pub async fn start_metrics(
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> Result<SocketAddr, WorkerError> {
    let handle = dolphin_cluster::init_metrics();
    metrics::describe();
    em::describe();
    dolphin_kv_transfer::metrics::describe();
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

/// Keeps the engine's state gauges (running, waiting, KV blocks) current until `stop` is
/// cancelled, from the same load snapshot the worker reports to the router.
pub fn spawn_engine_gauges(engine: Arc<dyn Engine>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(ENGINE_GAUGE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => set_engine_gauges(&engine.load()),
            }
        }
    });
}

fn set_engine_gauges(load: &LoadSnapshot) {
    ::metrics::gauge!(em::RUNNING_REQUESTS).set(f64::from(load.running));
    ::metrics::gauge!(em::WAITING_REQUESTS).set(f64::from(load.waiting));
    ::metrics::gauge!(em::KV_BLOCKS_FREE).set(f64::from(load.free_blocks));
    ::metrics::gauge!(em::KV_BLOCKS_USED).set(f64::from(
        load.total_blocks.saturating_sub(load.free_blocks),
    ));
}

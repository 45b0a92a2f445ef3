//! A worker process from validated flags to exit, shared by both workers: stop signals first (a
//! signal during start-up must drain, not kill), the metrics endpoint, the engine, the role's
//! own listeners and services, then registration and serving until a stop signal.

use std::future::Future;
use std::sync::Arc;

use dolphin_engine::Engine;
use tokio_util::sync::CancellationToken;

use crate::{
    CommonArgs, Lifecycle, RunningWorker, StopSignals, WorkerError, build_engine,
    run_until_stopped, telemetry,
};

/// Runs a worker until SIGTERM/SIGINT (then drains and returns `Ok`). `start` binds and serves
/// the role's services on the engine; it gets the model name the engine serves (candle: the
/// file's name unless `--model` says otherwise).
pub async fn run_worker<E, Fut>(
    common: &CommonArgs,
    start: impl FnOnce(Arc<dyn Engine>, String) -> Fut,
) -> Result<(), E>
where
    E: From<WorkerError>,
    Fut: Future<Output = Result<RunningWorker, E>>,
{
    run_worker_with(common, || build_engine(&common.engine), start).await
}

/// Like [`run_worker`], with the engine from `engine` (called once the metrics endpoint is up):
/// a decode worker serving a model group builds its own.
pub async fn run_worker_with<E, Fut>(
    common: &CommonArgs,
    engine: impl FnOnce() -> Result<Arc<dyn Engine>, WorkerError>,
    start: impl FnOnce(Arc<dyn Engine>, String) -> Fut,
) -> Result<(), E>
where
    E: From<WorkerError>,
    Fut: Future<Output = Result<RunningWorker, E>>,
{
    let signals = StopSignals::install().map_err(WorkerError::Signals)?;
    let metrics_stop = CancellationToken::new();
    let _metrics_stop = metrics_stop.clone().drop_guard();
    if let Some(addr) = common.metrics_addr {
        telemetry::start_metrics(addr, metrics_stop.clone()).await?;
    }
    let engine = engine()?;
    if common.metrics_addr.is_some() {
        telemetry::spawn_engine_gauges(Arc::clone(&engine), metrics_stop.clone());
    }
    let model = engine.info().model.clone();
    let worker = start(engine, model).await?;
    let lifecycle = Lifecycle {
        etcd: common.etcd_config(),
        drain_grace: common.drain_grace(),
    };
    run_until_stopped(worker, signals, lifecycle).await?;
    Ok(())
}

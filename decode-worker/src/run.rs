//! The decode worker process: config to a running, registered worker, until a stop signal.

use dolphin_cluster::Role;
use dolphin_kv_transfer::TransferConfig;
use dolphin_worker_common::{
    Lifecycle, StopSignals, WorkerError, build_engine, run_until_stopped, telemetry,
};
use tokio_util::sync::CancellationToken;

use crate::{
    config::DecodeConfig,
    error::DecodeError,
    node::{DecodeOptions, start},
};

/// Runs the decode worker until SIGTERM/SIGINT (then drains and exits `Ok`).
pub async fn run(cfg: DecodeConfig) -> Result<(), DecodeError> {
    cfg.validate()?;
    // Before anything slow: a signal during start-up must drain, not kill.
    let signals = StopSignals::install().map_err(WorkerError::Signals)?;
    let metrics_stop = CancellationToken::new();
    let _metrics_stop = metrics_stop.clone().drop_guard();
    if let Some(addr) = cfg.common.metrics_addr {
        telemetry::start_metrics(addr, metrics_stop).await?;
    }
    let engine = build_engine(&cfg.common.engine)?;
    // The engine names the model (candle: the file's name unless --model says otherwise).
    let model = engine.info().model.clone();
    let worker = start(
        engine,
        DecodeOptions {
            worker_id: cfg.common.worker_id(Role::Decode),
            model,
            grpc_addr: cfg.common.grpc_addr,
            kv_addr: cfg.kv_addr,
            prefill_timeout: cfg.prefill_timeout(),
            transfer: TransferConfig::default(),
        },
    )
    .await?;
    let lifecycle = Lifecycle {
        etcd: cfg.common.etcd_config(),
        drain_grace: cfg.common.drain_grace(),
    };
    run_until_stopped(worker, signals, lifecycle).await?;
    Ok(())
}

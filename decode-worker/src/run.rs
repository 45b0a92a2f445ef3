//! The decode worker process: config to a running, registered worker, until a stop signal.

use dolphin_cluster::Role;
use dolphin_kv_transfer::TransferConfig;
use dolphin_worker_common::run_worker;

use crate::{
    config::DecodeConfig,
    error::DecodeError,
    node::{DecodeOptions, start},
};

/// Runs the decode worker until SIGTERM/SIGINT (then drains and exits `Ok`).
pub async fn run(cfg: DecodeConfig) -> Result<(), DecodeError> {
    cfg.validate()?;
    run_worker(&cfg.common, |engine, model| {
        start(
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
    })
    .await
}

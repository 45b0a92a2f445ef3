//! The decode worker process: config to a running, registered worker, until a stop signal.

use dolphin_cluster::Role;
use dolphin_kv_transfer::TransferConfig;
use dolphin_worker_common::{build_engine, run_worker_with};

use crate::{
    config::DecodeConfig,
    error::DecodeError,
    node::{DecodeOptions, start},
};

/// Runs the decode worker until SIGTERM/SIGINT (then drains and exits `Ok`).
pub async fn run(cfg: DecodeConfig) -> Result<(), DecodeError> {
    cfg.validate()?;
    let advertise = cfg.common.advertise()?;
    let kv_advertise = cfg.kv_advertise()?;
    let nccl_device = cfg.common.nccl_device(cfg!(feature = "nccl"))?;
    let tls = cfg.common.load_tls()?;
    let group = cfg.group();
    let engine = || match &group {
        Some(g) => crate::group::build_group(&cfg.common.engine, g),
        None => build_engine(&cfg.common.engine),
    };
    run_worker_with(&cfg.common, engine, |engine, model| {
        start(
            engine,
            DecodeOptions {
                worker_id: cfg.common.worker_id(Role::Decode),
                model,
                grpc_addr: cfg.common.grpc_addr,
                advertise,
                kv_addr: cfg.kv_addr,
                kv_advertise,
                prefill_timeout: cfg.prefill_timeout(),
                transfer: TransferConfig::default(),
                nccl_device,
                tls: tls.clone(),
            },
        )
    })
    .await
}

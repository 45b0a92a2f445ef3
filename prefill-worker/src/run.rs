//! The prefill worker process: config to a running, registered worker, until a stop signal.

use dolphin_cluster::Role;
use dolphin_kv_transfer::TransferConfig;
use dolphin_worker_common::{WorkerError, run_worker};

use crate::{
    config::PrefillConfig,
    node::{PrefillOptions, start},
};

/// Runs the prefill worker until SIGTERM/SIGINT (then drains and exits `Ok`).
pub async fn run(cfg: PrefillConfig) -> Result<(), WorkerError> {
    cfg.validate()?;
    let advertise = cfg.common.advertise()?;
    let nccl_device = cfg.common.nccl_device(cfg!(feature = "nccl"))?;
    let tls = cfg.common.load_tls()?;
    run_worker(&cfg.common, |engine, model| {
        start(
            engine,
            PrefillOptions {
                worker_id: cfg.common.worker_id(Role::Prefill),
                model,
                grpc_addr: cfg.common.grpc_addr,
                advertise,
                transfer: TransferConfig::default(),
                nccl_device,
                tls,
            },
        )
    })
    .await
}

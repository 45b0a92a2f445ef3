//! The live side: a local cluster started with `dolphinctl up` (the operator's launcher) on the
//! sim engine or the real model on candle, configured from the same numbers as the simulated
//! cluster, and stopped again.

use std::path::Path;
use std::time::Duration;

use dolphin_bench::BenchError;
use dolphin_bench::proc_stat::CpuClock;
use dolphin_bench::process::{ChildProcess, sibling_binary, spawn_ready};
use dolphin_router::dolphin::Split;
use dolphinctl::cli::Engine;

/// How long `dolphinctl up` may take to report the whole cluster ready.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// What every worker and the router are started with; the simulator is configured from the
/// same values.
#[derive(Clone, Debug)]
pub struct LiveSetup {
    /// Prefill and decode workers.
    pub split: Split,
    /// The workers' engine.
    pub engine: Engine,
    /// Candle: compute threads per worker.
    pub threads: u32,
    /// Candle: KV memory per worker (`--kv-bytes`).
    pub kv_bytes: String,
    /// Sim: shipped profile name or profile JSON path.
    pub profile: String,
    /// `--sim-time-scale`.
    pub time_scale: f64,
    /// `--sim-byte-scale`.
    pub byte_scale: f64,
    /// `--block-size` (workers and router).
    pub block_size: u32,
    /// Sim: `--total-blocks` (candle sizes its pool by `kv_bytes`).
    pub total_blocks: u32,
    /// `--max-batched-tokens`.
    pub max_batched_tokens: u32,
    /// `--policy`.
    pub policy: &'static str,
    /// `--overlap-weight` of the router.
    pub overlap_weight: f64,
}

/// A running cluster; dropping it kills `dolphinctl up`, whose children die with it.
#[derive(Debug)]
pub struct LiveCluster {
    up: ChildProcess,
    /// The router's gRPC address.
    pub grpc_addr: String,
    /// (name, pid) of every process of the cluster, router first.
    pub members: Vec<(String, u32)>,
}

impl LiveCluster {
    /// Starts `dolphinctl up` for `setup` with logs in `log_dir` and waits until the router
    /// sees every worker. Call from the main thread (see `process::spawn_ready`).
    pub async fn start(setup: &LiveSetup, log_dir: &Path) -> Result<Self, BenchError> {
        let ctl = sibling_binary("dolphinctl")?;
        let bin_dir = ctl
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| ".".into());
        let mut args = vec![
            "up".to_string(),
            format!("--prefill={}", setup.split.prefill),
            format!("--decode={}", setup.split.decode),
            "--http-addr=127.0.0.1:0".into(),
            "--grpc-addr=127.0.0.1:0".into(),
            "--admin-addr=127.0.0.1:0".into(),
            "--metrics-addr=127.0.0.1:0".into(),
            format!("--policy={}", setup.policy),
            format!("--bin-dir={}", bin_dir.display()),
            format!("--log-dir={}", log_dir.display()),
            "--grace-secs=5".into(),
        ];
        match setup.engine {
            Engine::Sim => {
                args.extend([
                    "--engine=sim".into(),
                    format!("--sim-profile={}", setup.profile),
                    format!("--sim-time-scale={}", setup.time_scale),
                ]);
                args.extend(
                    [
                        format!("--sim-byte-scale={}", setup.byte_scale),
                        format!("--total-blocks={}", setup.total_blocks),
                    ]
                    .map(|f| format!("--worker-arg={f}")),
                );
            }
            Engine::Candle => args.extend([
                "--engine=candle".into(),
                format!("--threads={}", setup.threads),
                format!("--kv-bytes={}", setup.kv_bytes),
                // Loading the model and warming up take longer than a sim worker's start.
                "--ready-timeout-secs=300".into(),
            ]),
        }
        for flag in [
            format!("--block-size={}", setup.block_size),
            format!("--max-batched-tokens={}", setup.max_batched_tokens),
            // More than a replay ever queues: the simulator bounds no queue.
            "--max-waiting=100000".into(),
        ] {
            args.push(format!("--worker-arg={flag}"));
        }
        for flag in [
            format!("--block-size={}", setup.block_size),
            format!("--overlap-weight={}", setup.overlap_weight),
        ] {
            args.push(format!("--router-arg={flag}"));
        }
        let up = spawn_ready("dolphinctl-up", &ctl, &args, &[], log_dir, READY_TIMEOUT).await?;
        let grpc_addr = up.grpc_addr()?.to_string();
        let members = up
            .ready()
            .other
            .get("processes")
            .and_then(|p| p.as_array())
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| Some((p["name"].as_str()?.to_string(), p["pid"].as_u64()?)))
                    .map(|(name, pid)| (name, pid as u32))
                    .collect()
            })
            .unwrap_or_default();
        Ok(LiveCluster {
            up,
            grpc_addr,
            members,
        })
    }

    /// CPU time each member has used so far, seconds (None where `/proc` could not be read).
    pub fn cpu_seconds(&self) -> Vec<(String, Option<f64>)> {
        self.members
            .iter()
            .map(|(name, pid)| {
                let t = CpuClock::new(*pid).cpu_time().ok();
                (name.clone(), t.map(|d| d.as_secs_f64()))
            })
            .collect()
    }

    /// Stops the cluster: SIGTERM to `dolphinctl up`, which stops the router then the workers;
    /// SIGKILL after a grace period (the drop).
    pub async fn stop(self) {
        if !self.up.stop(Duration::from_secs(20)).await {
            eprintln!("sim_crosscheck: dolphinctl up did not stop in time; killed");
        }
    }
}

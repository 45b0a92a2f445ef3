//! The processes of the router-overhead benchmark: one decode and one prefill worker on the
//! zero-delay sim engine, and a router in front of them with static discovery and the
//! always-local policy. Dropping the [`OverheadCluster`] kills all three.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dolphin_proto::v1::{self, router_admin_client::RouterAdminClient};

use crate::BenchError;
use crate::process::{
    ChildProcess, router_listener_args, sibling_binary, spawn_ready, strings, wrapped,
};

/// How long a process may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start the router.
#[derive(Clone, Debug, Default)]
pub struct RouterLaunch {
    /// Serving threads of the router (`DOLPHIN_WORKER_THREADS`); `None`: one per core.
    pub worker_threads: Option<usize>,
    /// A command (program and arguments) to run the router under, e.g. a profiler.
    pub wrapper: Vec<String>,
    /// The router binary (`None`: `dolphin-router` beside this one), e.g. the PGO build of
    /// `scripts/pgo-router.sh`.
    pub bin: Option<PathBuf>,
}

/// The three running processes.
#[derive(Debug)]
pub struct OverheadCluster {
    /// The router.
    pub router: ChildProcess,
    /// The decode worker.
    pub decode: ChildProcess,
    /// The prefill worker (idle under always-local; there so the router sees a full cluster).
    pub prefill: ChildProcess,
}

/// Starts the workers, then the router pointed at them; logs go to `log_dir`. Call from the
/// thread that lives longest (the main thread): the children's PDEATHSIG follows the thread
/// that started them.
pub async fn start(
    log_dir: &Path,
    model: &str,
    launch: &RouterLaunch,
) -> Result<OverheadCluster, BenchError> {
    let worker = |extra: &[&str]| {
        let mut a = strings(&["--grpc-addr", "127.0.0.1:0", "--engine", "sim"]);
        a.extend(strings(&["--sim-time-scale", "0", "--model", model]));
        a.extend(strings(extra));
        a
    };
    let decode_bin = sibling_binary("dolphin-decode-worker")?;
    let decode_args = worker(&["--kv-addr", "127.0.0.1:0"]);
    let decode = spawn_ready(
        "decode",
        &decode_bin,
        &decode_args,
        &[],
        log_dir,
        READY_TIMEOUT,
    )
    .await?;
    let prefill_bin = sibling_binary("dolphin-prefill-worker")?;
    let prefill = spawn_ready(
        "prefill",
        &prefill_bin,
        &worker(&[]),
        &[],
        log_dir,
        READY_TIMEOUT,
    )
    .await?;
    let router = start_router(
        log_dir,
        "router",
        model,
        (decode.grpc_addr()?, prefill.grpc_addr()?),
        "always-local",
        launch,
    )
    .await?;
    Ok(OverheadCluster {
        router,
        decode,
        prefill,
    })
}

/// Starts a router (named `name` in the logs) over one decode and one prefill worker (`workers`:
/// their gRPC addresses) with static discovery and `policy` (`always-local`, `always-remote`).
pub async fn start_router(
    log_dir: &Path,
    name: &str,
    model: &str,
    workers: (&str, &str),
    policy: &str,
    launch: &RouterLaunch,
) -> Result<ChildProcess, BenchError> {
    let mut router_args = router_listener_args();
    router_args.extend(strings(&["--decode", workers.0, "--prefill", workers.1]));
    router_args.extend(strings(&["--policy", policy, "--model", model]));
    let env: Vec<(String, String)> = launch
        .worker_threads
        .map(|n| ("DOLPHIN_WORKER_THREADS".to_string(), n.to_string()))
        .into_iter()
        .collect();
    let router_bin = match &launch.bin {
        Some(bin) => bin.clone(),
        None => sibling_binary("dolphin-router")?,
    };
    let (program, router_args) = wrapped(&launch.wrapper, router_bin, router_args);
    spawn_ready(name, &program, &router_args, &env, log_dir, READY_TIMEOUT).await
}

impl OverheadCluster {
    /// Waits until the router lists both workers with their event streams up.
    pub async fn wait_for_workers(&self) -> Result<(), BenchError> {
        wait_for_workers(self.router.admin_addr()?, 2).await
    }

    /// Stops the router with SIGTERM (so a profiler wrapping it can write its output; SIGKILL
    /// after `grace`), then kills the workers. Returns whether the router exited on its own.
    pub async fn stop(self, grace: Duration) -> bool {
        let OverheadCluster {
            router,
            decode,
            prefill,
        } = self;
        let clean = router.stop(grace).await;
        drop((decode, prefill));
        clean
    }
}

/// Waits (up to 30 s) until the router whose admin listener is `admin_addr` lists `expected`
/// workers, each with
/// its event stream up: from then on it routes with their cache and load.
pub async fn wait_for_workers(admin_addr: &str, expected: usize) -> Result<(), BenchError> {
    let setup = |e: &dyn std::fmt::Display| BenchError::Setup(format!("router admin: {e}"));
    let mut admin = RouterAdminClient::connect(format!("http://{admin_addr}"))
        .await
        .map_err(|e| setup(&e))?;
    for _ in 0..300 {
        let workers = admin
            .list_workers(v1::ListWorkersRequest {})
            .await
            .map_err(|e| setup(&e))?
            .into_inner()
            .workers;
        if workers.len() == expected && workers.iter().all(|w| w.events_live) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(BenchError::Setup(format!(
        "the router did not pick up {expected} workers within 30 s"
    )))
}

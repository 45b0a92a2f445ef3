//! `dolphinctl drain`: tell one worker to stop taking requests (`Worker.Drain`) and wait until
//! the ones it runs have finished. A Kubernetes preStop hook runs it, so a pod leaves the
//! cluster only once it is idle; the worker's own SIGTERM handling then has nothing to cut.

use std::time::Duration;

use clap::Args;
use dolphin_proto::v1::{DrainRequest, worker_client::WorkerClient};

use crate::client;
use crate::error::CtlError;

/// How often the worker is asked how many requests still run.
const POLL: Duration = Duration::from_millis(500);

/// `dolphinctl drain`.
#[derive(Clone, Debug, Args)]
pub struct DrainArgs {
    /// The worker's gRPC address (`host:port`, e.g. 127.0.0.1:7000 from inside its pod).
    #[arg(long)]
    pub worker: String,
    /// How long to wait for running requests to finish, in seconds (0: ask and return).
    #[arg(long, default_value_t = 30)]
    pub wait_secs: u64,
}

/// Drains the worker; `Ok` once no request runs there (or at once with `--wait-secs 0`).
pub async fn drain(args: &DrainArgs) -> Result<(), CtlError> {
    let mut worker = WorkerClient::new(client::channel(&args.worker).await?);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait_secs);
    let mut first = true;
    loop {
        // Drain is idempotent: asking again reports how many requests still run.
        let running = worker
            .drain(DrainRequest {})
            .await
            .map_err(|status| CtlError::rpc("Worker.Drain", status))?
            .into_inner()
            .running;
        if first {
            eprintln!(
                "dolphinctl: {} is draining; {running} request(s) running",
                args.worker
            );
            first = false;
        }
        if running == 0 {
            eprintln!("dolphinctl: {} is drained", args.worker);
            return Ok(());
        }
        if args.wait_secs == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CtlError::DrainTimeout {
                worker: args.worker.clone(),
                running,
                waited: Duration::from_secs(args.wait_secs),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

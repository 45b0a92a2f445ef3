//! The processes of the real-model cluster benchmark: one prefill and one decode worker on the
//! candle engine, and a router in front of them with static discovery and the model file's own
//! tokenizer. Requests force their path (local or remote), so the routing policy does not
//! matter. Dropping the [`CandleCluster`] kills all three.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::BenchError;
use crate::overhead_cluster::wait_for_workers;
use crate::process::{ChildProcess, router_listener_args, sibling_binary, spawn_ready, strings};

/// How long a worker may take to load the model and print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// How to start the workers.
#[derive(Clone, Debug)]
pub struct CandleLaunch {
    /// The GGUF model file.
    pub model_path: PathBuf,
    /// The served model name, given to every process.
    pub model: String,
    /// Compute threads per worker (`--threads`).
    pub threads: usize,
    /// Weight format (`--weights`: keep, q8_0, q4k, f32).
    pub weights: String,
    /// KV memory per worker (`--kv-bytes`, e.g. "256MiB").
    pub kv_bytes: String,
    /// Tokens per engine step (`--max-batched-tokens`); `None`: the candle engine's default.
    pub max_batched_tokens: Option<u32>,
}

/// The three running processes.
#[derive(Debug)]
pub struct CandleCluster {
    /// The router.
    pub router: ChildProcess,
    /// The decode worker.
    pub decode: ChildProcess,
    /// The prefill worker.
    pub prefill: ChildProcess,
}

impl CandleLaunch {
    /// Flags shared by both workers.
    fn worker_args(&self) -> Vec<String> {
        let path = self.model_path.display().to_string();
        let mut a = strings(&["--grpc-addr", "127.0.0.1:0", "--engine", "candle"]);
        a.extend(strings(&["--model-path", &path, "--model", &self.model]));
        a.extend(strings(&["--threads", &self.threads.to_string()]));
        a.extend(strings(&[
            "--weights",
            &self.weights,
            "--kv-bytes",
            &self.kv_bytes,
        ]));
        if let Some(n) = self.max_batched_tokens {
            a.extend(strings(&["--max-batched-tokens", &n.to_string()]));
        }
        a
    }
}

/// Starts the workers one after the other (each loads the model: two at once would share the
/// cores), then the router pointed at them; logs go to `log_dir`. Call from the thread that
/// lives longest (the main thread): the children's PDEATHSIG follows the thread that started
/// them.
pub async fn start(log_dir: &Path, launch: &CandleLaunch) -> Result<CandleCluster, BenchError> {
    let mut decode_args = launch.worker_args();
    // A remote prefill must not fall back to local because the prefill worker is busy.
    decode_args.extend(strings(&["--kv-addr", "127.0.0.1:0"]));
    decode_args.extend(strings(&["--prefill-timeout-ms", "600000"]));
    let decode = spawn_ready(
        "decode",
        &sibling_binary("dolphin-decode-worker")?,
        &decode_args,
        &[],
        log_dir,
        READY_TIMEOUT,
    )
    .await?;
    let prefill = spawn_ready(
        "prefill",
        &sibling_binary("dolphin-prefill-worker")?,
        &launch.worker_args(),
        &[],
        log_dir,
        READY_TIMEOUT,
    )
    .await?;
    let path = launch.model_path.display().to_string();
    let mut router_args = router_listener_args();
    router_args.extend(strings(&["--decode", decode.grpc_addr()?]));
    router_args.extend(strings(&["--prefill", prefill.grpc_addr()?]));
    router_args.extend(strings(&[
        "--policy",
        "always-local",
        "--model",
        &launch.model,
    ]));
    router_args.extend(strings(&["--tokenizer", "gguf", "--model-path", &path]));
    let router = spawn_ready(
        "router",
        &sibling_binary("dolphin-router")?,
        &router_args,
        &[],
        log_dir,
        READY_TIMEOUT,
    )
    .await?;
    Ok(CandleCluster {
        router,
        decode,
        prefill,
    })
}

impl CandleCluster {
    /// The router's gRPC address.
    pub fn grpc_addr(&self) -> Result<&str, BenchError> {
        self.router.grpc_addr()
    }

    /// Waits until the router lists both workers with their event streams up.
    pub async fn wait_for_workers(&self) -> Result<(), BenchError> {
        wait_for_workers(self.router.admin_addr()?, 2).await
    }

    /// Stops the router, then the workers, gently (SIGTERM; SIGKILL after `grace`).
    pub async fn stop(self, grace: Duration) {
        let CandleCluster {
            router,
            decode,
            prefill,
        } = self;
        router.stop(grace).await;
        decode.stop(grace).await;
        prefill.stop(grace).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_flags_follow_the_contract() {
        let launch = CandleLaunch {
            model_path: PathBuf::from("/m/SmolLM2.gguf"),
            model: "smol".into(),
            threads: 1,
            weights: "q8_0".into(),
            kv_bytes: "256MiB".into(),
            max_batched_tokens: Some(512),
        };
        let args = launch.worker_args().join(" ");
        assert_eq!(
            args,
            "--grpc-addr 127.0.0.1:0 --engine candle --model-path /m/SmolLM2.gguf --model smol \
             --threads 1 --weights q8_0 --kv-bytes 256MiB --max-batched-tokens 512"
        );
        let default_step = CandleLaunch {
            max_batched_tokens: None,
            ..launch
        };
        assert!(
            !default_step
                .worker_args()
                .contains(&"--max-batched-tokens".into())
        );
    }
}

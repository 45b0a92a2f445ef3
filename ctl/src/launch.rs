//! The command lines dolphinctl gives the processes of a local cluster (the flags are part of
//! the contract in `docs/dev/contracts.md`).

use crate::cli::{Engine, Policy, UpArgs};

/// The router binary's file name.
pub const ROUTER_BIN: &str = "dolphin-router";
/// The prefill worker binary's file name.
pub const PREFILL_BIN: &str = "dolphin-prefill-worker";
/// The decode worker binary's file name.
pub const DECODE_BIN: &str = "dolphin-decode-worker";
/// The model name the workers serve by default.
pub const DEFAULT_MODEL: &str = "sim-model";

/// The two kinds of worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerKind {
    /// Computes prompts' KV and ships it.
    Prefill,
    /// Decodes, prefilling locally or receiving KV.
    Decode,
}

impl WorkerKind {
    /// "prefill" / "decode".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }

    /// The binary's file name.
    pub fn binary(self) -> &'static str {
        match self {
            Self::Prefill => PREFILL_BIN,
            Self::Decode => DECODE_BIN,
        }
    }
}

/// Arguments of one worker.
pub fn worker_args(args: &UpArgs, kind: WorkerKind) -> Vec<String> {
    let mut a = vec!["--grpc-addr".to_owned(), "127.0.0.1:0".to_owned()];
    if kind == WorkerKind::Decode {
        a.extend(["--kv-addr".to_owned(), "127.0.0.1:0".to_owned()]);
    }
    match args.engine {
        Engine::Sim => {
            a.extend(["--engine".to_owned(), "sim".to_owned()]);
            a.extend(["--sim-profile".to_owned(), args.sim_profile.clone()]);
            if let Some(scale) = args.sim_time_scale {
                a.extend(["--sim-time-scale".to_owned(), scale.to_string()]);
            }
        }
        Engine::Candle => {
            a.extend(["--engine".to_owned(), "candle".to_owned()]);
            if let Some(path) = &args.model_path {
                a.extend(["--model-path".to_owned(), path.display().to_string()]);
            }
            if let Some(weights) = &args.weights {
                a.extend(["--weights".to_owned(), weights.clone()]);
            }
            if let Some(threads) = args.threads {
                a.extend(["--threads".to_owned(), threads.to_string()]);
            }
            if let Some(kv) = &args.kv_bytes {
                a.extend(["--kv-bytes".to_owned(), kv.clone()]);
            }
        }
    }
    if let Some(model) = &args.model {
        a.extend(["--model".to_owned(), model.clone()]);
    }
    if let Some(etcd) = &args.etcd {
        a.extend(["--etcd".to_owned(), etcd.clone()]);
        if let Some(cluster) = &args.cluster {
            a.extend(["--cluster".to_owned(), cluster.clone()]);
        }
        if let Some(ttl) = args.lease_ttl_secs {
            a.extend(["--lease-ttl-secs".to_owned(), ttl.to_string()]);
        }
    }
    a.extend(args.worker_arg.iter().cloned());
    a
}

/// Arguments of the router, given the workers' gRPC addresses (used without etcd).
pub fn router_args(args: &UpArgs, prefill: &[String], decode: &[String]) -> Vec<String> {
    let mut a = vec![
        "--http-addr".to_owned(),
        args.http_addr.to_string(),
        "--grpc-addr".to_owned(),
        args.grpc_addr.to_string(),
        "--admin-addr".to_owned(),
        args.admin_addr.to_string(),
        "--metrics-addr".to_owned(),
        args.metrics_addr.to_string(),
    ];
    if let Some(policy) = args.policy {
        let name = match policy {
            Policy::AlwaysLocal => "always-local",
            Policy::AlwaysRemote => "always-remote",
            Policy::Threshold => "threshold",
            Policy::Dolphin => "dolphin",
        };
        a.extend(["--policy".to_owned(), name.to_owned()]);
    }
    if args.engine == Engine::Candle {
        // The workers' model file gives the router its tokenizer (and the served name).
        a.extend(["--tokenizer".to_owned(), "gguf".to_owned()]);
        if let Some(path) = &args.model_path {
            a.extend(["--model-path".to_owned(), path.display().to_string()]);
        }
    }
    if let Some(model) = &args.model {
        a.extend(["--model".to_owned(), model.clone()]);
    }
    match &args.etcd {
        Some(etcd) => {
            a.extend(["--etcd".to_owned(), etcd.clone()]);
            if let Some(cluster) = &args.cluster {
                a.extend(["--cluster".to_owned(), cluster.clone()]);
            }
        }
        None => {
            for addr in prefill {
                a.extend(["--prefill".to_owned(), addr.clone()]);
            }
            for addr in decode {
                a.extend(["--decode".to_owned(), addr.clone()]);
            }
        }
    }
    a.extend(args.router_arg.iter().cloned());
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::up_args;

    #[test]
    fn static_router_gets_every_worker() {
        let args = up_args(&["--policy", "threshold", "--decode", "2"]);
        let a = router_args(&args, &["p:1".into()], &["d:1".into(), "d:2".into()]);
        let joined = a.join(" ");
        assert!(joined.starts_with("--http-addr 127.0.0.1:8000 --grpc-addr 127.0.0.1:50051"));
        assert!(joined.contains("--policy threshold"));
        assert!(joined.contains("--prefill p:1 --decode d:1 --decode d:2"));
        assert!(!joined.contains("--etcd"));
    }

    #[test]
    fn etcd_router_gets_no_addresses() {
        let args = up_args(&["--etcd", "http://127.0.0.1:2379", "--cluster", "c1"]);
        let joined = router_args(&args, &["p:1".into()], &["d:1".into()]).join(" ");
        assert!(joined.contains("--etcd http://127.0.0.1:2379 --cluster c1"));
        assert!(!joined.contains("--prefill") && !joined.contains("--decode"));
    }

    #[test]
    fn workers_bind_port_zero_and_get_sim_and_etcd_flags() {
        let args = up_args(&[
            "--etcd",
            "http://e:1",
            "--lease-ttl-secs",
            "3",
            "--sim-time-scale",
            "0.05",
            "--model",
            "m",
            "--worker-arg=--total-blocks=64",
        ]);
        let decode = worker_args(&args, WorkerKind::Decode).join(" ");
        assert!(decode.starts_with("--grpc-addr 127.0.0.1:0 --kv-addr 127.0.0.1:0"));
        assert!(decode.contains("--engine sim --sim-profile dynamo-mocker --sim-time-scale 0.05"));
        assert!(decode.contains("--model m --etcd http://e:1 --lease-ttl-secs 3"));
        assert!(decode.ends_with("--total-blocks=64"));
        let prefill = worker_args(&args, WorkerKind::Prefill).join(" ");
        assert!(!prefill.contains("--kv-addr"));
    }

    #[test]
    fn candle_workers_and_router_share_the_model_file() {
        let args = up_args(&[
            "--engine",
            "candle",
            "--model-path",
            "/m/x.gguf",
            "--threads",
            "1",
            "--weights",
            "keep",
            "--kv-bytes",
            "64MiB",
        ]);
        let worker = worker_args(&args, WorkerKind::Decode).join(" ");
        assert!(
            worker.contains(
                "--engine candle --model-path /m/x.gguf --weights keep --threads 1 --kv-bytes 64MiB"
            ),
            "{worker}"
        );
        assert!(!worker.contains("--sim-profile"));
        let router = router_args(&args, &[], &["d:1".into()]).join(" ");
        assert!(
            router.contains("--tokenizer gguf --model-path /m/x.gguf"),
            "{router}"
        );
    }
}

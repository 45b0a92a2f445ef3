//! dolphinctl's command line, parsed once by clap.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Default gRPC URL of the router (its `--grpc-addr` default).
pub const DEFAULT_ROUTER_GRPC: &str = "http://127.0.0.1:50051";
/// Default URL of the router's admin listener (its `--admin-addr` default).
pub const DEFAULT_ROUTER_ADMIN: &str = "http://127.0.0.1:50052";

/// Dolphin operator CLI.
#[derive(Debug, Parser)]
#[command(name = "dolphinctl", version, about = "Dolphin operator CLI")]
pub struct Cli {
    /// TLS of dolphinctl's own connections (to the router and workers), given before the
    /// subcommand: `--tls-ca` verifies a router that serves TLS, `--tls-cert/--tls-key` are
    /// needed to reach workers, which require a member certificate. (`up` passes nothing to the
    /// processes it starts: give them theirs with `--router-arg` and `--worker-arg`.)
    #[command(flatten)]
    pub tls: dolphin_tls::TlsArgs,
    /// API key for the router's public API (sent as `authorization: Bearer KEY`).
    #[arg(long, env = "DOLPHIN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Admin key for the router's admin listener (`workers`, `tables`, `classifier`, `learn`).
    #[arg(long, env = "DOLPHIN_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a local cluster (workers, then the router) and keep it up until Ctrl-C.
    Up(Box<UpArgs>),
    /// List the workers the router knows, with their load and cache state.
    Workers(WorkersArgs),
    /// Drain one worker (stop admitting, wait for running requests): a preStop hook's job.
    Drain(crate::drain::DrainArgs),
    /// Send one streamed Generate request and print the text as it arrives.
    Request(RequestArgs),
    /// DolphinRouting tables: list, show, diff, put, activate, rollback, fit.
    Tables(crate::tables::TablesArgs),
    /// The output-length classifier: train from a request log, show.
    Classifier(crate::classifier::ClassifierArgs),
    /// Replay a workload (trace or synthetic) on the live router or the simulator and report
    /// latency percentiles and SLO attainment.
    Replay(Box<crate::replay::ReplayArgs>),
    /// Learn the routing table of a split by measurement (fit clusters, scan, refine) on the
    /// simulator or the live router.
    Learn(Box<crate::learn::LearnArgs>),
    /// Timing profiles from measurement: `fit` times an engine step by step and writes the
    /// profile the sim engine and the simulator load.
    Profile(crate::profile::ProfileArgs),
    /// Model groups' token-level handoffs: plan delayed batching, calibrate the confidence gate.
    Handoff(crate::handoff::HandoffArgs),
}

/// Routing policies the router accepts for `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Every request prefills on its decode worker.
    AlwaysLocal,
    /// Every request prefills on a prefill worker.
    AlwaysRemote,
    /// Dynamo's fixed rule on the effective prompt length.
    Threshold,
    /// DolphinRouting's learned table for the live split.
    Dolphin,
}

/// Engines the workers can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// The simulated engine (timing profile, deterministic tokens).
    Sim,
    /// A real GGUF model on candle (SmolLM2 by default; `--model-path` for another); the
    /// router then tokenizes with the model's own tokenizer.
    Candle,
}

/// `dolphinctl up`.
#[derive(Clone, Debug, Args)]
pub struct UpArgs {
    /// Number of prefill workers (0: every request prefills locally).
    #[arg(long, default_value_t = 1)]
    pub prefill: u32,
    /// Number of decode workers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub decode: u32,
    /// etcd endpoint; everyone registers and watches there. Absent: static discovery (the
    /// router is given the workers' addresses).
    #[arg(long, env = "DOLPHIN_ETCD")]
    pub etcd: Option<String>,
    /// etcd cluster name (with --etcd).
    #[arg(long, requires = "etcd")]
    pub cluster: Option<String>,
    /// Worker lease TTL in seconds (with --etcd).
    #[arg(long, requires = "etcd")]
    pub lease_ttl_secs: Option<u32>,
    /// Router's OpenAI-compatible HTTP listener (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub http_addr: SocketAddr,
    /// Router's gRPC listener (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub grpc_addr: SocketAddr,
    /// Router's admin gRPC listener, `RouterAdmin` (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:50052")]
    pub admin_addr: SocketAddr,
    /// Router's `/metrics` and `/health` listener (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub metrics_addr: SocketAddr,
    /// Routing policy (default: the router's).
    #[arg(long, value_enum)]
    pub policy: Option<Policy>,
    /// Engine of every worker.
    #[arg(long, value_enum, default_value_t = Engine::Sim)]
    pub engine: Engine,
    /// Sim timing profile: a shipped profile's name or a JSON file.
    #[arg(long, default_value = "dynamo-mocker")]
    pub sim_profile: String,
    /// Sim time scale (1.0: the profile's timing; 0: no delay). Default: the workers'.
    #[arg(long)]
    pub sim_time_scale: Option<f64>,
    /// Model name served (default: the workers' and router's).
    #[arg(long)]
    pub model: Option<String>,
    /// Candle: the GGUF model file (default: SmolLM2 where `scripts/fetch-model.sh` puts it).
    #[arg(long, env = "DOLPHIN_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Candle: weight format of every worker (auto, q8_0, keep, q4k, f32). Default: the
    /// workers' (auto).
    #[arg(long)]
    pub weights: Option<String>,
    /// Candle: compute threads per worker. Default: the workers' (`DOLPHIN_THREADS`, else one
    /// per physical core).
    #[arg(long)]
    pub threads: Option<u32>,
    /// Candle: KV memory per worker (e.g. 256MiB). Default: the workers'.
    #[arg(long)]
    pub kv_bytes: Option<String>,
    /// Directory holding dolphin-router and the workers (default: beside dolphinctl).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Directory for the processes' logs (default: a fresh one under the temp dir).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// How long to wait for each process to be ready, in seconds.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_secs: u64,
    /// How long each process gets to drain after SIGTERM before SIGKILL, in seconds.
    #[arg(long, default_value_t = 10)]
    pub grace_secs: u64,
    /// Extra argument for every worker (repeatable), e.g. `--worker-arg=--total-blocks=4096`.
    #[arg(long, allow_hyphen_values = true)]
    pub worker_arg: Vec<String>,
    /// Extra argument for the router (repeatable), e.g. `--router-arg=--max-prompt-tokens=8192`.
    #[arg(long, allow_hyphen_values = true)]
    pub router_arg: Vec<String>,
}

/// `dolphinctl workers`.
#[derive(Clone, Debug, Args)]
pub struct WorkersArgs {
    /// URL of the router's admin listener.
    #[arg(long, env = "DOLPHIN_ROUTER_ADMIN", default_value = DEFAULT_ROUTER_ADMIN)]
    pub router_admin: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Which prefill path to force for `dolphinctl request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The decode worker prefills.
    Local,
    /// A prefill worker prefills and ships the KV.
    Remote,
}

/// `dolphinctl request`.
#[derive(Clone, Debug, Args)]
pub struct RequestArgs {
    /// Prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Router gRPC URL.
    #[arg(long, env = "DOLPHIN_ROUTER_GRPC", default_value = DEFAULT_ROUTER_GRPC)]
    pub router_grpc: String,
    /// Force a prefill path (default: the router's policy decides).
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Model name (default: the router's).
    #[arg(long)]
    pub model: Option<String>,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep generating past end-of-sequence.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print each token's log probability after the text, with this many alternatives (0-20).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub logprobs: Option<u32>,
}

/// `dolphinctl up EXTRA...` parsed, for tests.
#[cfg(test)]
pub(crate) fn up_args(extra: &[&str]) -> UpArgs {
    let argv = ["dolphinctl", "up"].iter().chain(extra).copied();
    match Cli::try_parse_from(argv).expect("parses").command {
        Command::Up(up) => *up,
        other => panic!("unexpected {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn up_defaults() {
        let cli = Cli::try_parse_from(["dolphinctl", "up"]).unwrap();
        let Command::Up(up) = cli.command else {
            panic!("not up")
        };
        assert_eq!((up.prefill, up.decode), (1, 1));
        assert_eq!(up.http_addr.to_string(), "127.0.0.1:8000");
        assert_eq!(up.grpc_addr.to_string(), "127.0.0.1:50051");
        assert_eq!(up.engine, Engine::Sim);
        assert_eq!(up.sim_profile, "dynamo-mocker");
        assert!(up.etcd.is_none() && up.policy.is_none());
    }

    #[test]
    fn up_passes_hyphenated_extra_args() {
        let cli = Cli::try_parse_from([
            "dolphinctl",
            "up",
            "--decode",
            "2",
            "--policy",
            "always-remote",
            "--worker-arg",
            "--total-blocks=64",
            "--router-arg=--max-prompt-tokens=10",
        ])
        .unwrap();
        let Command::Up(up) = cli.command else {
            panic!("not up")
        };
        assert_eq!(up.decode, 2);
        assert_eq!(up.policy, Some(Policy::AlwaysRemote));
        assert_eq!(up.worker_arg, ["--total-blocks=64"]);
        assert_eq!(up.router_arg, ["--max-prompt-tokens=10"]);
    }

    #[test]
    fn zero_decode_workers_is_rejected() {
        assert!(Cli::try_parse_from(["dolphinctl", "up", "--decode", "0"]).is_err());
    }

    #[test]
    fn lease_ttl_needs_etcd() {
        assert!(Cli::try_parse_from(["dolphinctl", "up", "--lease-ttl-secs", "3"]).is_err());
    }

    #[test]
    fn request_mode() {
        let cli = Cli::try_parse_from([
            "dolphinctl",
            "request",
            "--prompt",
            "hi",
            "--mode",
            "remote",
        ])
        .unwrap();
        let Command::Request(req) = cli.command else {
            panic!("not request")
        };
        assert_eq!(req.mode, Some(Mode::Remote));
        assert_eq!(req.max_tokens, 64);
    }
}

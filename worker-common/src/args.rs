//! Flags both worker binaries take (flattened into each binary's config). The names are part of
//! the contract (`docs/dev/contracts.md`): tests and dolphinctl pass them.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};
use dolphin_cluster::{Advertise, EtcdConfig, Role, WorkerId, advertised};
use dolphin_engine::candle::{DEFAULT_KV_BYTES, DeviceKind, MatmulKernel, Padding, WeightFormat};

use crate::error::ConfigError;

/// Which engine implementation serves requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    /// Simulated engine: timing from a profile, deterministic tokens, real KV bytes.
    Sim,
    /// A real llama-architecture GGUF model (SmolLM2 by default) on candle.
    Candle,
}

/// How KV blocks move from prefill to decode workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvTransportKind {
    /// TCP, everywhere.
    Tcp,
    /// NCCL between GPUs (a build with the `nccl` feature, libcuda and libnccl at run time, and
    /// this flag on both workers of a pair); a peer without it is still served over TCP.
    Nccl,
}

/// The error for `--kv-transport nccl` in a build without NCCL.
pub fn nccl_not_built() -> ConfigError {
    ConfigError::invalid(
        "kv-transport",
        "nccl needs a build with the `nccl` feature (cargo build --features nccl)",
    )
}

/// Engine flags.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Engine implementation.
    #[arg(long, env = "DOLPHIN_ENGINE", value_enum, default_value_t = EngineKind::Sim)]
    pub engine: EngineKind,
    /// Name of a shipped sim profile, or a path to a profile JSON file.
    #[arg(long, env = "DOLPHIN_SIM_PROFILE", default_value = "dynamo-mocker")]
    pub sim_profile: String,
    /// Multiplies the profile's step times (0: no delay at all).
    #[arg(long, env = "DOLPHIN_SIM_TIME_SCALE", default_value_t = 1.0)]
    pub sim_time_scale: f64,
    /// Multiplies the profile's KV bytes per token (the bytes actually moved).
    #[arg(long, env = "DOLPHIN_SIM_BYTE_SCALE", default_value_t = 0.001)]
    pub sim_byte_scale: f64,
    /// Tokens per KV block (the router must hash with the same size).
    #[arg(long, env = "DOLPHIN_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: u32,
    /// KV blocks in the sim engine's pool (the candle engine sizes its pool by `--kv-bytes`).
    #[arg(long, env = "DOLPHIN_TOTAL_BLOCKS", default_value_t = 8192)]
    pub total_blocks: u32,
    /// Most tokens one engine step processes (prefill chunks plus decodes). Default: 2048 for
    /// the sim, the candle engine's own (a few hundred: every running sequence's next token
    /// waits for a step, and real steps are slow).
    #[arg(long, env = "DOLPHIN_MAX_BATCHED_TOKENS")]
    pub max_batched_tokens: Option<u32>,
    /// Most prompt tokens of one request per step (vLLM's `long_prefill_token_threshold`), 0
    /// for no cap beyond `--max-batched-tokens`. Default: the sim profile's (0 for the shipped
    /// ones), 0 for candle.
    #[arg(long, env = "DOLPHIN_PREFILL_CHUNK_TOKENS")]
    pub prefill_chunk_tokens: Option<u32>,
    /// Most prompt tokens in a step that also decodes, 0 for no cap beyond
    /// `--max-batched-tokens`: lower it to shorten the stall a local prefill causes the decodes
    /// beside it (better TPOT, longer TTFT). Default: the sim profile's (0 for the shipped
    /// ones), 0 for candle.
    #[arg(long, env = "DOLPHIN_MIXED_PREFILL_TOKENS")]
    pub mixed_prefill_tokens: Option<u32>,
    /// Most requests queued for admission; more are refused (RESOURCE_EXHAUSTED).
    #[arg(long, env = "DOLPHIN_MAX_WAITING", default_value_t = 256)]
    pub max_waiting: u32,
    /// The order requests are admitted and prefilled in: fcfs (arrival; a request naming a
    /// priority is refused) or priority (each request's `priority`, lower first, as vLLM's).
    #[arg(long, env = "DOLPHIN_SCHEDULING_POLICY", default_value = "fcfs")]
    pub scheduling_policy: dolphin_engine::SchedulingPolicy,
    /// Name of the model served. Default: `sim-model` for the sim engine, the model file's
    /// name without extension for candle.
    #[arg(long, env = "DOLPHIN_MODEL")]
    pub model: Option<String>,
    /// Candle: the GGUF model file (default: SmolLM2 where `scripts/fetch-model.sh` puts it).
    #[arg(long, env = "DOLPHIN_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Candle: how weights are held after loading: auto (a Q4_1 file's own weights where the
    /// tiled Q4_1 kernel runs, on x86 CPUs with AVX2; else q8_0), q8_0 (re-quantized),
    /// keep (as stored), q4k, f32.
    #[arg(long, env = "DOLPHIN_WEIGHTS", default_value = "auto", value_parser = parse_weights)]
    pub weights: WeightFormat,
    /// Candle: compute threads (default: `DOLPHIN_THREADS`, else 1: on a busy machine candle's
    /// threads wait on each other every kernel, and 2 threads measured slower than 1).
    #[arg(long, env = "DOLPHIN_THREADS")]
    pub threads: Option<usize>,
    /// Candle: KV memory in bytes (suffixes K, M, G, KiB, MiB, GiB); the pool holds this
    /// divided by (KV bytes per token x block size) blocks.
    #[arg(long, env = "DOLPHIN_KV_BYTES", default_value = "512MiB", value_parser = parse_bytes)]
    pub kv_bytes: u64,
    /// Candle: pad matmul inner dimensions to multiples of 256 for the fast x86 kernels
    /// (auto, on, off).
    #[arg(long, env = "DOLPHIN_PADDING", default_value = "auto", value_parser = parse_padding)]
    pub padding: Padding,
    /// Candle: kernels of the quantized matmuls on the CPU: auto (Dolphin's tiled kernels for
    /// Q4_1 weights, on AVX-512 VNNI where the CPU has it, and for Q8_0 on x86 CPUs without
    /// VNNI; candle's elsewhere), candle, tiled, tiled-avx2 (the tiled kernels on AVX2 only).
    /// For Q8_0 candle's and the tiled kernel give the same results.
    #[arg(long, env = "DOLPHIN_MATMUL", default_value = "auto", value_parser = parse_matmul)]
    pub matmul: MatmulKernel,
    /// Candle: cpu, cuda or cuda:N (CUDA needs a build with the `cuda` feature).
    #[arg(long, env = "DOLPHIN_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceKind,
    /// The context length (prompt plus generated tokens): candle caps the model's to it, the
    /// sim engine's simulated model takes it (default 32768).
    #[arg(long, env = "DOLPHIN_MAX_CONTEXT")]
    pub max_context: Option<u32>,
}

fn parse_weights(s: &str) -> Result<WeightFormat, String> {
    s.parse().map_err(|e| format!("{e}"))
}

fn parse_padding(s: &str) -> Result<Padding, String> {
    s.parse().map_err(|e| format!("{e}"))
}

fn parse_matmul(s: &str) -> Result<MatmulKernel, String> {
    s.parse()
}

fn parse_device(s: &str) -> Result<DeviceKind, String> {
    s.parse().map_err(|e| format!("{e}"))
}

/// A byte count: digits with an optional K/M/G (powers of 1000) or KiB/MiB/GiB suffix.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 536870912 or 512MiB)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        other => return Err(format!("unknown byte unit {other:?} in {s:?}")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Default KV memory of the candle engine (re-exported for documentation and tests).
pub const DEFAULT_CANDLE_KV_BYTES: u64 = DEFAULT_KV_BYTES;

impl EngineArgs {
    /// Checks ranges the engine would otherwise reject later, or worse, accept.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.block_size == 0 {
            return Err(ConfigError::invalid("block-size", "must be at least 1"));
        }
        if self.total_blocks == 0 {
            return Err(ConfigError::invalid("total-blocks", "must be at least 1"));
        }
        if self.max_batched_tokens == Some(0) {
            return Err(ConfigError::invalid(
                "max-batched-tokens",
                "must be at least 1",
            ));
        }
        if !self.sim_time_scale.is_finite() || self.sim_time_scale < 0.0 {
            return Err(ConfigError::invalid(
                "sim-time-scale",
                format!("must be a finite number >= 0, got {}", self.sim_time_scale),
            ));
        }
        if !self.sim_byte_scale.is_finite() || self.sim_byte_scale <= 0.0 {
            return Err(ConfigError::invalid(
                "sim-byte-scale",
                format!("must be a finite number > 0, got {}", self.sim_byte_scale),
            ));
        }
        if self.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
            return Err(ConfigError::invalid("model", "must not be empty"));
        }
        if self.threads == Some(0) {
            return Err(ConfigError::invalid("threads", "must be at least 1"));
        }
        if self.kv_bytes == 0 {
            return Err(ConfigError::invalid("kv-bytes", "must be at least 1"));
        }
        if self.max_context == Some(0) {
            return Err(ConfigError::invalid("max-context", "must be at least 1"));
        }
        if self.sim_profile.is_empty() {
            return Err(ConfigError::invalid("sim-profile", "must not be empty"));
        }
        Ok(())
    }
}

/// Flags every worker takes.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// gRPC listen address (port 0: pick a free port; the READY line tells which).
    #[arg(long, env = "DOLPHIN_GRPC_ADDR", default_value = "127.0.0.1:0")]
    pub grpc_addr: SocketAddr,
    /// Address published for the gRPC listener, what the router and peers connect to: a host
    /// (the bound port is added) or host:port. Required when --grpc-addr is unspecified
    /// (0.0.0.0, [::]), as in a container: give the pod or host IP. Its host is also the decode
    /// worker's KV advertise host unless --kv-advertise-addr says otherwise.
    #[arg(long, env = "DOLPHIN_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,
    /// Worker id (default: the role plus 8 random hex digits).
    #[arg(long, env = "DOLPHIN_WORKER_ID")]
    pub worker_id: Option<String>,
    /// etcd endpoints (repeatable or comma-separated); absent: no registration.
    #[arg(long = "etcd", env = "DOLPHIN_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// etcd cluster name: the `<cluster>` in `/dolphin/<cluster>/...`.
    #[arg(long, env = "DOLPHIN_CLUSTER", default_value = "default")]
    pub cluster: String,
    /// TTL of the etcd lease: how long a crashed worker stays listed.
    #[arg(long, env = "DOLPHIN_LEASE_TTL_SECS", default_value_t = 10)]
    pub lease_ttl_secs: i64,
    /// Engine settings.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Serve Prometheus `/metrics` on this address (absent: no metrics endpoint).
    #[arg(long, env = "DOLPHIN_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// On SIGTERM/SIGINT, how long running requests may finish before they are cancelled.
    #[arg(long, env = "DOLPHIN_DRAIN_GRACE_SECS", default_value_t = 30)]
    pub drain_grace_secs: u64,
    /// Log JSON lines instead of text.
    #[arg(long, env = "DOLPHIN_LOG_JSON")]
    pub log_json: bool,
    /// Threads of the async runtime that serves gRPC, moves KV blocks and talks to etcd
    /// (absent: one per core). The engine computes on threads of its own. One thread spares
    /// the runtime's threads waking each other for every short request (2 cores, 8-token
    /// requests: 127-129 against 174-215 us of worker CPU each at one connection), but with
    /// 10,000 streams through the router it added TTFT (`docs/dev/profiling.md`).
    #[arg(long, env = "DOLPHIN_RUNTIME_THREADS")]
    pub runtime_threads: Option<usize>,
    /// How KV blocks move between prefill and decode workers.
    #[arg(long, env = "DOLPHIN_KV_TRANSPORT", value_enum, default_value_t = KvTransportKind::Tcp)]
    pub kv_transport: KvTransportKind,
    /// CUDA device of this worker's NCCL communicators (with `--kv-transport nccl`).
    #[arg(long, env = "DOLPHIN_NCCL_DEVICE", default_value_t = 0)]
    pub nccl_device: usize,
    /// TLS: certificates for mutual TLS with the router and the other workers (gRPC and KV
    /// transfer), and for etcd.
    #[command(flatten)]
    pub tls: dolphin_tls::TlsArgs,
}

impl CommonArgs {
    /// Checks every flag; the process exits 64 on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.engine.validate()?;
        if self.runtime_threads == Some(0) {
            return Err(ConfigError::invalid(
                "runtime-threads",
                "must be at least 1",
            ));
        }
        if let Some(id) = &self.worker_id
            && (id.is_empty() || id.contains('/') || id.chars().any(char::is_whitespace))
        {
            return Err(ConfigError::invalid(
                "worker-id",
                format!("{id:?} must be non-empty without '/' or spaces (it is an etcd key part)"),
            ));
        }
        if self.cluster.is_empty() || self.cluster.contains('/') {
            return Err(ConfigError::invalid(
                "cluster",
                format!("{:?} must be non-empty without '/'", self.cluster),
            ));
        }
        // etcd rounds TTLs below its minimum up to it; only non-positive values are nonsense.
        if self.lease_ttl_secs < 1 {
            return Err(ConfigError::invalid(
                "lease-ttl-secs",
                format!("must be at least 1, got {}", self.lease_ttl_secs),
            ));
        }
        if self.etcd.iter().any(|e| e.trim().is_empty()) {
            return Err(ConfigError::invalid("etcd", "empty endpoint"));
        }
        check_advertised(
            self.grpc_addr,
            self.advertise()?.as_ref(),
            "grpc-addr",
            "gRPC",
        )?;
        Ok(())
    }

    /// The CUDA device for NCCL when `--kv-transport nccl` was given. Fails when this build
    /// has no NCCL (`nccl_built`: the worker crate's `nccl` feature).
    pub fn nccl_device(&self, nccl_built: bool) -> Result<Option<usize>, ConfigError> {
        match self.kv_transport {
            KvTransportKind::Tcp => Ok(None),
            KvTransportKind::Nccl if nccl_built => Ok(Some(self.nccl_device)),
            KvTransportKind::Nccl => Err(nccl_not_built()),
        }
    }

    /// The parsed `--advertise-addr`.
    pub fn advertise(&self) -> Result<Option<Advertise>, ConfigError> {
        parse_advertise(self.advertise_addr.as_deref(), "advertise-addr", "gRPC")
    }

    /// The worker id: from the flag, or generated for `role`.
    pub fn worker_id(&self, role: Role) -> WorkerId {
        self.worker_id
            .clone()
            .map_or_else(|| WorkerId::generate(role), WorkerId)
    }

    /// etcd settings, or `None` when no endpoint was given (static discovery).
    pub fn etcd_config(&self) -> Option<EtcdConfig> {
        (!self.etcd.is_empty()).then(|| EtcdConfig {
            endpoints: self.etcd.clone(),
            cluster: self.cluster.clone(),
            lease_ttl_secs: self.lease_ttl_secs,
            tls: self
                .tls
                .etcd()
                .map(|(ca, identity)| dolphin_cluster::EtcdTls {
                    ca,
                    identity,
                    domain: None,
                }),
        })
    }

    /// The process's TLS state (files read now and followed for changes), or `None` when TLS
    /// is off. A worker serves and dials, so it needs its certificate, key and the CA.
    pub fn load_tls(&self) -> Result<Option<dolphin_tls::Tls>, ConfigError> {
        let tls = self
            .tls
            .load_member()
            .map_err(|e| ConfigError::invalid("tls-cert", e.to_string()))?;
        if let Some(tls) = &tls {
            tls.watch(TLS_RELOAD_EVERY, tokio_util::sync::CancellationToken::new());
        }
        Ok(tls)
    }

    /// The drain grace period.
    pub fn drain_grace(&self) -> Duration {
        Duration::from_secs(self.drain_grace_secs)
    }
}

/// How often the TLS files are checked for changes (a Kubernetes secret mount updates within a
/// minute or so).
const TLS_RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Parses an advertise flag's value (`None`: not given).
pub fn parse_advertise(
    value: Option<&str>,
    flag: &'static str,
    what: &'static str,
) -> Result<Option<Advertise>, ConfigError> {
    value
        .map(|v| Advertise::parse(v, what))
        .transpose()
        .map_err(|e| ConfigError::invalid(flag, e.to_string()))
}

/// Refuses, before anything starts, listener `what` bound to an unspecified address with no
/// advertise address: the same rule [`dolphin_cluster::advertised`] applies once it is bound.
pub fn check_advertised(
    bind: SocketAddr,
    advertise: Option<&Advertise>,
    bind_flag: &'static str,
    what: &'static str,
) -> Result<(), ConfigError> {
    advertised(bind, advertise, what)
        .map(drop)
        .map_err(|e| ConfigError::invalid(bind_flag, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parse(args: &[&str]) -> Result<CommonArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("worker").chain(args.iter().copied())).map(|c| c.common)
    }

    #[test]
    fn nccl_needs_a_build_with_it() {
        let tcp = parse(&[]).expect("parses");
        assert_eq!(tcp.kv_transport, KvTransportKind::Tcp);
        assert_eq!(tcp.nccl_device(false).expect("tcp"), None);
        let nccl = parse(&["--kv-transport", "nccl", "--nccl-device", "3"]).expect("parses");
        assert_eq!(nccl.nccl_device(true).expect("built"), Some(3));
        let err = nccl.nccl_device(false).expect_err("not built");
        assert!(err.to_string().contains("nccl"), "{err}");
        assert!(parse(&["--kv-transport", "rdma"]).is_err());
    }

    #[test]
    fn defaults_match_the_contract() {
        let args = parse(&[]).expect("parses");
        assert_eq!(args.grpc_addr, "127.0.0.1:0".parse().expect("addr"));
        assert_eq!(args.cluster, "default");
        assert_eq!(args.lease_ttl_secs, 10);
        assert_eq!(args.engine.engine, EngineKind::Sim);
        assert_eq!(args.engine.sim_profile, "dynamo-mocker");
        assert_eq!(args.engine.sim_time_scale, 1.0);
        assert_eq!(args.engine.sim_byte_scale, 0.001);
        assert_eq!(args.engine.block_size, 16);
        assert_eq!(args.engine.model, None);
        assert_eq!(args.engine.model_path, None);
        assert_eq!(args.engine.weights, WeightFormat::Auto);
        assert_eq!(args.engine.kv_bytes, DEFAULT_CANDLE_KV_BYTES);
        assert_eq!(args.engine.threads, None);
        assert!(args.etcd_config().is_none());
        assert!(args.metrics_addr.is_none());
        args.validate().expect("defaults are valid");
    }

    #[test]
    fn every_contract_flag_parses() {
        let args = parse(&[
            "--grpc-addr",
            "127.0.0.1:7001",
            "--worker-id",
            "decode-1",
            "--etcd",
            "http://127.0.0.1:2379,http://127.0.0.1:2381",
            "--etcd",
            "http://127.0.0.1:2383",
            "--cluster",
            "c1",
            "--lease-ttl-secs",
            "5",
            "--engine",
            "sim",
            "--sim-profile",
            "qwen72b-h20",
            "--sim-time-scale",
            "0",
            "--sim-byte-scale",
            "0.01",
            "--block-size",
            "32",
            "--total-blocks",
            "100",
            "--max-batched-tokens",
            "512",
            "--max-waiting",
            "4",
            "--model",
            "m",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .expect("parses");
        args.validate().expect("valid");
        let etcd = args.etcd_config().expect("etcd configured");
        assert_eq!(etcd.endpoints.len(), 3);
        assert_eq!(etcd.cluster, "c1");
        assert_eq!(etcd.lease_ttl_secs, 5);
        assert_eq!(args.worker_id(Role::Decode), WorkerId("decode-1".into()));
        assert_eq!(args.engine.total_blocks, 100);
        assert_eq!(args.engine.sim_time_scale, 0.0);
    }

    #[test]
    fn an_unspecified_bind_with_an_advertise_address_is_valid() {
        let args = parse(&[
            "--grpc-addr",
            "0.0.0.0:7000",
            "--advertise-addr",
            "10.0.0.7",
        ])
        .expect("parses");
        args.validate().expect("valid");
        let a = args.advertise().expect("parses").expect("given");
        assert_eq!(a.with_port(7000), "10.0.0.7:7000");
    }

    #[test]
    fn generated_ids_carry_the_role() {
        let args = parse(&[]).expect("parses");
        assert!(args.worker_id(Role::Prefill).0.starts_with("prefill-"));
    }

    #[test]
    fn out_of_range_values_name_their_flag() {
        let flag_of = |args: &[&str]| match parse(args).expect("parses").validate() {
            Err(ConfigError::Invalid { flag, .. }) => flag,
            other => panic!("expected an invalid flag, got {other:?}"),
        };
        assert_eq!(flag_of(&["--block-size", "0"]), "block-size");
        assert_eq!(flag_of(&["--total-blocks", "0"]), "total-blocks");
        assert_eq!(flag_of(&["--sim-time-scale=-1"]), "sim-time-scale");
        assert_eq!(flag_of(&["--sim-byte-scale", "0"]), "sim-byte-scale");
        assert_eq!(flag_of(&["--worker-id", "a/b"]), "worker-id");
        assert_eq!(flag_of(&["--cluster", ""]), "cluster");
        assert_eq!(flag_of(&["--lease-ttl-secs", "0"]), "lease-ttl-secs");
        assert_eq!(flag_of(&["--threads", "0"]), "threads");
        assert_eq!(flag_of(&["--runtime-threads", "0"]), "runtime-threads");
        assert_eq!(flag_of(&["--kv-bytes", "0"]), "kv-bytes");
        assert_eq!(flag_of(&["--model", " "]), "model");
        assert_eq!(flag_of(&["--grpc-addr", "0.0.0.0:7000"]), "grpc-addr");
        assert_eq!(flag_of(&["--grpc-addr", "[::]:0"]), "grpc-addr");
        assert_eq!(flag_of(&["--advertise-addr", "0.0.0.0"]), "advertise-addr");
        assert_eq!(flag_of(&["--advertise-addr", "h:x"]), "advertise-addr");
        assert!(parse(&["--weights", "q3"]).is_err());
        assert!(parse(&["--device", "tpu"]).is_err());
    }

    #[test]
    fn candle_flags_parse() {
        let args = parse(&[
            "--engine",
            "candle",
            "--model-path",
            "/m/x.gguf",
            "--weights",
            "keep",
            "--threads",
            "1",
            "--kv-bytes",
            "64MiB",
            "--padding",
            "off",
            "--matmul",
            "candle",
            "--device",
            "cuda:1",
            "--max-context",
            "2048",
        ])
        .expect("parses");
        args.validate().expect("valid");
        let e = &args.engine;
        assert_eq!(e.engine, EngineKind::Candle);
        assert_eq!(
            e.model_path.as_deref(),
            Some(std::path::Path::new("/m/x.gguf"))
        );
        assert_eq!(e.weights, WeightFormat::Keep);
        assert_eq!(e.threads, Some(1));
        assert_eq!(e.kv_bytes, 64 << 20);
        assert_eq!(e.padding, Padding::Off);
        assert_eq!(e.matmul, MatmulKernel::Candle);
        assert_eq!(e.device, DeviceKind::Cuda(1));
        assert_eq!(e.max_context, Some(2048));
    }

    #[test]
    fn byte_counts_take_units() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("2K"), Ok(2000));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1 GiB"), Ok(1 << 30));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("99999999999999GiB").is_err());
    }
}

//! The router's configuration: flags (or `DOLPHIN_*` environment variables), parsed and
//! validated once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::dolphin::online::OnlineConfig;
use crate::dolphin::trust::TrustConfig;
use crate::policy::{
    DolphinConfig, FallbackKind, Policy, PolicyKind, ThresholdConfig, ThresholdVariant,
};
use crate::tokenizer::TokenizerKind;

/// Flags of `dolphin-router`.
#[derive(Clone, Debug, Parser)]
#[command(name = "dolphin-router", version, about = "Dolphin's front router")]
pub struct RouterConfig {
    /// OpenAI-compatible HTTP listener (port 0 picks one).
    #[arg(long, env = "DOLPHIN_HTTP_ADDR", default_value = "127.0.0.1:8000")]
    pub http_addr: SocketAddr,
    /// gRPC listener for the public `dolphin.v1.Inference` (port 0 picks one).
    #[arg(long, env = "DOLPHIN_GRPC_ADDR", default_value = "127.0.0.1:50051")]
    pub grpc_addr: SocketAddr,
    /// gRPC listener for `RouterAdmin` (policy, tables, classifier, worker list), apart from the
    /// public API; loopback unless told otherwise.
    #[arg(long, env = "DOLPHIN_ADMIN_ADDR", default_value = "127.0.0.1:50052")]
    pub admin_addr: SocketAddr,
    /// Plain-HTTP listener for `/metrics` (Prometheus) and `/health` (probes), apart from the
    /// public API.
    #[arg(long, env = "DOLPHIN_METRICS_ADDR", default_value = "127.0.0.1:9091")]
    pub metrics_addr: SocketAddr,
    /// File of API keys (one per line, `#` comments), reloaded when it changes: the public
    /// APIs then require one (HTTP `Authorization: Bearer KEY`, gRPC metadata
    /// `authorization: Bearer KEY`). Absent: no key needed.
    #[arg(long, env = "DOLPHIN_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Origins that browser apps may call the public HTTP API from (CORS): comma-separated
    /// (`https://app.example,http://localhost:3000`), or `*` for every origin. Preflights are
    /// answered without a key; the calls themselves still need one. Absent: no CORS.
    #[arg(long, env = "DOLPHIN_CORS_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub cors_allowed_origins: Vec<String>,
    /// File of admin keys, like `--api-key-file`, for the admin listener. Absent: whoever
    /// reaches the admin listener may use it.
    #[arg(long, env = "DOLPHIN_ADMIN_KEY_FILE")]
    pub admin_key_file: Option<PathBuf>,
    /// Address the router publishes for its listeners (in its READY line and logs): a host (the
    /// bound ports are added) or host:port for gRPC. Required when a listener is bound to an
    /// unspecified address (0.0.0.0, [::]), as in a container: give the pod or host IP.
    #[arg(long, env = "DOLPHIN_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,
    /// etcd endpoints (repeatable or comma-separated); absent: static discovery.
    #[arg(long, env = "DOLPHIN_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// etcd cluster name.
    #[arg(long, env = "DOLPHIN_CLUSTER", default_value = "default")]
    pub cluster: String,
    /// JSON file `{"workers": [...]}` listing the workers.
    #[arg(long, env = "DOLPHIN_STATIC_WORKERS")]
    pub static_workers: Option<PathBuf>,
    /// A prefill worker's gRPC address (repeatable); the router asks it `Worker.Info`.
    #[arg(long, env = "DOLPHIN_PREFILL", value_delimiter = ',')]
    pub prefill: Vec<String>,
    /// A decode worker's gRPC address (repeatable); the router asks it `Worker.Info`.
    #[arg(long, env = "DOLPHIN_DECODE", value_delimiter = ',')]
    pub decode: Vec<String>,
    /// Prefill policy.
    #[arg(long, env = "DOLPHIN_POLICY", value_enum, default_value = "threshold")]
    pub policy: PolicyKind,
    /// The threshold rules' parameters (`--policy threshold`, and the `dolphin` fallback).
    #[command(flatten)]
    pub threshold_flags: ThresholdArgs,
    /// `--policy dolphin`: the policy deciding while the live split has no routing table (a
    /// threshold fallback takes the threshold flags).
    #[arg(
        long,
        env = "DOLPHIN_FALLBACK_POLICY",
        value_enum,
        default_value = "threshold"
    )]
    pub fallback_policy: FallbackKind,
    /// `--policy dolphin`: when a table's bit is trusted (the rest go to the fallback).
    #[command(flatten)]
    pub trust_flags: TrustArgs,
    /// `--policy dolphin`: learning from live traffic (off by default).
    #[command(flatten)]
    pub online_flags: OnlineArgs,
    /// Tokenizer (must match the workers').
    #[arg(long, env = "DOLPHIN_TOKENIZER", value_enum, default_value = "sim")]
    pub tokenizer: TokenizerKind,
    /// The GGUF model file the workers serve (`--tokenizer gguf` reads its tokenizer), or the
    /// Hugging Face model directory or `tokenizer.json` (`--tokenizer hf`).
    #[arg(long, env = "DOLPHIN_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Served model name; requests naming another get 404 / NOT_FOUND. Default: the model
    /// file's name without extension with `--tokenizer gguf`, the model directory's name with
    /// `--tokenizer hf`, else `sim-model`.
    #[arg(long, env = "DOLPHIN_MODEL")]
    pub model: Option<String>,
    /// Longest prompt accepted, in tokens.
    #[arg(long, env = "DOLPHIN_MAX_PROMPT_TOKENS", default_value_t = 131_072)]
    pub max_prompt_tokens: u32,
    /// Largest `max_tokens` accepted.
    #[arg(long, env = "DOLPHIN_MAX_OUTPUT_TOKENS", default_value_t = 16_384)]
    pub max_output_tokens: u32,
    /// Append one JSON line per finished request here.
    #[arg(long, env = "DOLPHIN_REQUEST_LOG")]
    pub request_log: Option<PathBuf>,
    /// Weight of uncached prompt blocks against load in worker selection.
    #[arg(long, env = "DOLPHIN_OVERLAP_WEIGHT", default_value_t = 1.0)]
    pub overlap_weight: f64,
    /// Tokens per KV block (must match the workers'; workers with another size are refused).
    #[arg(long, env = "DOLPHIN_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: u32,
    /// Requests in flight before new ones get 429 / RESOURCE_EXHAUSTED.
    #[arg(long, env = "DOLPHIN_MAX_INFLIGHT", default_value_t = 4096)]
    pub max_inflight: u32,
    /// How calls are read out of the model's text when a request lets it choose whether to
    /// call a tool (`tool_choice: "auto"`, the default with tools): the format the model was
    /// trained to write calls in (`hermes`: Qwen2.5, Qwen3, Hermes 2 Pro, SmolLM3;
    /// `llama3_json`: Llama 3.1-3.3; `mistral`: Mistral 7B v0.3, Nemo, Small, Magistral,
    /// Devstral; `pythonic`: Llama 3.2 1B/3B, Llama 4). Without it such requests get 400; forced calls (`"required"`, a named
    /// function) need no parser.
    #[arg(long, env = "DOLPHIN_TOOL_CALL_PARSER", value_enum)]
    pub tool_call_parser: Option<crate::tools::ToolCallParser>,
    /// How a reasoning model's thinking is split from its chat answers and sent as
    /// `reasoning_content` (`deepseek_r1`: DeepSeek-R1 and its distills; `qwen3`: Qwen3, QwQ).
    /// Without it the thinking stays in the text.
    #[arg(long, env = "DOLPHIN_REASONING_PARSER", value_enum)]
    pub reasoning_parser: Option<crate::reasoning::ReasoningParser>,
    /// Lets a request bring its own chat template (vLLM's `chat_template` field, gRPC
    /// `ChatMessages.chat_template`) instead of the model's. Off by default, as in vLLM: such a
    /// template runs on the router's CPU (under an instruction budget), so allow it only for
    /// clients you trust.
    #[arg(long, env = "DOLPHIN_TRUST_REQUEST_CHAT_TEMPLATE")]
    pub trust_request_chat_template: bool,
    /// Responses the Responses API keeps in this router's memory for `previous_response_id`
    /// and `GET /v1/responses/{id}` (the last N asked to be stored; 0: none, and such requests
    /// get 400). Each replica keeps its own; `--responses-etcd-ttl` shares them.
    #[arg(long, env = "DOLPHIN_RESPONSES_STORE", default_value_t = 0)]
    pub responses_store: usize,
    /// Keeps the Responses API's responses in the cluster's etcd (needs `--etcd`) for this
    /// many seconds (up to a tenth more), so that every router replica continues and reads
    /// what any of them kept (0: not in etcd). Excludes `--responses-store`.
    #[arg(long, env = "DOLPHIN_RESPONSES_ETCD_TTL", default_value_t = 0)]
    pub responses_etcd_ttl: u64,
    /// Times one request may move to another decode worker when the one streaming it dies or
    /// its connection breaks (0: never; the client gets the error).
    #[arg(long, env = "DOLPHIN_MAX_MIGRATIONS", default_value_t = 3)]
    pub max_migrations: u32,
    /// Longest a request may run, arrival to last token, unless the client's own `grpc-timeout`
    /// is shorter (0: no limit). Past it the client gets 504 / DEADLINE_EXCEEDED and the
    /// worker's request is cancelled.
    #[arg(long, env = "DOLPHIN_REQUEST_TIMEOUT_SECS", default_value_t = 600)]
    pub request_timeout_secs: u64,
    /// Load report interval asked of workers, in milliseconds.
    #[arg(long, env = "DOLPHIN_LOAD_INTERVAL_MS", default_value_t = 100)]
    pub load_interval_ms: u32,
    /// Timeout for connecting to a worker, in milliseconds.
    #[arg(long, env = "DOLPHIN_CONNECT_TIMEOUT_MS", default_value_t = 2000)]
    pub connect_timeout_ms: u64,
    /// Grace period for in-flight requests at shutdown, in seconds.
    #[arg(long, env = "DOLPHIN_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Log as JSON lines.
    #[arg(long, env = "DOLPHIN_LOG_JSON")]
    pub log_json: bool,
    /// Serving threads, each with its own event loop and worker connections (0: one per
    /// core). Connections are dealt to them in turn; a request stays on its thread.
    #[arg(long, env = "DOLPHIN_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// TLS: the certificate the HTTP and gRPC listeners present, mutual TLS to the workers,
    /// TLS to etcd.
    #[command(flatten)]
    pub tls: dolphin_tls::TlsArgs,
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl RouterConfig {
    /// The origins of `--cors-allowed-origins` (`None`: no CORS).
    pub fn cors(&self) -> Result<Option<crate::http::cors::Cors>, crate::http::cors::BadOrigin> {
        crate::http::cors::Cors::from_flag(&self.cors_allowed_origins)
    }

    /// Checks what clap cannot: ranges and that some discovery is configured.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        for (flag, path) in [
            ("--api-key-file", &self.api_key_file),
            ("--admin-key-file", &self.admin_key_file),
        ] {
            if let Some(path) = path
                && let Err(e) = crate::auth::KeySet::load(path)
            {
                return bad(format!("{flag}: {e}"));
            }
        }
        if let Err(e) = self.cors() {
            return bad(e.to_string());
        }
        if self.etcd.is_empty()
            && self.static_workers.is_none()
            && self.prefill.is_empty()
            && self.decode.is_empty()
        {
            return bad(
                "no workers source: give --etcd, --static-workers or --prefill/--decode".into(),
            );
        }
        if !self.etcd.is_empty()
            && (self.static_workers.is_some()
                || !self.prefill.is_empty()
                || !self.decode.is_empty())
        {
            return bad("--etcd excludes --static-workers, --prefill and --decode".into());
        }
        if self.served_model().trim().is_empty() {
            return bad("--model must not be empty".into());
        }
        if let Err(e) = self.trust_flags.config().validate() {
            return bad(format!("table trust flags: {e}"));
        }
        if let Err(e) = self.online_flags.config().validate() {
            return bad(format!("online learning flags: {e}"));
        }
        if self.tokenizer != TokenizerKind::Sim && self.model_path.is_none() {
            return bad("--tokenizer gguf and hf need --model-path".into());
        }
        if self.block_size == 0 {
            return bad("--block-size must be at least 1".into());
        }
        if self.max_prompt_tokens == 0 || self.max_output_tokens == 0 {
            return bad("--max-prompt-tokens and --max-output-tokens must be at least 1".into());
        }
        if !(self.overlap_weight.is_finite() && self.overlap_weight >= 0.0) {
            return bad(format!(
                "--overlap-weight must be a finite number >= 0, got {}",
                self.overlap_weight
            ));
        }
        if self.max_inflight == 0 {
            return bad("--max-inflight must be at least 1".into());
        }
        if self.responses_etcd_ttl > 0 {
            if self.etcd.is_empty() {
                return bad("--responses-etcd-ttl keeps responses in etcd: give --etcd".into());
            }
            if self.responses_store > 0 {
                return bad(
                    "--responses-store (in memory) and --responses-etcd-ttl (in etcd): give one"
                        .into(),
                );
            }
        }
        if self.connect_timeout_ms == 0 {
            return bad("--connect-timeout-ms must be at least 1".into());
        }
        // The rule `server::start` applies once the ports are bound, checked before anything
        // starts.
        let advertise = self.advertise()?;
        for (flag, addr, what) in [
            ("--http-addr", self.http_addr, "HTTP"),
            ("--grpc-addr", self.grpc_addr, "gRPC"),
        ] {
            dolphin_cluster::advertised(addr, advertise.as_ref(), what)
                .map_err(|e| ConfigError(format!("{flag} {addr}: {e}")))?;
        }
        self.threshold()
            .validate()
            .map_err(|e| ConfigError(e.to_string()))?;
        Ok(())
    }

    /// The parsed `--advertise-addr`.
    pub fn advertise(&self) -> Result<Option<dolphin_cluster::Advertise>, ConfigError> {
        self.advertise_addr
            .as_deref()
            .map(|v| dolphin_cluster::Advertise::parse(v, "router"))
            .transpose()
            .map_err(|e| ConfigError(format!("--advertise-addr: {e}")))
    }

    /// The model name served: `--model`, else derived from `--model-path` for a GGUF
    /// tokenizer (as the workers derive it), else `sim-model`.
    pub fn served_model(&self) -> String {
        match (&self.model, self.tokenizer, &self.model_path) {
            (Some(m), _, _) => m.clone(),
            (None, TokenizerKind::Gguf, Some(path)) => crate::tokenizer::model_name_for_path(path),
            (None, TokenizerKind::Hf, Some(path)) => crate::tokenizer::model_name_for_hf_path(path),
            _ => "sim-model".into(),
        }
    }

    /// The threshold parameters from the flags.
    pub fn threshold(&self) -> ThresholdConfig {
        self.threshold_flags.config()
    }

    /// The policy the router starts with.
    pub fn initial_policy(&self) -> Policy {
        match self.policy {
            PolicyKind::AlwaysLocal => Policy::AlwaysLocal,
            PolicyKind::AlwaysRemote => Policy::AlwaysRemote,
            PolicyKind::Threshold => Policy::Threshold(self.threshold()),
            PolicyKind::Dolphin => Policy::Dolphin(DolphinConfig {
                fallback: self.fallback_policy,
                threshold: self.threshold(),
                trust: self.trust_flags.config(),
                online: self.online_flags.config(),
            }),
        }
    }

    /// The router's limit on a request's life (`None`: `--request-timeout-secs 0`, no limit).
    pub fn request_timeout(&self) -> Option<Duration> {
        (self.request_timeout_secs > 0).then(|| Duration::from_secs(self.request_timeout_secs))
    }

    /// Worker connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// etcd settings for discovery and the table store (`None` without `--etcd`).
    pub fn etcd_config(&self) -> Option<dolphin_cluster::EtcdConfig> {
        if self.etcd.is_empty() {
            return None;
        }
        let mut etcd = dolphin_cluster::EtcdConfig::new(self.etcd.clone(), self.cluster.clone());
        etcd.tls = self
            .tls
            .etcd()
            .map(|(ca, identity)| dolphin_cluster::EtcdTls {
                ca,
                identity,
                domain: None,
            });
        Some(etcd)
    }
}

/// The threshold rules' flags, shared by the router and `dolphinctl replay --target sim`.
#[derive(Clone, Debug, clap::Args)]
pub struct ThresholdArgs {
    /// Which threshold rule (`--policy threshold`).
    #[arg(
        long,
        env = "DOLPHIN_THRESHOLD_VARIANT",
        value_enum,
        default_value = "dynamo16"
    )]
    pub threshold_variant: ThresholdVariant,
    /// Dynamo 1.6: local prefill only below this many uncached prompt tokens.
    #[arg(long, env = "DOLPHIN_MAX_LOCAL_PREFILL", default_value_t = 2048)]
    pub max_local_prefill: u32,
    /// Dynamo 1.6: ... and only when the uncached share of the prompt is below this.
    #[arg(long, env = "DOLPHIN_MAX_LOCAL_RATIO", default_value_t = 0.7)]
    pub max_local_ratio: f64,
    /// Legacy rule: remote prefill only above this many uncached prompt tokens.
    #[arg(long, env = "DOLPHIN_LEGACY_MIN_REMOTE", default_value_t = 1000)]
    pub legacy_min_remote: u32,
    /// A prefill worker with this many queued requests counts as overloaded.
    #[arg(long, env = "DOLPHIN_MAX_PREFILL_QUEUE", default_value_t = 2)]
    pub max_prefill_queue: u32,
    /// Dynamo 1.6: prefill locally when the chosen prefill worker is overloaded.
    #[arg(long, env = "DOLPHIN_SKIP_OVERLOADED_PREFILL")]
    pub skip_overloaded_prefill: bool,
    /// `prefill-load`, `isl-or-load`: a prefill worker with more than this many steps of prefill
    /// work pending (queued prefill tokens over its max batched tokens) is busy.
    #[arg(long, env = "DOLPHIN_PREFILL_BUSY_THRESHOLD", default_value_t = 1.0)]
    pub prefill_busy_threshold: f64,
    /// Any threshold rule: never prefill locally when more than this share (0..=1) of the chosen
    /// decode worker's KV pool is in use. Unset: no guard.
    #[arg(long, env = "DOLPHIN_DECODE_BUSY_THRESHOLD")]
    pub decode_busy_threshold: Option<f64>,
    /// `llm-d`: prefill remotely from this many prompt tokens not cached on the decode worker.
    #[arg(long, env = "DOLPHIN_NON_CACHED_TOKENS", default_value_t = 2048)]
    pub non_cached_tokens: u32,
}

impl ThresholdArgs {
    /// The parameters these flags set.
    pub fn config(&self) -> ThresholdConfig {
        ThresholdConfig {
            variant: self.threshold_variant,
            max_local_prefill: self.max_local_prefill,
            max_local_ratio: self.max_local_ratio,
            legacy_min_remote: self.legacy_min_remote,
            max_prefill_queue: self.max_prefill_queue,
            skip_overloaded_prefill: self.skip_overloaded_prefill,
            prefill_busy_threshold: self.prefill_busy_threshold,
            decode_busy_threshold: self.decode_busy_threshold,
            non_cached_tokens: self.non_cached_tokens,
        }
    }
}

/// When the `dolphin` policy takes a table's bit (see `dolphin::trust`): flags shared by the
/// router and `dolphinctl replay --target sim`.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct TrustArgs {
    /// Take every bit of a table, whatever its evidence and however far a request lies from its
    /// cluster (tables without evidence are always taken).
    #[arg(long, env = "DOLPHIN_TABLE_TRUST_ALL")]
    pub table_trust_all: bool,
    /// Fewest training requests behind a bit; a cluster with fewer is routed by the fallback.
    #[arg(long, env = "DOLPHIN_TABLE_MIN_REQUESTS", default_value_t = 20)]
    pub table_min_requests: u64,
    /// Smallest reward margin of a bit over the other path (-1..=1); below it, or with no
    /// measured margin, the cluster is routed by the fallback.
    #[arg(
        long,
        env = "DOLPHIN_TABLE_MIN_MARGIN",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    pub table_min_margin: f64,
    /// A request farther from its cluster's centre than this times the cluster's training
    /// range (at least 1) is routed by the fallback.
    #[arg(long, env = "DOLPHIN_TABLE_RANGE_SLACK", default_value_t = 1.5)]
    pub table_range_slack: f64,
}

impl TrustArgs {
    /// The settings these flags give.
    pub fn config(&self) -> TrustConfig {
        TrustConfig {
            enabled: !self.table_trust_all,
            min_requests: self.table_min_requests,
            min_margin: self.table_min_margin,
            range_slack: self.table_range_slack,
        }
    }
}

/// Online learning of the `dolphin` policy's tables (see `dolphin::online`): flags shared by
/// the router and `dolphinctl replay --target sim`.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct OnlineArgs {
    /// Keep learning the live split's table from live traffic: explore the other path on a
    /// share of each cluster's requests, flip a bit when the other path is significantly
    /// better, and publish each flip as a new table version (to etcd with `--etcd`). A split
    /// without a table starts from the nearest split's.
    #[arg(long, env = "DOLPHIN_ONLINE_LEARNING")]
    pub online_learning: bool,
    /// Share of each cluster's requests sent by the path its bit does not give (0..=0.5).
    #[arg(long, env = "DOLPHIN_ONLINE_EXPLORE_SHARE", default_value_t = 0.1)]
    pub online_explore_share: f64,
    /// One-sided confidence a flip needs (0.5..=0.9999).
    #[arg(long, env = "DOLPHIN_ONLINE_CONFIDENCE", default_value_t = 0.95)]
    pub online_confidence: f64,
    /// Fewest outcomes on each path of a cluster before its bit may flip.
    #[arg(long, env = "DOLPHIN_ONLINE_MIN_SAMPLES", default_value_t = 30)]
    pub online_min_samples: u32,
    /// A cluster's outcomes after which an older outcome weighs half (at least twice
    /// `--online-min-samples`).
    #[arg(long, env = "DOLPHIN_ONLINE_HALF_LIFE", default_value_t = 2000)]
    pub online_half_life: u32,
    /// Longest uncached prompt (tokens, on the chosen decode worker) explored by local
    /// prefill: a long local prefill stalls every decode on its worker. A cluster without
    /// evidence yet explores longer ones while its prefill worker has more than a step waiting.
    #[arg(
        long,
        env = "DOLPHIN_ONLINE_EXPLORE_LOCAL_MAX_TOKENS",
        default_value_t = 2048
    )]
    pub online_explore_local_max_tokens: u32,
}

impl OnlineArgs {
    /// The settings these flags give.
    pub fn config(&self) -> OnlineConfig {
        OnlineConfig {
            enabled: self.online_learning,
            explore_share: self.online_explore_share,
            confidence: self.online_confidence,
            min_samples: self.online_min_samples,
            half_life: self.online_half_life,
            explore_local_max_tokens: self.online_explore_local_max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<RouterConfig, clap::Error> {
        RouterConfig::try_parse_from(std::iter::once("dolphin-router").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_follow_the_contract() {
        let c = parse(&["--decode", "127.0.0.1:1"]).expect("parse");
        c.validate().expect("valid");
        assert_eq!(c.http_addr.to_string(), "127.0.0.1:8000");
        assert_eq!(c.grpc_addr.to_string(), "127.0.0.1:50051");
        assert_eq!(
            c.initial_policy(),
            Policy::Threshold(ThresholdConfig::default())
        );
        assert_eq!(c.overlap_weight, 1.0);
    }

    #[test]
    fn responses_in_etcd_need_etcd_and_exclude_the_memory_store() {
        let invalid = |args: &[&str]| {
            let c = parse(args).expect("parse");
            c.validate().expect_err("invalid").0
        };
        let e = invalid(&["--decode", "a:1", "--responses-etcd-ttl", "60"]);
        assert!(e.contains("--etcd"), "{e}");
        let e = invalid(&[
            "--etcd",
            "http://a:1",
            "--responses-etcd-ttl",
            "60",
            "--responses-store",
            "8",
        ]);
        assert!(e.contains("--responses-store"), "{e}");
        let c = parse(&["--etcd", "http://a:1", "--responses-etcd-ttl", "60"]).expect("parse");
        c.validate().expect("valid");
    }

    #[test]
    fn choices_are_enums() {
        let c = parse(&[
            "--etcd",
            "http://a:1,http://b:2",
            "--policy",
            "always-remote",
            "--threshold-variant",
            "dynamo-legacy",
            "--skip-overloaded-prefill",
        ])
        .expect("parse");
        assert_eq!(c.etcd.len(), 2);
        assert_eq!(c.initial_policy(), Policy::AlwaysRemote);
        assert_eq!(c.threshold().variant, ThresholdVariant::DynamoLegacy);
        assert!(c.threshold().skip_overloaded_prefill);
        let load = parse(&[
            "--decode",
            "a:1",
            "--threshold-variant",
            "isl-or-load",
            "--prefill-busy-threshold",
            "2",
            "--decode-busy-threshold",
            "0.9",
            "--non-cached-tokens",
            "512",
        ])
        .expect("parse");
        let t = load.threshold();
        assert_eq!(t.variant, ThresholdVariant::IslOrLoad);
        assert_eq!(
            (
                t.prefill_busy_threshold,
                t.decode_busy_threshold,
                t.non_cached_tokens
            ),
            (2.0, Some(0.9), 512)
        );
        for name in ["prefill-load", "llm-d", "dynamo16", "dynamo-legacy"] {
            assert!(parse(&["--threshold-variant", name]).is_ok(), "{name}");
        }
        assert!(parse(&["--policy", "sometimes"]).is_err());
        let d = parse(&["--decode", "a:1", "--policy", "dolphin"]).expect("parse");
        assert_eq!(
            d.initial_policy(),
            Policy::Dolphin(DolphinConfig::default())
        );
        let d = parse(&[
            "--decode",
            "a:1",
            "--policy",
            "dolphin",
            "--fallback-policy",
            "always-remote",
        ])
        .expect("parse");
        assert!(matches!(
            d.initial_policy(),
            Policy::Dolphin(DolphinConfig {
                fallback: FallbackKind::AlwaysRemote,
                ..
            })
        ));
        assert!(parse(&["--fallback-policy", "dolphin"]).is_err());
        assert!(parse(&["--tokenizer", "gpt"]).is_err());
        // Tool call parsers by vLLM's names.
        use crate::tools::ToolCallParser;
        let parser = |name: &str| parse(&["--tool-call-parser", name]).map(|c| c.tool_call_parser);
        assert_eq!(parser("hermes").ok(), Some(Some(ToolCallParser::Hermes)));
        assert_eq!(
            parser("llama3_json").ok(),
            Some(Some(ToolCallParser::Llama3Json))
        );
        assert_eq!(parser("mistral").ok(), Some(Some(ToolCallParser::Mistral)));
        assert_eq!(
            parser("pythonic").ok(),
            Some(Some(ToolCallParser::Pythonic))
        );
        assert!(parser("qwen3_coder").is_err());
        use crate::reasoning::ReasoningParser;
        let thinking =
            |name: &str| parse(&["--reasoning-parser", name]).map(|c| c.reasoning_parser);
        assert_eq!(
            thinking("deepseek_r1").ok(),
            Some(Some(ReasoningParser::DeepseekR1))
        );
        assert_eq!(thinking("qwen3").ok(), Some(Some(ReasoningParser::Qwen3)));
        assert!(thinking("o1").is_err());
        assert_eq!(d.tool_call_parser, None);
    }

    #[test]
    fn validation_catches_bad_values() {
        let invalid = |args: &[&str]| parse(args).expect("parse").validate().is_err();
        assert!(invalid(&[]));
        assert!(invalid(&["--decode", "a:1", "--max-local-ratio", "0"]));
        assert!(invalid(&["--decode", "a:1", "--max-local-ratio", "1.5"]));
        assert!(invalid(&["--decode", "a:1", "--prefill-busy-threshold=-1"]));
        assert!(invalid(&[
            "--decode",
            "a:1",
            "--decode-busy-threshold",
            "1.5"
        ]));
        assert!(!invalid(&[
            "--decode",
            "a:1",
            "--decode-busy-threshold",
            "0.9"
        ]));
        assert!(invalid(&["--decode", "a:1", "--overlap-weight=-1"]));
        assert!(invalid(&["--decode", "a:1", "--overlap-weight", "NaN"]));
        assert!(invalid(&["--decode", "a:1", "--block-size", "0"]));
        assert!(invalid(&["--decode", "a:1", "--max-output-tokens", "0"]));
        assert!(invalid(&["--etcd", "http://a:1", "--decode", "a:1"]));
        assert!(invalid(&["--decode", "a:1", "--model", " "]));
        assert!(!invalid(&["--static-workers", "/tmp/w.json"]));
        assert!(invalid(&["--decode", "a:1", "--tokenizer", "gguf"]));
        assert!(invalid(&[
            "--decode",
            "a:1",
            "--cors-allowed-origins",
            "app.example"
        ]));
        assert!(!invalid(&[
            "--decode",
            "a:1",
            "--cors-allowed-origins",
            "https://app.example,http://localhost:3000"
        ]));
    }

    #[test]
    fn served_model_follows_the_model_file() {
        let c = parse(&["--decode", "a:1"]).expect("parse");
        assert_eq!(c.served_model(), "sim-model");
        let c = parse(&[
            "--decode",
            "a:1",
            "--tokenizer",
            "gguf",
            "--model-path",
            "/m/Small.Q8_0.gguf",
        ])
        .expect("parse");
        c.validate().expect("valid");
        assert_eq!(c.served_model(), "Small.Q8_0");
        let c = parse(&[
            "--decode",
            "a:1",
            "--tokenizer",
            "gguf",
            "--model-path",
            "/m/x.gguf",
            "--model",
            "m",
        ])
        .expect("parse");
        assert_eq!(c.served_model(), "m");
    }
}

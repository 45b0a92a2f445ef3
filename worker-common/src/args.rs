//! Flags both worker binaries take (flattened into each binary's config). The names are part of
//! the contract (`docs/dev/contracts.md`): tests and dolphinctl pass them.

use std::{net::SocketAddr, time::Duration};

use clap::{Args, ValueEnum};
use dolphin_cluster::{EtcdConfig, Role, WorkerId};

use crate::error::ConfigError;

/// Which engine implementation serves requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    /// Simulated engine: timing from a profile, deterministic tokens, real KV bytes.
    Sim,
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
    /// KV blocks in the engine's pool.
    #[arg(long, env = "DOLPHIN_TOTAL_BLOCKS", default_value_t = 8192)]
    pub total_blocks: u32,
    /// Most tokens one engine step processes (prefill chunks plus decodes).
    #[arg(long, env = "DOLPHIN_MAX_BATCHED_TOKENS", default_value_t = 2048)]
    pub max_batched_tokens: u32,
    /// Most requests queued for admission; more are refused (RESOURCE_EXHAUSTED).
    #[arg(long, env = "DOLPHIN_MAX_WAITING", default_value_t = 256)]
    pub max_waiting: u32,
    /// Name of the model served.
    #[arg(long, env = "DOLPHIN_MODEL", default_value = "sim-model")]
    pub model: String,
}

impl EngineArgs {
    /// Checks ranges the engine would otherwise reject later, or worse, accept.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.block_size == 0 {
            return Err(ConfigError::invalid("block-size", "must be at least 1"));
        }
        if self.total_blocks == 0 {
            return Err(ConfigError::invalid("total-blocks", "must be at least 1"));
        }
        if self.max_batched_tokens == 0 {
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
        if self.model.trim().is_empty() {
            return Err(ConfigError::invalid("model", "must not be empty"));
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
}

impl CommonArgs {
    /// Checks every flag; the process exits 64 on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.engine.validate()?;
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
        Ok(())
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
        })
    }

    /// The drain grace period.
    pub fn drain_grace(&self) -> Duration {
        Duration::from_secs(self.drain_grace_secs)
    }
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
        assert_eq!(args.engine.model, "sim-model");
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
        assert!(parse(&["--engine", "candle"]).is_err(), "not built yet");
    }
}

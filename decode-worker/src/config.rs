//! The decode worker's command line.

use std::{net::SocketAddr, time::Duration};

use clap::Parser;
use dolphin_cluster::Advertise;
use dolphin_handoff::AlgorithmSpec;
use dolphin_worker_common::args::{check_advertised, parse_advertise};
use dolphin_worker_common::{CommonArgs, ConfigError};

use crate::group::{BatchWaitMode, GroupArgs, SubserverSpec, check_sources};

/// `dolphin-decode-worker`: decodes requests, prefilling locally or through a prefill worker.
#[derive(Debug, Clone, Parser)]
#[command(name = "dolphin-decode-worker", version, about)]
pub struct DecodeConfig {
    /// Flags every worker takes.
    #[command(flatten)]
    pub common: CommonArgs,
    /// KV transfer listener: prefill workers push blocks here (port 0 allowed).
    #[arg(long, env = "DOLPHIN_KV_ADDR", default_value = "127.0.0.1:0")]
    pub kv_addr: SocketAddr,
    /// Address published for the KV transfer listener (host, or host:port). Default: the host
    /// of --advertise-addr with the bound KV port, else the bound address.
    #[arg(long, env = "DOLPHIN_KV_ADVERTISE_ADDR")]
    pub kv_advertise_addr: Option<String>,
    /// How long a remote prefill may take before the worker prefills locally instead, unless
    /// the request sets its own timeout.
    #[arg(long, env = "DOLPHIN_PREFILL_TIMEOUT_MS", default_value_t = 30_000)]
    pub prefill_timeout_ms: u64,
    /// Serve a model group: a subserver `NAME=PATH[,layers=N]` (PATH: a GGUF file for candle,
    /// a sim profile for the sim engine; `layers=N`: an early-exit copy, the first N layers).
    /// Give it twice or more, small model first. Env: `;`-separated.
    #[arg(long = "subserver", env = "DOLPHIN_SUBSERVERS", value_delimiter = ';')]
    pub subservers: Vec<SubserverSpec>,
    /// The model group's served name (with --subserver).
    #[arg(long, env = "DOLPHIN_GROUP_NAME", default_value = "model-group")]
    pub group_name: String,
    /// Default handoff algorithm of a model group, with parameters:
    /// `entropy` (alias `r-stitch`), `confidence` (`co-llm`), `momentum` (`r2r`), `ensemble`,
    /// `always-small`, `always-large`, `random`; e.g. `entropy:threshold=2.5,span=4`.
    #[arg(long, env = "DOLPHIN_HANDOFF", default_value = "entropy")]
    pub handoff: AlgorithmSpec,
    /// Delayed batching of a model group's subservers: `auto` (B chosen by the Markov-chain
    /// model from measured step times and handoff rates) or a batch size B for all.
    #[arg(long, env = "DOLPHIN_BATCH_WAIT", default_value = "1")]
    pub batch_wait: BatchWaitMode,
    /// The longest delayed batching holds a ready request, in milliseconds.
    #[arg(long, env = "DOLPHIN_BATCH_MAX_WAIT_MS", default_value_t = 20)]
    pub batch_max_wait_ms: u64,
    /// Keep a group's paused subservers within this many tokens of the active one (their KV is
    /// computed in the background, so a handoff catches up less); 0: only at handoffs.
    #[arg(long, env = "DOLPHIN_KV_SYNC_TOKENS", default_value_t = 0)]
    pub kv_sync_tokens: u32,
}

impl DecodeConfig {
    /// Checks every flag; the process exits 64 on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.common.validate()?;
        check_advertised(
            self.kv_addr,
            self.kv_advertise()?.as_ref(),
            "kv-addr",
            "KV transfer",
        )?;
        if self.prefill_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "prefill-timeout-ms",
                "must be at least 1",
            ));
        }
        if self.subservers.len() == 1 {
            return Err(ConfigError::invalid(
                "subserver",
                "a model group needs at least two subservers",
            ));
        }
        check_sources(self.common.engine.engine, &self.subservers)?;
        Ok(())
    }

    /// The model group the flags describe, if any.
    pub fn group(&self) -> Option<GroupArgs> {
        (self.subservers.len() >= 2).then(|| GroupArgs {
            name: self.group_name.clone(),
            subservers: self.subservers.clone(),
            handoff: self.handoff.clone(),
            batch_wait: self.batch_wait,
            max_wait: Duration::from_millis(self.batch_max_wait_ms),
            sync_tokens: self.kv_sync_tokens,
        })
    }

    /// The KV listener's advertise address: `--kv-advertise-addr`, else the host of
    /// `--advertise-addr`.
    pub fn kv_advertise(&self) -> Result<Option<Advertise>, ConfigError> {
        let own = parse_advertise(
            self.kv_advertise_addr.as_deref(),
            "kv-advertise-addr",
            "KV transfer",
        )?;
        Ok(match own {
            Some(a) => Some(a),
            None => self.common.advertise()?.map(|a| a.host_only()),
        })
    }

    /// The default remote prefill timeout.
    pub fn prefill_timeout(&self) -> Duration {
        Duration::from_millis(self.prefill_timeout_ms)
    }
}

impl dolphin_worker_common::WorkerConfig for DecodeConfig {
    fn common(&self) -> &CommonArgs {
        &self.common
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_decode_flags() {
        let cfg = DecodeConfig::try_parse_from([
            "dolphin-decode-worker",
            "--grpc-addr",
            "127.0.0.1:0",
            "--kv-addr",
            "127.0.0.1:0",
            "--prefill-timeout-ms",
            "1500",
        ])
        .expect("parses");
        cfg.validate().expect("valid");
        assert_eq!(cfg.prefill_timeout(), Duration::from_millis(1500));
        assert_eq!(cfg.kv_addr.port(), 0);
    }

    #[test]
    fn kv_advertise_defaults_to_the_advertise_host() {
        let parse = |args: &[&str]| {
            DecodeConfig::try_parse_from(
                std::iter::once("dolphin-decode-worker").chain(args.iter().copied()),
            )
            .expect("parses")
        };
        let cfg = parse(&[
            "--grpc-addr=0.0.0.0:7000",
            "--kv-addr=0.0.0.0:7001",
            "--advertise-addr=10.0.0.7:9000",
        ]);
        cfg.validate().expect("valid");
        let kv = cfg.kv_advertise().expect("parses").expect("derived");
        assert_eq!(kv.with_port(7001), "10.0.0.7:7001");
        let own = parse(&[
            "--kv-addr=0.0.0.0:7001",
            "--kv-advertise-addr=kv.example:7100",
        ]);
        own.validate().expect("valid");
        assert_eq!(
            own.kv_advertise()
                .expect("parses")
                .expect("given")
                .with_port(7001),
            "kv.example:7100"
        );
        // A KV listener on 0.0.0.0 with nothing to advertise is refused before anything starts.
        let bare = parse(&["--kv-addr=0.0.0.0:7001"]);
        assert!(matches!(
            bare.validate(),
            Err(ConfigError::Invalid {
                flag: "kv-addr",
                ..
            })
        ));
    }

    #[test]
    fn parses_a_model_group() {
        let cfg = DecodeConfig::try_parse_from([
            "dolphin-decode-worker",
            "--subserver",
            "small=dynamo-mocker",
            "--subserver",
            "large=qwen72b-h20",
            "--group-name",
            "duo",
            "--handoff",
            "confidence:threshold=0.4",
            "--batch-wait",
            "auto",
        ])
        .expect("parses");
        cfg.validate().expect("valid");
        let g = cfg.group().expect("a group");
        assert_eq!(g.subservers.len(), 2);
        assert_eq!(g.subservers[0].name, "small");
        assert_eq!(g.batch_wait, BatchWaitMode::Auto);
        assert_eq!(g.handoff.to_string(), "confidence:threshold=0.4");
        let one = DecodeConfig::try_parse_from(["dolphin-decode-worker", "--subserver", "a=x"])
            .expect("parses");
        assert!(one.validate().is_err(), "one subserver is not a group");
        assert!(
            DecodeConfig::try_parse_from(["dolphin-decode-worker", "--subserver", "nopath"])
                .is_err()
        );
        assert!(
            DecodeConfig::try_parse_from(["dolphin-decode-worker", "--handoff", "nonsense"])
                .is_err()
        );
    }

    #[test]
    fn defaults_and_zero_timeout() {
        let cfg = DecodeConfig::try_parse_from(["dolphin-decode-worker"]).expect("parses");
        assert_eq!(cfg.prefill_timeout(), Duration::from_secs(30));
        let zero =
            DecodeConfig::try_parse_from(["dolphin-decode-worker", "--prefill-timeout-ms", "0"])
                .expect("parses");
        assert!(matches!(
            zero.validate(),
            Err(ConfigError::Invalid {
                flag: "prefill-timeout-ms",
                ..
            })
        ));
    }
}

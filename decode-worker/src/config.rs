//! The decode worker's command line.

use std::{net::SocketAddr, time::Duration};

use clap::Parser;
use dolphin_worker_common::{CommonArgs, ConfigError};

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
    /// How long a remote prefill may take before the worker prefills locally instead, unless
    /// the request sets its own timeout.
    #[arg(long, env = "DOLPHIN_PREFILL_TIMEOUT_MS", default_value_t = 30_000)]
    pub prefill_timeout_ms: u64,
}

impl DecodeConfig {
    /// Checks every flag; the process exits 64 on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.common.validate()?;
        if self.prefill_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "prefill-timeout-ms",
                "must be at least 1",
            ));
        }
        Ok(())
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

//! The prefill worker's command line.

use clap::Parser;
use dolphin_worker_common::{CommonArgs, ConfigError};

/// `dolphin-prefill-worker`: computes prompts' KV and pushes it to decode workers.
#[derive(Debug, Clone, Parser)]
#[command(name = "dolphin-prefill-worker", version, about)]
pub struct PrefillConfig {
    /// Flags every worker takes.
    #[command(flatten)]
    pub common: CommonArgs,
}

impl PrefillConfig {
    /// Checks every flag; the process exits 64 on an error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.common.validate()
    }
}

impl dolphin_worker_common::WorkerConfig for PrefillConfig {
    fn common(&self) -> &CommonArgs {
        &self.common
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_contract_flags() {
        let cfg = PrefillConfig::try_parse_from([
            "dolphin-prefill-worker",
            "--grpc-addr",
            "127.0.0.1:0",
            "--sim-time-scale",
            "0",
            "--worker-id",
            "prefill-1",
        ])
        .expect("parses");
        cfg.validate().expect("valid");
        assert_eq!(cfg.common.worker_id.as_deref(), Some("prefill-1"));
    }

    #[test]
    fn refuses_decode_only_flags() {
        for flag in ["--kv-addr", "--prefill-timeout-ms"] {
            let parsed = PrefillConfig::try_parse_from(["dolphin-prefill-worker", flag, "1"]);
            assert!(parsed.is_err(), "{flag} belongs to the decode worker");
        }
    }
}

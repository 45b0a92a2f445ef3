//! Building the engine a worker serves from its flags.

use std::sync::Arc;

use dolphin_engine::{Engine, SimConfig, SimProfile, sim_engine};

use crate::{
    args::{EngineArgs, EngineKind},
    error::{ConfigError, WorkerError},
};

/// The engine the flags describe, started (its scheduler runs on the current Tokio runtime).
pub fn build_engine(args: &EngineArgs) -> Result<Arc<dyn Engine>, WorkerError> {
    args.validate()?;
    match args.engine {
        EngineKind::Sim => {
            let cfg = sim_config(args)?;
            tracing::info!(
                profile = %cfg.profile.name,
                time_scale = cfg.time_scale,
                byte_scale = cfg.byte_scale,
                total_blocks = cfg.total_blocks,
                block_size = cfg.block_size,
                "starting the sim engine"
            );
            sim_engine(cfg).map_err(WorkerError::Engine)
        }
    }
}

/// The sim engine's configuration for the flags: the profile (shipped name or JSON path) and
/// the sizes given; vocabulary and context keep the sim's defaults.
pub fn sim_config(args: &EngineArgs) -> Result<SimConfig, ConfigError> {
    let profile = SimProfile::load(&args.sim_profile).map_err(|source| ConfigError::Profile {
        name: args.sim_profile.clone(),
        source: Box::new(source),
    })?;
    let mut cfg = SimConfig::new(profile);
    cfg.model = args.model.clone();
    cfg.time_scale = args.sim_time_scale;
    cfg.byte_scale = args.sim_byte_scale;
    cfg.total_blocks = args.total_blocks;
    cfg.block_size = args.block_size;
    cfg.max_batched_tokens = args.max_batched_tokens;
    cfg.max_waiting = args.max_waiting;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    fn args(extra: &[&str]) -> EngineArgs {
        Cli::try_parse_from(std::iter::once("w").chain(extra.iter().copied()))
            .expect("parses")
            .engine
    }

    #[test]
    fn flags_reach_the_sim_config() {
        let cfg = sim_config(&args(&[
            "--sim-profile",
            "qwen72b-h20",
            "--sim-time-scale",
            "0",
            "--block-size",
            "32",
            "--total-blocks",
            "77",
            "--model",
            "m1",
        ]))
        .expect("valid");
        assert_eq!(cfg.profile.name, "qwen72b-h20");
        assert_eq!(cfg.time_scale, 0.0);
        assert_eq!(cfg.block_size, 32);
        assert_eq!(cfg.total_blocks, 77);
        assert_eq!(cfg.model, "m1");
    }

    #[test]
    fn unknown_profile_is_a_config_error() {
        let err = sim_config(&args(&["--sim-profile", "/nonexistent/profile.json"]))
            .expect_err("no such profile");
        assert!(matches!(err, ConfigError::Profile { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn builds_a_serving_engine() {
        let engine = build_engine(&args(&["--sim-time-scale", "0", "--model", "m2"]))
            .expect("engine starts");
        let info = engine.info();
        assert_eq!(info.engine, "sim");
        assert_eq!(info.model, "m2");
        assert_eq!(info.block_size, 16);
    }
}

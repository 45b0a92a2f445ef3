//! Building the engine a worker serves from its flags.

use std::path::PathBuf;
use std::sync::Arc;

use dolphin_engine::candle::{CandleConfig, candle_engine};
use dolphin_engine::{Engine, SimConfig, SimProfile, sim_engine};
use dolphin_tokenizer::{ModelTokenizer, SMOLLM2_FILE, find_model, model_dir};

use crate::{
    args::{EngineArgs, EngineKind},
    error::{ConfigError, WorkerError},
    stop_tokens::WithStopTokens,
};

/// The engine the flags describe, started. The sim's scheduler runs on the current Tokio
/// runtime; candle's on a dedicated thread (loading the model blocks the caller for seconds).
pub fn build_engine(args: &EngineArgs) -> Result<Arc<dyn Engine>, WorkerError> {
    args.validate()?;
    match args.engine {
        EngineKind::Candle => {
            let mut cfg = candle_config(args)?;
            // The model's end-of-generation tokens (the wire cannot carry them; see
            // stop_tokens.rs), read from the same file's tokenizer metadata; the engine's
            // structured output builds its token space from the same read.
            let tokenizer = ModelTokenizer::from_file(&cfg.model_path).map_err(|e| {
                ConfigError::invalid(
                    "model-path",
                    format!(
                        "cannot read the tokenizer of {}: {}",
                        cfg.model_path.display(),
                        crate::error_chain(&e)
                    ),
                )
            })?;
            let stops = tokenizer.stop_token_ids().to_vec();
            cfg.tokenizer = Some(Arc::new(tokenizer));
            tracing::info!(
                path = %cfg.model_path.display(),
                model = %cfg.model,
                weights = %cfg.weights,
                threads = ?cfg.threads,
                kv_bytes = cfg.kv_bytes,
                ?stops,
                "starting the candle engine"
            );
            let engine = candle_engine(cfg).map_err(WorkerError::Engine)?;
            Ok(Arc::new(WithStopTokens::new(engine, stops)))
        }
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

/// Where the candle engine looks for its model without `--model-path`: SmolLM2 in the model
/// directory (`$DOLPHIN_MODEL_DIR`, else `~/.cache/dolphin/models`), where
/// `scripts/fetch-model.sh` puts it.
pub fn default_model_path() -> PathBuf {
    find_model(SMOLLM2_FILE).unwrap_or_else(|| {
        model_dir()
            .unwrap_or_else(|| PathBuf::from("."))
            .join(SMOLLM2_FILE)
    })
}

/// The candle engine's configuration for the flags. A missing model file is a configuration
/// error naming the fetch script.
pub fn candle_config(args: &EngineArgs) -> Result<CandleConfig, ConfigError> {
    let path = args.model_path.clone().unwrap_or_else(default_model_path);
    if !path.is_file() {
        return Err(ConfigError::invalid(
            "model-path",
            format!(
                "{} is not a file (run scripts/fetch-model.sh, or pass a llama-architecture GGUF)",
                path.display()
            ),
        ));
    }
    let mut cfg = CandleConfig::new(path);
    if let Some(model) = &args.model {
        cfg.model = model.clone();
    }
    cfg.weights = args.weights;
    cfg.padding = args.padding;
    cfg.matmul = args.matmul;
    cfg.device = args.device;
    cfg.block_size = args.block_size;
    cfg.kv_bytes = args.kv_bytes;
    if let Some(n) = args.max_batched_tokens {
        cfg.max_batched_tokens = n;
    }
    if let Some(n) = args.prefill_chunk_tokens {
        cfg.prefill_chunk_tokens = n;
    }
    if let Some(n) = args.mixed_prefill_tokens {
        cfg.mixed_prefill_tokens = n;
    }
    cfg.max_waiting = args.max_waiting;
    cfg.policy = args.scheduling_policy;
    cfg.threads = args.threads;
    cfg.max_context = args.max_context;
    Ok(cfg)
}

/// The sim engine's configuration for the flags: the profile (shipped name or JSON path), the
/// sizes given and the context (`--max-context`, else the sim's default); the vocabulary keeps
/// the sim's default.
pub fn sim_config(args: &EngineArgs) -> Result<SimConfig, ConfigError> {
    let profile = SimProfile::load(&args.sim_profile).map_err(|source| ConfigError::Profile {
        name: args.sim_profile.clone(),
        source: Box::new(source),
    })?;
    let mut cfg = SimConfig::new(profile);
    cfg.model = args.model.clone().unwrap_or_else(|| "sim-model".into());
    cfg.time_scale = args.sim_time_scale;
    cfg.byte_scale = args.sim_byte_scale;
    cfg.total_blocks = args.total_blocks;
    cfg.block_size = args.block_size;
    if let Some(n) = args.max_batched_tokens {
        cfg.max_batched_tokens = n;
    }
    if let Some(n) = args.prefill_chunk_tokens {
        cfg.prefill_chunk_tokens = n;
    }
    if let Some(n) = args.mixed_prefill_tokens {
        cfg.mixed_prefill_tokens = n;
    }
    cfg.max_waiting = args.max_waiting;
    cfg.policy = args.scheduling_policy;
    if let Some(n) = args.max_context {
        cfg.context_length = n;
    }
    Ok(cfg)
}

/// Fixes the candle engine's compute thread count. Call it first thing in `main`, before the
/// async runtime starts: it sets process environment variables, which is only sound while no
/// other thread runs. A no-op for the sim engine.
pub fn configure_compute_threads(args: &EngineArgs) -> Result<(), ConfigError> {
    if args.engine != EngineKind::Candle {
        return Ok(());
    }
    dolphin_engine::candle::configure_threads(args.threads)
        .map(|_| ())
        .map_err(|e| ConfigError::invalid("threads", e.to_string()))
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
            "--max-context",
            "640",
        ]))
        .expect("valid");
        assert_eq!(cfg.context_length, 640);
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

    #[test]
    fn flags_reach_the_candle_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("Tiny-Model.Q8_0.gguf");
        std::fs::write(&path, b"not read here").expect("write");
        let p = path.to_str().expect("utf-8 path");
        let cfg = candle_config(&args(&[
            "--engine",
            "candle",
            "--model-path",
            p,
            "--weights",
            "f32",
            "--threads",
            "1",
            "--kv-bytes",
            "1MiB",
            "--block-size",
            "32",
            "--max-context",
            "256",
        ]))
        .expect("valid");
        assert_eq!(cfg.model, "Tiny-Model.Q8_0", "named after the file");
        assert_eq!(cfg.weights, dolphin_engine::candle::WeightFormat::F32);
        assert_eq!(cfg.threads, Some(1));
        assert_eq!(cfg.kv_bytes, 1 << 20);
        assert_eq!(cfg.block_size, 32);
        assert_eq!(cfg.max_context, Some(256));
        assert_eq!(
            cfg.max_batched_tokens,
            CandleConfig::new(&path).max_batched_tokens,
            "candle's own default"
        );
        let named = candle_config(&args(&["--model-path", p, "--model", "m"])).expect("valid");
        assert_eq!(named.model, "m");
    }

    #[test]
    fn a_missing_model_file_names_the_flag() {
        let err = candle_config(&args(&["--model-path", "/nonexistent/m.gguf"]))
            .expect_err("no such file");
        assert!(
            matches!(&err, ConfigError::Invalid { flag: "model-path", reason } if reason.contains("fetch-model")),
            "{err:?}"
        );
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

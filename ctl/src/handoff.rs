//! `dolphinctl handoff`: tools for model groups' token-level handoffs.
//!
//! - `plan`: the delayed-batching B per subserver that the Markov-chain model predicts to
//!   maximize steady-state throughput, from step-time profiles (sim profiles, or step times
//!   measured per batch size) and handoff rates; prints the choice, its predicted throughput and
//!   the best candidates.
//! - `calibrate`: the confidence gate's threshold that sends a target share of tokens to the
//!   large model (Co-LLM style): the small model decodes a sample of prompts and the threshold is
//!   the quantile of its top-token probabilities.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use dolphin_engine::SimProfile;
use dolphin_engine::candle::{CandleConfig, candle_engine};
use dolphin_handoff::algorithms::calibrate_threshold;
use dolphin_handoff::plan::{ChainSpec, StepProfile, plan};
use dolphin_handoff::probe::step_stats;
use dolphin_handoff::samples::PROMPTS;
use dolphin_tokenizer::ModelTokenizer;

use crate::error::CtlError;

/// `dolphinctl handoff`.
#[derive(Clone, Debug, Args)]
pub struct HandoffArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: HandoffCommand,
}

/// The handoff subcommands.
#[derive(Clone, Debug, Subcommand)]
pub enum HandoffCommand {
    /// Choose each subserver's delayed-batching B with the Markov-chain model.
    Plan(PlanArgs),
    /// Set the confidence gate's threshold for a target share of large-model tokens.
    Calibrate(CalibrateArgs),
}

/// `dolphinctl handoff plan`.
#[derive(Clone, Debug, Args)]
pub struct PlanArgs {
    /// The small model's step times: a sim profile (name or JSON file), or measured ms per
    /// batch size `1,2,...` (e.g. `8.1,8.3,8.6`).
    #[arg(long)]
    pub small: String,
    /// The large model's step times, as for --small.
    #[arg(long)]
    pub large: String,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    pub concurrency: u32,
    /// Per-token chance that the small model hands off (measured: handoffs / its steps).
    #[arg(long, default_value_t = 0.1)]
    pub to_large: f64,
    /// Per-token chance that the large model hands back.
    #[arg(long, default_value_t = 0.75)]
    pub to_small: f64,
    /// The delayed-batching wait bound, ms (as the worker's --batch-max-wait-ms).
    #[arg(long, default_value_t = 20.0)]
    pub max_wait_ms: f64,
    /// Largest B tried.
    #[arg(long, default_value_t = 8)]
    pub max_b: u32,
    /// KV occupancy at which sim profiles' decode times are read (0..1).
    #[arg(long, default_value_t = 0.1)]
    pub occupancy: f64,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `dolphinctl handoff calibrate`.
#[derive(Clone, Debug, Args)]
pub struct CalibrateArgs {
    /// The small model: a llama-architecture GGUF file.
    #[arg(long, env = "DOLPHIN_MODEL_PATH")]
    pub model_path: PathBuf,
    /// Early exit: the small model is the file's first N layers (as `--subserver ...,layers=N`).
    #[arg(long)]
    pub layers: Option<u32>,
    /// Share of tokens the large model should write (0..1).
    #[arg(long, default_value_t = 0.3)]
    pub share: f64,
    /// Tokens decoded per sample prompt.
    #[arg(long, default_value_t = 32)]
    pub tokens: u32,
    /// Sample prompts, one per line (default: the built-in sample of 36).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
}

/// Why a handoff command failed.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// A step-time argument is neither a profile nor a list of numbers.
    #[error("{flag}: {value:?} is neither a sim profile nor a list of step times in ms")]
    Steps {
        /// The flag.
        flag: &'static str,
        /// What was given.
        value: String,
    },
    /// The planner refused the inputs.
    #[error("plan: {0}")]
    Plan(#[from] dolphin_handoff::plan::PlanError),
    /// The model could not be loaded or run.
    #[error("calibrate: {0}")]
    Engine(#[from] dolphin_engine::EngineError),
    /// The prompts file or the tokenizer could not be read.
    #[error("calibrate: {0}")]
    Input(String),
    /// No confidence was measured.
    #[error("calibrate: the sample produced no tokens")]
    Empty,
}

/// Runs a handoff subcommand.
pub async fn run(args: HandoffArgs, out: &mut impl Write) -> Result<(), CtlError> {
    let result = match args.command {
        HandoffCommand::Plan(a) => plan_cmd(&a, out),
        HandoffCommand::Calibrate(a) => calibrate(&a, out).await,
    };
    result.map_err(|e| CtlError::Handoff(Box::new(e)))
}

/// Step times of one subserver for batches `1..=n`.
fn steps(
    flag: &'static str,
    value: &str,
    n: u32,
    occupancy: f64,
) -> Result<StepProfile, HandoffError> {
    let listed: Result<Vec<f64>, _> = value.split(',').map(|v| v.trim().parse::<f64>()).collect();
    if let Ok(step_ms) = listed {
        return Ok(StepProfile { step_ms });
    }
    let p = SimProfile::load(value).map_err(|_| HandoffError::Steps {
        flag,
        value: value.into(),
    })?;
    Ok(StepProfile {
        step_ms: (1..=n.max(1)).map(|b| p.decode_ms(b, occupancy)).collect(),
    })
}

fn plan_cmd(a: &PlanArgs, out: &mut impl Write) -> Result<(), HandoffError> {
    let spec = ChainSpec {
        concurrency: a.concurrency,
        profiles: [
            steps("--small", &a.small, a.concurrency, a.occupancy)?,
            steps("--large", &a.large, a.concurrency, a.occupancy)?,
        ],
        handoff: [a.to_large, a.to_small],
        drop_on_handoff: [true, false],
        max_wait_ms: [a.max_wait_ms, a.max_wait_ms],
        max_batch: [None, None],
        tick_ms: 1.0,
    }
    .with_auto_tick();
    let p = plan(&spec, a.max_b)?;
    if a.json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&p).unwrap_or_default()
        );
        return Ok(());
    }
    let b = p.best.batch_wait;
    let _ = writeln!(
        out,
        "batch wait: small B={}, large B={} (--batch-wait on the worker: auto plans the same way)",
        b[0], b[1]
    );
    let _ = writeln!(
        out,
        "predicted: {:.1} tok/s at concurrency {}, {:.1}% of tokens by the large model, mean batch {:.2} / {:.2}",
        p.best.tokens_per_s,
        a.concurrency,
        100.0 * p.best.token_share[1],
        p.best.mean_batch[0],
        p.best.mean_batch[1]
    );
    let mut ranked: Vec<_> = p.candidates.iter().collect();
    ranked.sort_by(|x, y| y.tokens_per_s.total_cmp(&x.tokens_per_s));
    let _ = writeln!(out, "{:>8} {:>8} {:>10}", "small B", "large B", "tok/s");
    for c in ranked.iter().take(5) {
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:>10.1}",
            c.batch_wait[0], c.batch_wait[1], c.tokens_per_s
        );
    }
    if let Some(one) = p.candidates.iter().find(|c| c.batch_wait == [1, 1]) {
        let _ = writeln!(out, "B=1 for both: {:.1} tok/s", one.tokens_per_s);
    }
    Ok(())
}

async fn calibrate(a: &CalibrateArgs, out: &mut impl Write) -> Result<(), HandoffError> {
    let tok = ModelTokenizer::from_file(&a.model_path)
        .map_err(|e| HandoffError::Input(format!("{}: {e}", a.model_path.display())))?;
    let prompts: Vec<String> = match &a.prompts {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| HandoffError::Input(format!("{}: {e}", path.display())))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect(),
        None => PROMPTS.iter().map(|p| (*p).to_owned()).collect(),
    };
    let mut cfg = CandleConfig::new(&a.model_path);
    cfg.layers = a.layers;
    let engine = {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || candle_engine(cfg))
            .await
            .map_err(|e| HandoffError::Input(e.to_string()))??
    };
    let engine: Arc<dyn dolphin_engine::Engine> = engine;
    let mut confidences = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let ids = tok
            .encode(p)
            .map_err(|e| HandoffError::Input(format!("prompt {i}: {e}")))?;
        if ids.is_empty() {
            continue;
        }
        let stats = step_stats(&engine, &format!("calibrate-{i}"), &ids, a.tokens).await?;
        confidences.extend(stats.iter().map(|(_, s)| s.prob));
    }
    let threshold = calibrate_threshold(&confidences, a.share).ok_or(HandoffError::Empty)?;
    let below = confidences.iter().filter(|&&c| c < threshold).count();
    let _ = writeln!(
        out,
        "threshold {threshold:.4}: {below} of {} sampled tokens ({:.1}%) fall below it",
        confidences.len(),
        100.0 * below as f64 / confidences.len() as f64
    );
    let _ = writeln!(out, "--handoff confidence:threshold={threshold:.4}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(small: &str, large: &str) -> PlanArgs {
        PlanArgs {
            small: small.into(),
            large: large.into(),
            concurrency: 4,
            to_large: 0.1,
            to_small: 0.75,
            max_wait_ms: 20.0,
            max_b: 4,
            occupancy: 0.1,
            json: false,
        }
    }

    #[test]
    fn plans_from_profiles_and_measured_steps() {
        let mut out = Vec::new();
        plan_cmd(&args("qwen3-0.6b-a100", "qwen3-32b-2xa100"), &mut out).expect("plan");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.starts_with("batch wait: small B="), "{text}");
        assert!(text.contains("predicted: "), "{text}");
        let mut out = Vec::new();
        plan_cmd(&args("4,4.2,4.4,4.6", "30,31,32,33"), &mut out).expect("plan");
        assert!(String::from_utf8(out).expect("utf-8").contains("tok/s"));
    }

    #[test]
    fn bad_step_times_are_named() {
        let err = plan_cmd(&args("no-such-profile", "30"), &mut Vec::new()).expect_err("refused");
        assert!(err.to_string().contains("--small"), "{err}");
    }
}

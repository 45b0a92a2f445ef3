//! A decode worker serving a model group (`--subserver` given twice or more): each subserver is
//! an engine built from the worker's engine flags with its own model file (candle; `layers=N`
//! cuts an early-exit copy) or sim profile, put behind one [`ModelGroup`] with the `--handoff`
//! algorithm as default, and delayed batching as `--batch-wait` says (`auto`: re-planned from the
//! measured step times and handoff rates by the Markov-chain model).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use dolphin_engine::candle::candle_engine;
use dolphin_engine::{BatchWait, Engine, SimProfile, sim_engine};
use dolphin_handoff::plan::{ChainSpec, StepProfile, plan};
use dolphin_handoff::{AlgorithmSpec, GroupOptions, ModelGroup, Subserver};
use dolphin_worker_common::engine::{candle_config, sim_config};
use dolphin_worker_common::{ConfigError, EngineArgs, EngineKind, WithStopTokens, WorkerError};

/// One `--subserver NAME=PATH[,layers=N]`: PATH is a GGUF file (candle) or a sim profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubserverSpec {
    /// Name in usage and metrics.
    pub name: String,
    /// Model file (candle) or profile name or file (sim).
    pub source: String,
    /// Early exit after this many layers (candle).
    pub layers: Option<u32>,
}

impl FromStr for SubserverSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (head, rest) = s.split_once(',').unwrap_or((s, ""));
        let (name, source) = head
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected NAME=PATH[,layers=N]"))?;
        if name.is_empty() || source.is_empty() {
            return Err(format!("{s:?}: expected NAME=PATH[,layers=N]"));
        }
        let mut layers = None;
        for kv in rest.split(',').filter(|p| !p.is_empty()) {
            match kv.split_once('=') {
                Some(("layers", n)) => {
                    let n: u32 = n
                        .parse()
                        .map_err(|_| format!("{s:?}: layers must be a positive integer"))?;
                    if n == 0 {
                        return Err(format!("{s:?}: layers must be at least 1"));
                    }
                    layers = Some(n);
                }
                _ => return Err(format!("{s:?}: unknown option {kv:?} (expected layers=N)")),
            }
        }
        Ok(Self {
            name: name.into(),
            source: source.into(),
            layers,
        })
    }
}

/// `--batch-wait`: `auto`, or B for every subserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchWaitMode {
    /// Planned by the Markov-chain model from measurements, re-planned periodically.
    Auto,
    /// This B on every subserver (1: no waiting).
    Fixed(u32),
}

impl FromStr for BatchWaitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Self::Fixed(n)),
            _ => Err(format!(
                "{s:?}: expected auto or a batch size of at least 1"
            )),
        }
    }
}

/// What a group needs from the flags.
#[derive(Clone, Debug)]
pub struct GroupArgs {
    /// The group's served model name.
    pub name: String,
    /// Its subservers, small first.
    pub subservers: Vec<SubserverSpec>,
    /// Default algorithm.
    pub handoff: AlgorithmSpec,
    /// Delayed batching.
    pub batch_wait: BatchWaitMode,
    /// The wait bound of delayed batching.
    pub max_wait: Duration,
    /// Background KV sync of paused subservers (`GroupOptions::sync_tokens`).
    pub sync_tokens: u32,
}

/// Builds every subserver and the group (inside the worker's runtime).
pub fn build_group(engine: &EngineArgs, args: &GroupArgs) -> Result<Arc<dyn Engine>, WorkerError> {
    let mut subservers = Vec::with_capacity(args.subservers.len());
    let mut stops = Vec::new();
    for s in &args.subservers {
        let mut e = engine.clone();
        e.model = Some(format!("{}-{}", args.name, s.name));
        let built = match engine.engine {
            EngineKind::Candle => {
                e.model_path = Some(PathBuf::from(&s.source));
                let mut cfg = candle_config(&e)?;
                cfg.layers = s.layers;
                let tok = dolphin_tokenizer::ModelTokenizer::from_file(&cfg.model_path)
                    .map_err(|err| ConfigError::invalid("subserver", err.to_string()))?;
                for &t in tok.stop_token_ids() {
                    if !stops.contains(&t) {
                        stops.push(t);
                    }
                }
                tracing::info!(subserver = %s.name, path = %s.source, layers = ?s.layers,
                    "starting a subserver");
                candle_engine(cfg).map_err(WorkerError::Engine)?
            }
            EngineKind::Sim => {
                if s.layers.is_some() {
                    return Err(ConfigError::invalid(
                        "subserver",
                        "layers=N needs the candle engine",
                    )
                    .into());
                }
                e.sim_profile = s.source.clone();
                let cfg = sim_config(&e)?;
                tracing::info!(subserver = %s.name, profile = %cfg.profile.name,
                    "starting a subserver");
                sim_engine(cfg).map_err(WorkerError::Engine)?
            }
        };
        subservers.push(Subserver::new(s.name.clone(), built));
    }
    let options = GroupOptions {
        sync_tokens: args.sync_tokens,
    };
    let group =
        ModelGroup::with_options(args.name.clone(), subservers, args.handoff.clone(), options)
            .map_err(|e| ConfigError::invalid("subserver", e.to_string()))?;
    match args.batch_wait {
        BatchWaitMode::Fixed(b) => {
            for s in group.subservers() {
                s.engine
                    .set_batch_wait(BatchWait {
                        min_batch: b,
                        max_wait: args.max_wait,
                    })
                    .map_err(WorkerError::Engine)?;
            }
        }
        BatchWaitMode::Auto => {
            tokio::spawn(replan(Arc::downgrade(&group), args.max_wait));
        }
    }
    tokio::spawn(publish_metrics(Arc::downgrade(&group)));
    let engine: Arc<dyn Engine> = group;
    Ok(if stops.is_empty() {
        engine
    } else {
        Arc::new(WithStopTokens::new(engine, stops))
    })
}

/// How often the per-subserver gauges are refreshed.
const METRICS_EVERY: Duration = Duration::from_secs(1);

/// Refreshes the group's per-subserver gauges until the group is gone.
async fn publish_metrics(group: std::sync::Weak<ModelGroup>) {
    let mut last = Vec::new();
    let mut tick = tokio::time::interval(METRICS_EVERY);
    loop {
        tick.tick().await;
        let Some(group) = group.upgrade() else { return };
        group.publish_metrics(&mut last);
    }
}

/// Steps a subserver must have taken before its profile is trusted.
const MIN_STEPS: u64 = 32;
/// How often `auto` re-plans.
const REPLAN_EVERY: Duration = Duration::from_secs(5);

/// `--batch-wait auto`: every few seconds, the Markov-chain model over the subservers' measured
/// step times (by batch size) and handoff rates, at the current concurrency, picks each B.
async fn replan(group: std::sync::Weak<ModelGroup>, max_wait: Duration) {
    let mut tick = tokio::time::interval(REPLAN_EVERY);
    loop {
        tick.tick().await;
        let Some(group) = group.upgrade() else { return };
        let subs = group.subservers();
        if subs.len() != 2 {
            continue;
        }
        let profiles: Vec<_> = subs.iter().map(|s| s.engine.step_profile()).collect();
        if profiles.iter().any(|p| p.steps() < MIN_STEPS) {
            continue;
        }
        let rates = group.stats().handoff_rates();
        let (Some(h0), Some(h1)) = (rates[0], rates[1]) else {
            continue;
        };
        let concurrency = group.load().running.max(1);
        let step = |p: &dolphin_engine::StepProfile| {
            let mut ms = Vec::new();
            let mut last = p.mean(1).map_or(1.0, |d| d.as_secs_f64() * 1e3);
            for b in 1..=concurrency.min(16) {
                if let Some(d) = p.mean(b) {
                    last = d.as_secs_f64() * 1e3;
                }
                ms.push(last);
            }
            StepProfile { step_ms: ms }
        };
        let wait_ms = max_wait.as_secs_f64() * 1e3;
        let spec = ChainSpec {
            concurrency,
            profiles: [step(&profiles[0]), step(&profiles[1])],
            handoff: [h0, h1],
            drop_on_handoff: [true, false],
            max_wait_ms: [wait_ms, wait_ms],
            max_batch: [None, None],
            tick_ms: 1.0,
        };
        let spec = ChainSpec {
            tick_ms: spec.auto_tick(),
            ..spec
        };
        match tokio::task::spawn_blocking(move || plan(&spec, 8)).await {
            Ok(Ok(p)) => {
                for (s, &b) in subs.iter().zip(&p.best.batch_wait) {
                    let _ = s.engine.set_batch_wait(BatchWait {
                        min_batch: b,
                        max_wait,
                    });
                    metrics::gauge!(dolphin_handoff::metrics::SUBSERVER_BATCH_WAIT,
                        "subserver" => s.name.clone())
                    .set(f64::from(b));
                }
                tracing::info!(batch_wait = ?p.best.batch_wait, tokens_per_s = p.best.tokens_per_s,
                    concurrency, "delayed batching re-planned");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "delayed batching plan failed"),
            Err(e) => tracing::warn!(error = %e, "delayed batching planner panicked"),
        }
    }
}

/// The sim profile a subserver names exists (checked before anything starts).
pub fn check_sources(kind: EngineKind, specs: &[SubserverSpec]) -> Result<(), ConfigError> {
    for s in specs {
        match kind {
            EngineKind::Sim => {
                SimProfile::load(&s.source)
                    .map_err(|e| ConfigError::invalid("subserver", format!("{}: {e}", s.name)))?;
            }
            EngineKind::Candle => {
                if !PathBuf::from(&s.source).is_file() {
                    return Err(ConfigError::invalid(
                        "subserver",
                        format!("{}: {} is not a file", s.name, s.source),
                    ));
                }
            }
        }
    }
    Ok(())
}

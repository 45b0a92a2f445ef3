//! `dolphinctl replay`'s command line and its validation into a [`ReplayPlan`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dolphin_router::config::{OnlineArgs, ThresholdArgs, TrustArgs};
use dolphin_router::dolphin::Split;
use dolphin_workload::{Arrivals, Slo, WorkloadSpec};
use serde::Serialize;

use super::ReplayError;
use super::duration::{millis, parse_duration};
use super::live::LiveConfig;
use super::sim::{DEFAULT_SIM_PROFILE, DEFAULT_TOTAL_BLOCKS, SimTargetConfig, load_classifier};
use crate::cli::{DEFAULT_ROUTER_GRPC, Policy};

/// Concurrency of the closed loop synthetic workloads get when `--arrivals` is not given.
pub const DEFAULT_CLOSED_CONCURRENCY: u32 = 16;

/// Where a replay runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The router of a running cluster, over gRPC.
    Live,
    /// The cluster simulator (`dolphin-sim`), in this process.
    Sim,
}

/// `dolphinctl replay`.
#[derive(Clone, Debug, Args)]
pub struct ReplayArgs {
    /// The workload: mooncake:PATH, azure:PATH, bailian:PATH, burstgpt:PATH (traces), arxiv,
    /// leval, humaneval or hybrid (synthetic mixes).
    #[arg(long)]
    pub workload: WorkloadSpec,
    /// Requests to replay (synthetic: how many to generate, 1000 by default; traces: the first
    /// N rows, all by default).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Seed of a synthetic workload.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Arrivals: trace, trace:SCALE, poisson:RATE[:SEED] or closed:CONCURRENCY. Default: trace
    /// for traces, closed:16 for synthetic workloads.
    #[arg(long)]
    pub arrivals: Option<Arrivals>,
    /// Time-to-first-token SLO (e.g. 5s, 800ms).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub slo_ttft: Duration,
    /// Time-per-output-token SLO (e.g. 250ms).
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub slo_tpot: Duration,
    /// Where to replay: the live router, or the simulator.
    #[arg(long, value_enum, default_value_t = Target::Live)]
    pub target: Target,
    /// Live: the router's gRPC URL.
    #[arg(long, env = "DOLPHIN_ROUTER_GRPC", default_value = DEFAULT_ROUTER_GRPC)]
    pub router_grpc: String,
    /// Live: most requests in flight under open-loop arrivals (a later request waits).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,
    /// Live: the model to ask for (default: the first the router lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Live: prompts use token ids below this (default: the vocabulary size the router reports
    /// for the model; at most that).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub vocab_size: Option<u32>,
    /// Sim: the prefill/decode split, e.g. 2p2d (required with --target sim).
    #[arg(long)]
    pub split: Option<Split>,
    /// Sim: timing profile, a shipped name or a JSON file (default qwen72b-h20).
    #[arg(long)]
    pub sim_profile: Option<String>,
    /// Sim: the prefill policy (default: dolphin with --table, threshold without).
    #[arg(long, value_enum)]
    pub policy: Option<Policy>,
    /// Sim: a routing table JSON file; decides under --policy dolphin and names every
    /// request's cluster under any policy.
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// Sim: the router's output classifier (`dolphinctl classifier train --out`); default its
    /// prior, which places a request by its `max_tokens`.
    #[arg(long)]
    pub classifier: Option<PathBuf>,
    /// The router sees each request's `max_tokens` as its workload's fixed cap (ArXiv,
    /// HumanEval, Azure 1024, L-Eval 512, Mooncake 2048; live: within the context the prompt
    /// leaves), not its output length; the model still ends it at the trace's length (live:
    /// through `replay_output_tokens`, which the router does not read).
    #[arg(long)]
    pub max_tokens_cap: bool,
    /// Sim: KV blocks (of 16 tokens) per worker (default 100000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub total_blocks: Option<u32>,
    /// Sim: the threshold rule and its parameters (the router's flags).
    #[command(flatten)]
    pub threshold: ThresholdArgs,
    /// Sim, `--policy dolphin`: when a table's bit is trusted (the router's flags).
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Sim, `--policy dolphin`: learning online while the replay runs (the router's flags).
    #[command(flatten)]
    pub online: OnlineArgs,
    /// Write the config, the summary and every request's outcome as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write PNG charts (latency CDFs, per-cluster attainment) into this directory.
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// No progress bar on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

/// Where a validated replay runs.
#[derive(Clone, Debug)]
pub enum TargetPlan {
    /// The live router.
    Live(LiveConfig),
    /// The simulator.
    Sim(Box<SimTargetConfig>),
}

/// A validated replay: everything resolved, files loaded (except the workload).
#[derive(Clone, Debug)]
pub struct ReplayPlan {
    /// The workload to load, with `--requests` and `--seed` applied.
    pub spec: WorkloadSpec,
    /// The arrival process.
    pub arrivals: Arrivals,
    /// The SLO every request is judged against.
    pub slo: Slo,
    /// Where it runs.
    pub target: TargetPlan,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--plots`.
    pub plots: Option<PathBuf>,
    /// Things worth saying before the replay starts (e.g. a table learned for another split).
    pub warnings: Vec<String>,
    /// The settings as the JSON report records them.
    pub record: ConfigRecord,
}

/// The settings of a replay, as recorded in the JSON report's `config`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigRecord {
    /// `--workload` as given (normalized).
    pub workload: String,
    /// `--requests`.
    pub requests: Option<usize>,
    /// The synthetic workload's seed.
    pub seed: u64,
    /// The arrival process (`closed:16`, `poisson:2.5:0`, ...).
    pub arrivals: String,
    /// The SLO, ms.
    pub slo: Slo,
    /// Where it ran.
    pub target: Target,
    /// Live: the router's URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_grpc: Option<String>,
    /// Live: the open loop's bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Live: the model asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Sim: the split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Sim: the profile's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sim_profile: Option<String>,
    /// Sim: the policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Sim: the policy's parameters, as JSON (the router's `params_json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_params: Option<String>,
    /// Sim: the table file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<PathBuf>,
    /// Sim: KV blocks per worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_blocks: Option<u32>,
    /// Sim: the output classifier file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classifier: Option<PathBuf>,
    /// `max_tokens` was each workload's cap, not the output length.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub max_tokens_cap: bool,
}

fn usage(msg: impl Into<String>) -> ReplayError {
    ReplayError::Usage(msg.into())
}

impl ReplayArgs {
    /// Checks that the arguments fit together, fills the defaults and loads the simulator's
    /// profile and table; the workload itself is loaded later.
    pub fn plan(&self) -> Result<ReplayPlan, ReplayError> {
        let slo = Slo::new(millis(self.slo_ttft), millis(self.slo_tpot));
        if slo.ttft_ms <= 0.0 || slo.tpot_ms <= 0.0 {
            return Err(usage("--slo-ttft and --slo-tpot must be above zero"));
        }
        if self.requests == Some(0) {
            return Err(usage("--requests must be at least 1"));
        }
        let mut spec = self.workload.clone();
        spec.requests = self.requests;
        if let Some(seed) = self.seed {
            spec.seed = seed;
        }
        let is_trace = spec.source.is_trace();
        let arrivals = match self.arrivals {
            Some(a) => a,
            None if is_trace => Arrivals::Trace { time_scale: 1.0 },
            None => Arrivals::ClosedLoop {
                concurrency: DEFAULT_CLOSED_CONCURRENCY,
            },
        };
        if !is_trace && matches!(arrivals, Arrivals::Trace { .. }) {
            return Err(usage(format!(
                "--arrivals {arrivals}: the synthetic workload {spec} has no timestamps; use poisson:RATE or closed:CONCURRENCY"
            )));
        }
        let mut record = ConfigRecord {
            workload: spec.to_string(),
            requests: self.requests,
            seed: spec.seed,
            arrivals: arrivals.to_string(),
            slo,
            target: self.target,
            router_grpc: None,
            max_in_flight: None,
            model: None,
            split: None,
            sim_profile: None,
            policy: None,
            policy_params: None,
            table: None,
            total_blocks: None,
            classifier: None,
            max_tokens_cap: false,
        };
        let mut warnings = Vec::new();
        let target = match self.target {
            Target::Live => {
                let sim_only = [
                    ("--split", self.split.is_some()),
                    ("--sim-profile", self.sim_profile.is_some()),
                    ("--policy", self.policy.is_some()),
                    ("--table", self.table.is_some()),
                    ("--total-blocks", self.total_blocks.is_some()),
                    ("--classifier", self.classifier.is_some()),
                ];
                if let Some((flag, _)) = sim_only.iter().find(|(_, set)| *set) {
                    return Err(usage(format!(
                        "{flag} only applies to --target sim (the live router has its own policy and tables: see `dolphinctl tables`)"
                    )));
                }
                let live = LiveConfig {
                    router_grpc: self.router_grpc.clone(),
                    model: self.model.clone(),
                    vocab_size: self.vocab_size,
                    max_in_flight: self.max_in_flight,
                    progress: !self.no_progress,
                    cap_max_tokens: self.max_tokens_cap,
                };
                record.max_tokens_cap = self.max_tokens_cap;
                record.router_grpc = Some(live.router_grpc.clone());
                record.max_in_flight = Some(arrivals.concurrency().unwrap_or(live.max_in_flight));
                record.model = live.model.clone();
                TargetPlan::Live(live)
            }
            Target::Sim => {
                for (flag, set) in [
                    ("--model", self.model.is_some()),
                    ("--vocab-size", self.vocab_size.is_some()),
                ] {
                    if set {
                        return Err(usage(format!("{flag} only applies to --target live")));
                    }
                }
                let split = self
                    .split
                    .ok_or_else(|| usage("--target sim needs --split, e.g. --split 2p2d"))?;
                let profile = self.sim_profile.as_deref().unwrap_or(DEFAULT_SIM_PROFILE);
                let policy = match (self.policy, &self.table) {
                    (Some(Policy::Dolphin), None) => {
                        return Err(usage(
                            "--policy dolphin needs --table FILE (the simulator has no table store)",
                        ));
                    }
                    (Some(p), _) => p,
                    (None, Some(_)) => Policy::Dolphin,
                    (None, None) => Policy::Threshold,
                };
                let threshold = self.threshold.config();
                threshold
                    .validate()
                    .map_err(|e| usage(format!("threshold flags: {e}")))?;
                let trust = self.trust.config();
                trust
                    .validate()
                    .map_err(|e| usage(format!("table trust flags: {e}")))?;
                let online = self.online.config();
                online
                    .validate()
                    .map_err(|e| usage(format!("online learning flags: {e}")))?;
                let mut cfg = SimTargetConfig::load(
                    split,
                    profile,
                    policy,
                    threshold,
                    (trust, online),
                    self.table.as_deref(),
                    self.total_blocks.unwrap_or(DEFAULT_TOTAL_BLOCKS),
                )?;
                cfg.classifier = self
                    .classifier
                    .as_deref()
                    .map(load_classifier)
                    .transpose()?;
                cfg.cap_max_tokens = self.max_tokens_cap;
                if let Some(table_split) = cfg.table_split()
                    && table_split != split
                {
                    warnings.push(format!(
                        "the table was learned for {table_split}, the simulated split is {split}"
                    ));
                }
                record.split = Some(split.to_string());
                record.sim_profile = Some(cfg.profile.name.clone());
                record.policy = Some(cfg.policy.name().to_owned());
                record.policy_params = Some(cfg.policy.params_json());
                record.table = self.table.clone();
                record.classifier = self.classifier.clone();
                record.max_tokens_cap = self.max_tokens_cap;
                record.total_blocks = Some(cfg.total_blocks);
                TargetPlan::Sim(Box::new(cfg))
            }
        };
        Ok(ReplayPlan {
            spec,
            arrivals,
            slo,
            target,
            json: self.json.clone(),
            plots: self.plots.clone(),
            warnings,
            record,
        })
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;

//! The simulator experiments behind `docs/results.md` (binary `paper_results`): one
//! [`Setup`] (profile, split, KV room, closed-loop concurrency, SLO) on which fixed policies are
//! replayed and tables are learned, with the same code `dolphinctl replay|learn --target sim`
//! runs.

use dolphin_engine::SimProfile;
use dolphin_learn::classifier::TrainConfig;
use dolphin_learn::fit::FitConfig;
use dolphin_learn::search::SearchConfig;
use dolphin_learn::sim_target::{SimLearned, SimTarget, learn_on_sim};
use dolphin_router::dolphin::table::{ClusterMethod, TableSlo};
use dolphin_router::dolphin::{CompiledTable, OutputClassifier, Reward, RoutingTable, Split};
use dolphin_router::policy::{DolphinConfig, Policy, ThresholdConfig, ThresholdVariant};
use dolphin_sim::SimClusterConfig;
use dolphin_workload::{Arrivals, RequestOutcome, Slo, Summary, Workload};
use serde::Serialize;

use crate::BenchError;

mod ablation;
mod charts;
mod classes;
mod crosscheck;
mod flip;
mod load_rule;
mod online;
mod operating;
mod shift;
mod step_caps;
mod tpot_slo;

pub use ablation::{Ablation, ablations};
pub use charts::{attainment_bars, cdfs};
pub use classes::{ClassRow, capped_records, output_classes};
pub use crosscheck::{CrosscheckRow, crosscheck_section, run_crosscheck};
pub use flip::{FlipRow, flip};
pub use load_rule::{LoadRuleRow, load_rule_comparison};
pub use online::{OnlineRow, OnlineSeries, split_change};
pub use operating::{
    LoadKind, OperatingPoint, StepLimitRow, find_load, operating_points, operating_table,
    points_at, split, step_limit_trade,
};
pub use shift::{Samples, ShiftRow, traffic_shift};
pub use step_caps::{StepCapCell, StepCapRow, step_cap_header, step_cap_sweep};
pub use tpot_slo::{P90Change, TpotSloRow, TpotSloTable, tpot_slo_sweep};

/// Where and how a workload is replayed.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Timing profile of every worker.
    pub profile: SimProfile,
    /// Prefill and decode workers.
    pub split: Split,
    /// KV blocks per worker.
    pub total_blocks: u32,
    /// How requests arrive.
    pub arrivals: Arrivals,
    /// The SLO requests are judged against.
    pub slo: Slo,
    /// The router's output classifier (`None`: its prior, which reads `max_tokens`).
    pub classifier: Option<OutputClassifier>,
}

impl Setup {
    /// The simulated cluster.
    pub fn cluster(&self) -> SimClusterConfig {
        let mut c =
            SimClusterConfig::new(self.split.prefill, self.split.decode, self.profile.clone());
        c.total_blocks = self.total_blocks;
        c
    }

    /// `workload` bound to this setup. The router sees each request's `max_tokens` as its
    /// workload's cap, never its output length, and predicts the output with this setup's
    /// classifier.
    pub fn target(&self, workload: &Workload) -> Result<SimTarget, BenchError> {
        let mut t =
            SimTarget::new(self.cluster(), workload, self.arrivals, self.slo).map_err(learn_err)?;
        t.cap_max_tokens();
        if let Some(c) = &self.classifier {
            t.set_classifier(c.clone());
        }
        Ok(t)
    }

    /// This setup with the output classifier trained on `train` (what is known at admission,
    /// with the capped `max_tokens`, against the true output lengths), as an operator trains it
    /// on the request log (`dolphinctl classifier train`).
    pub fn with_classifier_for(&self, name: &str, train: &Workload) -> Result<Setup, BenchError> {
        let report = dolphin_learn::classifier::train(
            &capped_records(train),
            &TrainConfig {
                source: name.to_owned(),
                heldout: 0.0,
                ..TrainConfig::default()
            },
        )
        .map_err(|e| BenchError::Experiment(format!("classifier for {name}: {e}")))?;
        Ok(Setup {
            classifier: Some(report.classifier),
            ..self.clone()
        })
    }

    /// A fit of `k` clusters for this setup's split and SLO.
    pub fn fit(&self, workload: &str, k: usize, method: ClusterMethod, seed: u64) -> FitConfig {
        FitConfig {
            split: self.split,
            k,
            method,
            slo: TableSlo {
                ttft_ms: self.slo.ttft_ms,
                tpot_ms: self.slo.tpot_ms,
            },
            workload: workload.to_owned(),
            bits: dolphin_learn::fit::InitBits::Threshold(ThresholdConfig::default()),
            seed,
            features: [true; 4],
            reward: Reward::E2e,
            load_rule: None,
        }
    }
}

/// The fixed policies the learned table is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    /// Every request local.
    AlwaysLocal,
    /// Every request remote.
    AlwaysRemote,
    /// Dynamo 1.6: remote unless `eff_isl < 2048 && eff_isl / isl < 0.7`.
    Dynamo16,
    /// Older Dynamo: remote iff `eff_isl > 1000 && prefill_queue < 2`.
    DynamoLegacy,
    /// Dynamo's `prefill_load`: local iff the chosen prefill worker has more than one step of
    /// prefill work pending.
    PrefillLoad,
    /// Dynamo's `isl_or_load`: the Dynamo 1.6 condition or `prefill_load`'s.
    IslOrLoad,
    /// `isl_or_load` with the decode-busy guard: never local above 90% of the decode
    /// worker's KV pool in use.
    IslOrLoadGuarded,
    /// llm-d's prefix decider: remote iff at least 2048 prompt tokens are not cached on the
    /// decode worker.
    LlmD,
}

impl Baseline {
    /// All of them.
    pub const ALL: [Baseline; 8] = [
        Baseline::AlwaysLocal,
        Baseline::AlwaysRemote,
        Baseline::Dynamo16,
        Baseline::DynamoLegacy,
        Baseline::PrefillLoad,
        Baseline::IslOrLoad,
        Baseline::IslOrLoadGuarded,
        Baseline::LlmD,
    ];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::AlwaysLocal => "always-local",
            Baseline::AlwaysRemote => "always-remote",
            Baseline::Dynamo16 => "dynamo-1.6",
            Baseline::DynamoLegacy => "dynamo-legacy",
            Baseline::PrefillLoad => "dynamo-prefill-load",
            Baseline::IslOrLoad => "dynamo-isl-or-load",
            Baseline::IslOrLoadGuarded => "dynamo-isl-or-load+guard",
            Baseline::LlmD => "llm-d",
        }
    }

    /// The router policy.
    pub fn policy(self) -> Policy {
        match self {
            Baseline::AlwaysLocal => Policy::AlwaysLocal,
            Baseline::AlwaysRemote => Policy::AlwaysRemote,
            Baseline::Dynamo16 => Policy::Threshold(ThresholdConfig::default()),
            Baseline::DynamoLegacy => rule(ThresholdVariant::DynamoLegacy),
            Baseline::PrefillLoad => rule(ThresholdVariant::PrefillLoad),
            Baseline::IslOrLoad => rule(ThresholdVariant::IslOrLoad),
            Baseline::IslOrLoadGuarded => Policy::Threshold(ThresholdConfig {
                variant: ThresholdVariant::IslOrLoad,
                decode_busy_threshold: Some(0.9),
                ..ThresholdConfig::default()
            }),
            Baseline::LlmD => rule(ThresholdVariant::LlmD),
        }
    }
}

/// A threshold rule with its default parameters.
fn rule(variant: ThresholdVariant) -> Policy {
    Policy::Threshold(ThresholdConfig {
        variant,
        ..ThresholdConfig::default()
    })
}

/// One policy's result on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    /// Policy name.
    pub policy: String,
    /// The summary.
    pub summary: Summary,
    /// Every request (omitted from JSON: the summaries are what the docs cite).
    #[serde(skip)]
    pub outcomes: Vec<RequestOutcome>,
}

/// Replays `target`'s workload under `baseline`.
pub fn run_baseline(target: &mut SimTarget, baseline: Baseline) -> Result<Measured, BenchError> {
    let outcomes = target.run(baseline.policy(), None).map_err(learn_err)?;
    Ok(Measured {
        policy: baseline.name().to_owned(),
        summary: Summary::of(&outcomes),
        outcomes,
    })
}

/// Replays `target`'s workload with `table` deciding.
pub fn run_table(
    target: &mut SimTarget,
    name: &str,
    table: &RoutingTable,
) -> Result<Measured, BenchError> {
    let compiled = CompiledTable::compile(table.clone())
        .map_err(|e| BenchError::Experiment(format!("table: {e}")))?;
    let outcomes = target
        .run(Policy::Dolphin(DolphinConfig::default()), Some(compiled))
        .map_err(learn_err)?;
    Ok(Measured {
        policy: name.to_owned(),
        summary: Summary::of(&outcomes),
        outcomes,
    })
}

/// Learns a table on `workload` (the training set).
pub fn learn(
    setup: &Setup,
    workload: &Workload,
    fit: &FitConfig,
    search: &SearchConfig,
) -> Result<SimLearned, BenchError> {
    let mut target = setup.target(workload)?;
    learn_on_sim(&mut target, fit, search, &[], &mut |_| {}).map_err(learn_err)
}

pub(crate) fn learn_err(e: dolphin_learn::LearnError) -> BenchError {
    BenchError::Experiment(e.to_string())
}

/// `(b - a) / a` in percent (`a` the baseline).
pub fn change_pct(a: f64, b: f64) -> f64 {
    if a == 0.0 { 0.0 } else { (b - a) / a * 100.0 }
}

/// Every policy on one workload, split and load.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// Closed-loop concurrency.
    pub concurrency: u32,
    /// Workload name.
    pub workload: String,
    /// The split.
    pub split: String,
    /// Every policy: the baselines, then the table learned with the e2e reward and the one
    /// learned with the per-metric reward.
    pub rows: Vec<Measured>,
    /// Rounds the learning ran.
    pub learned_rounds: u32,
    /// The round that found the learned table.
    pub learned_converged_round: u32,
    /// The learned bits.
    pub learned_bits: Vec<u8>,
    /// The baseline with the highest attainment here (the first on a tie).
    pub best_baseline: String,
}

/// The row of `rows` with the highest `measure` of its summary (the first on a tie).
pub fn best_baseline(rows: &[Measured], measure: impl Fn(&Summary) -> f64) -> Option<&Measured> {
    rows.iter().reduce(|best, r| {
        if measure(&r.summary) > measure(&best.summary) {
            r
        } else {
            best
        }
    })
}

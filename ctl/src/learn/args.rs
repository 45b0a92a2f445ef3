//! `dolphinctl learn`'s command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dolphin_router::dolphin::table::LoadRule;
use dolphin_router::dolphin::{Reward, Split};
use dolphin_workload::{Arrivals, WorkloadSpec};

use crate::cli::{DEFAULT_ROUTER_ADMIN, DEFAULT_ROUTER_GRPC};
use crate::replay::{DEFAULT_SIM_PROFILE, DEFAULT_TOTAL_BLOCKS, Target, parse_duration};

/// Clustering methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// k-means (nearest centroid).
    Kmeans,
    /// Diagonal Gaussian mixture (most likely component).
    Gmm,
}

/// `dolphinctl learn`: fit a routing table for a split and learn its bits by measurement.
#[derive(Clone, Debug, Args)]
pub struct LearnArgs {
    /// The prefill/decode split the table is for (e.g. 3p1d). With --target sim it is also the
    /// simulated cluster; with --target live it must be the live cluster's split.
    #[arg(long)]
    pub split: Split,
    /// Clusters K.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub k: u32,
    /// Clustering method.
    #[arg(long, value_enum, default_value_t = Method::Kmeans)]
    pub method: Method,
    /// Time-to-first-token SLO (e.g. 5s).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub slo_ttft: Duration,
    /// Time-per-output-token SLO (e.g. 250ms).
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub slo_tpot: Duration,
    /// What counts as meeting the SLO while learning: e2e (DolphinRouting's criterion,
    /// `e2e <= TTFT_slo + (n - 1) x TPOT_slo`) or per-metric (TTFT and TPOT each within their
    /// SLO, as TaiChi measures it). Recorded in the table's provenance.
    #[arg(long, value_enum, default_value_t = Reward::E2e)]
    pub reward: Reward,
    /// Learn the bits under a load rule: a request whose bit says remote prefills locally
    /// while its prefill worker has more than this many steps of prefill work pending
    /// (Dynamo's `prefill_load` signal). Stored in the table, which the router then follows.
    /// Off by default.
    #[arg(long, value_parser = parse_busy_threshold, allow_negative_numbers = true)]
    pub load_rule_busy_threshold: Option<f64>,
    /// Sim: let the learner choose the load rule. It learns the table under each of
    /// `--load-rule-candidates` (default: none, 0.5, 1 and 2 steps), and keeps the one that attains the most on a validation
    /// sample: the trace's next `--requests` rows (without `--requests`, the trace's second
    /// half, the first half training), or the synthetic mix with the next seed. One search per
    /// rule, printed as a summary (no round log).
    #[arg(long, conflicts_with = "load_rule_busy_threshold")]
    pub choose_load_rule: bool,
    /// The rules `--choose-load-rule` chooses among: `none` (no rule) and busy thresholds in
    /// steps, comma-separated; the first wins a tie.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,0.5,1,2",
        value_parser = parse_candidate,
        requires = "choose_load_rule"
    )]
    pub load_rule_candidates: Vec<Candidate>,
    /// The workload: mooncake:PATH, azure:PATH, bailian:PATH, burstgpt:PATH, arxiv, leval,
    /// humaneval or hybrid.
    #[arg(long)]
    pub workload: WorkloadSpec,
    /// Requests of the workload (synthetic: generated; traces: the first N rows).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Seed of a synthetic workload.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Arrivals; learning measures under saturated load, so closed-loop by default.
    #[arg(long, default_value = "closed:16")]
    pub arrivals: Arrivals,
    /// Where periods are measured: the simulator (the whole workload each round) or the live
    /// router (--period-requests of the workload each round, in turn).
    #[arg(long, value_enum, default_value_t = Target::Sim)]
    pub target: Target,
    /// Sim: timing profile (a shipped name or a JSON file).
    #[arg(long, default_value = DEFAULT_SIM_PROFILE)]
    pub sim_profile: String,
    /// Sim: KV blocks (of 16 tokens) per worker.
    #[arg(long, default_value_t = DEFAULT_TOTAL_BLOCKS, value_parser = clap::value_parser!(u32).range(1..))]
    pub total_blocks: u32,
    /// Live: the router's gRPC URL, where the measured requests go.
    #[arg(long, env = "DOLPHIN_ROUTER_GRPC", default_value = DEFAULT_ROUTER_GRPC)]
    pub router_grpc: String,
    /// Live: the router's admin URL (its split and tables; with --activate, where the table is
    /// stored).
    #[arg(long, env = "DOLPHIN_ROUTER_ADMIN", default_value = DEFAULT_ROUTER_ADMIN)]
    pub router_admin: String,
    /// Live: requests per measured period.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..))]
    pub period_requests: u32,
    /// Live: most requests in flight under open-loop arrivals.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,
    /// Skip the per-cluster scan (refinement starts right after the initial table).
    #[arg(long)]
    pub no_scan: bool,
    /// Cluster without the output-length feature (an ablation).
    #[arg(long)]
    pub no_output_feature: bool,
    /// Sim: the router's output classifier (`dolphinctl classifier train --out`); default its
    /// prior, which places a request by its `max_tokens`.
    #[arg(long)]
    pub classifier: Option<PathBuf>,
    /// The router sees each request's `max_tokens` as its workload's fixed cap, not its output
    /// length (the model still ends it at the trace's length; live: through
    /// `replay_output_tokens`, which the router does not read).
    #[arg(long)]
    pub max_tokens_cap: bool,
    /// Refinement: probability that a cluster tries its other bit.
    #[arg(long, default_value_t = 0.2)]
    pub epsilon: f64,
    /// Refinement: epsilon's decay per round.
    #[arg(long, default_value_t = 0.9)]
    pub epsilon_decay: f64,
    /// Most rounds in all (the initial table and the scan included).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: u32,
    /// Stop after this many refinement rounds without improvement.
    #[arg(long, default_value_t = 8)]
    pub patience: u32,
    /// Seed of clustering and of the search's random choices.
    #[arg(long, default_value_t = 1)]
    pub learn_seed: u64,
    /// Round log, one JSON line per round after a header with the fitted table; if the file
    /// exists, learning resumes from it.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Write the learned table (JSON) to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Store the learned table in the router's table store (etcd) and make it active. Without
    /// it, a live run makes the table active before learning active again.
    #[arg(long)]
    pub activate: bool,
}

impl LearnArgs {
    /// The load rule the table is learned under, if any.
    pub fn load_rule(&self) -> Option<LoadRule> {
        self.load_rule_busy_threshold
            .map(|prefill_busy_threshold| LoadRule {
                prefill_busy_threshold,
            })
    }
}

/// One rule `--choose-load-rule` may choose: none, or a busy threshold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate(pub Option<LoadRule>);

fn parse_candidate(s: &str) -> Result<Candidate, String> {
    if s.trim() == "none" {
        return Ok(Candidate(None));
    }
    parse_busy_threshold(s.trim()).map(|prefill_busy_threshold| {
        Candidate(Some(LoadRule {
            prefill_busy_threshold,
        }))
    })
}

/// A busy threshold: a finite number of steps, at least 0.
fn parse_busy_threshold(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!("expected a number of steps >= 0, got {s:?}")),
    }
}

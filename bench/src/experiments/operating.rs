//! Operating points (issue 14 item 1): the offered loads at which Dynamo 1.6 meets the SLO for
//! a given share of requests, found by bisection under Poisson arrivals and under a closed
//! loop, and every policy measured there; and how the engines' step limits move the TTFT/TPOT
//! trade at one of those loads.

use std::fmt::Write as _;

use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::Split;
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_workload::{Arrivals, Workload};
use serde::Serialize;

use super::{Baseline, Measured, Setup, best_baseline, change_pct, learn, run_baseline, run_table};
use crate::BenchError;

/// How the load is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadKind {
    /// Poisson arrivals; the load is requests per second.
    Poisson,
    /// A closed loop; the load is requests in flight.
    ClosedLoop,
}

impl LoadKind {
    /// Both kinds.
    pub const ALL: [LoadKind; 2] = [LoadKind::Poisson, LoadKind::ClosedLoop];

    /// Arrivals at `load` (a Poisson process drawn from `seed`; a closed loop ignores it).
    pub fn arrivals(self, load: f64, seed: u64) -> Arrivals {
        match self {
            LoadKind::Poisson => Arrivals::Poisson {
                rate_per_s: load,
                seed,
            },
            LoadKind::ClosedLoop => Arrivals::ClosedLoop {
                concurrency: load.round().max(1.0) as u32,
            },
        }
    }

    /// The load's unit in tables.
    pub fn unit(self) -> &'static str {
        match self {
            LoadKind::Poisson => "req/s",
            LoadKind::ClosedLoop => "in flight",
        }
    }
}

/// The first three cells of a markdown row about one operating point: workload, split and the
/// load in its unit (whole numbers without decimals).
pub(super) fn point_cells(workload: &str, split: &str, load: f64, kind: LoadKind) -> String {
    let load = if load.fract() == 0.0 {
        format!("{load:.0}")
    } else {
        format!("{load:.2}")
    };
    format!("| {workload} | {split} | {load} {} |", kind.unit())
}

/// The points of `points` on `workload` and `split` whose target share is `target`.
pub fn points_at<'a>(
    points: &'a [OperatingPoint],
    workload: &str,
    split: &str,
    target: f64,
) -> Vec<&'a OperatingPoint> {
    points
        .iter()
        .filter(|p| p.workload == workload && p.split == split && (p.target - target).abs() < 1e-9)
        .collect()
}

/// Every policy at one load: where Dynamo 1.6 meets the SLO for `target` of the requests.
#[derive(Debug, Serialize)]
pub struct OperatingPoint {
    /// Workload name.
    pub workload: String,
    /// The split.
    pub split: String,
    /// How the load is offered.
    pub load_kind: LoadKind,
    /// The share of requests Dynamo 1.6 was to meet the SLO for.
    pub target: f64,
    /// The load found: requests per second, or requests in flight.
    pub load: f64,
    /// The baselines, then the table learned at this load.
    pub rows: Vec<Measured>,
    /// The baseline with the highest attainment here.
    pub best_baseline: String,
}

impl OperatingPoint {
    /// The row of the policy named `policy`.
    pub fn row(&self, policy: &str) -> Option<&Measured> {
        self.rows.iter().find(|r| r.policy == policy)
    }
}

/// Seed of the training sample's Poisson gaps; the test sample's is the next one.
pub(super) const TRAIN_SEED: u64 = 1;

/// Bisection steps once the load is bracketed.
const BISECTION_STEPS: u32 = 10;

/// Dynamo 1.6's attainment on `test` at `load`.
fn dynamo_attainment(
    setup: &Setup,
    test: &Workload,
    kind: LoadKind,
    load: f64,
) -> Result<f64, BenchError> {
    let s = Setup {
        arrivals: kind.arrivals(load, TRAIN_SEED + 1),
        ..setup.clone()
    };
    let mut target = s.target(test)?;
    Ok(run_baseline(&mut target, Baseline::Dynamo16)?
        .summary
        .attainment)
}

/// The highest load (to bisection precision; whole requests in flight for a closed loop) at
/// which Dynamo 1.6 still meets the SLO for `target` of `test`'s requests: doubled from a light
/// load until attainment falls below `target`, then bisected. Attainment is not strictly
/// monotone in load, so this is the edge the bisection lands on, measured again by the caller.
/// `None` when even the lightest load misses `target`.
pub fn find_load(
    setup: &Setup,
    test: &Workload,
    kind: LoadKind,
    target: f64,
) -> Result<Option<f64>, BenchError> {
    let meets = |load: f64| -> Result<bool, BenchError> {
        Ok(dynamo_attainment(setup, test, kind, load)? >= target)
    };
    let (mut lo, mut hi) = match kind {
        LoadKind::Poisson => (0.0, 0.125),
        LoadKind::ClosedLoop => (0.0, 1.0),
    };
    while meets(hi)? {
        lo = hi;
        hi *= 2.0;
        if hi > 1e6 {
            return Err(BenchError::Experiment(format!(
                "Dynamo 1.6 still attains {target} at {hi} {}",
                kind.unit()
            )));
        }
    }
    if lo == 0.0 {
        return Ok(None);
    }
    for _ in 0..BISECTION_STEPS {
        let mid = match kind {
            LoadKind::Poisson => (lo + hi) / 2.0,
            LoadKind::ClosedLoop => ((lo + hi) / 2.0).floor(),
        };
        if kind == LoadKind::ClosedLoop && mid <= lo {
            break;
        }
        if meets(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(lo))
}

/// The operating points of one workload on one split: for each load kind and each target
/// share, the load, then the baselines and a table learned at that load on `train` (Poisson
/// gaps of seed 1) measured on `test` (seed 2). Appends a table per point to `md`.
pub fn operating_points(
    base: &Setup,
    name: &str,
    (train, test): &(Workload, Workload),
    targets: &[f64],
) -> Result<Vec<OperatingPoint>, BenchError> {
    let mut points = Vec::new();
    let base = &base.with_classifier_for(name, train)?;
    for kind in LoadKind::ALL {
        for &target in targets {
            let Some(load) = find_load(base, test, kind, target)? else {
                continue;
            };
            let at = |seed| Setup {
                arrivals: kind.arrivals(load, seed),
                ..base.clone()
            };
            let learned = learn(
                &at(TRAIN_SEED),
                train,
                &at(TRAIN_SEED).fit(name, 8, ClusterMethod::Kmeans, 1),
                &SearchConfig::new(8),
            )?;
            let mut test_target = at(TRAIN_SEED + 1).target(test)?;
            let mut rows = Vec::new();
            for b in Baseline::ALL {
                rows.push(run_baseline(&mut test_target, b)?);
            }
            rows.push(run_table(
                &mut test_target,
                "learned (k-means, K=8)",
                &learned.table,
            )?);
            let best = best_baseline(&rows[..Baseline::ALL.len()], |s| s.attainment)
                .map_or(String::new(), |b| b.policy.clone());
            points.push(OperatingPoint {
                workload: name.to_owned(),
                split: base.split.to_string(),
                load_kind: kind,
                target,
                load,
                rows,
                best_baseline: best,
            });
        }
    }
    Ok(points)
}

/// The operating points as a markdown table: Dynamo 1.6, the best baseline and the learned
/// table at each, with the learned table's changes against both.
pub fn operating_table(points: &[OperatingPoint], md: &mut String) {
    md.push_str("| workload | split | load | Dynamo 1.6: attainment, P90 TTFT / TPOT ms | best baseline: attainment | learned: attainment | learned vs Dynamo 1.6: P90 TTFT, P90 TPOT | learned vs best baseline: P90 TTFT, P90 TPOT |\n|---|---|---|---|---|---|---|---|\n");
    for p in points {
        let (Some(dynamo), Some(learned)) = (p.row(Baseline::Dynamo16.name()), p.rows.last())
        else {
            continue;
        };
        let (dynamo, learned) = (&dynamo.summary, &learned.summary);
        let best = p.row(&p.best_baseline).map(|r| &r.summary);
        let load = match p.load_kind {
            LoadKind::Poisson => format!("{:.2} {} (Poisson)", p.load, p.load_kind.unit()),
            LoadKind::ClosedLoop => format!("{:.0} {}", p.load, p.load_kind.unit()),
        };
        let vs_best = best.map_or(String::from("-"), |b| {
            format!(
                "{:+.1}%, {:+.1}%",
                change_pct(b.ttft.p90, learned.ttft.p90),
                change_pct(b.tpot.p90, learned.tpot.p90)
            )
        });
        let _ = writeln!(
            md,
            "| {} | {} | {load}, Dynamo 1.6 meets {:.0}% | {:.3}, {:.0} / {:.1} | {} {} | {:.3} ({:+.1} pt) | {:+.1}%, {:+.1}% | {vs_best} |",
            p.workload,
            p.split,
            p.target * 100.0,
            dynamo.attainment,
            dynamo.ttft.p90,
            dynamo.tpot.p90,
            p.best_baseline,
            best.map_or(String::from("-"), |b| format!("{:.3}", b.attainment)),
            learned.attainment,
            (learned.attainment - dynamo.attainment) * 100.0,
            change_pct(dynamo.ttft.p90, learned.ttft.p90),
            change_pct(dynamo.tpot.p90, learned.tpot.p90),
        );
    }
}

/// One row of the step-limit trade.
#[derive(Debug, Serialize)]
pub struct StepLimitRow {
    /// Most prefill tokens of one sequence per step (0: no cap).
    pub prefill_chunk_tokens: u32,
    /// Most prefill tokens in a step that also decodes (0: no cap).
    pub mixed_prefill_tokens: u32,
    /// The policies measured with them.
    pub rows: Vec<Measured>,
}

/// The TTFT/TPOT trade of the step limits: `policies` replayed on `test` under `setup` with each
/// `(prefill_chunk_tokens, mixed_prefill_tokens)` pair set on every engine.
pub fn step_limit_trade(
    setup: &Setup,
    test: &Workload,
    limits: &[(u32, u32)],
    policies: &[Baseline],
    md: &mut String,
) -> Result<Vec<StepLimitRow>, BenchError> {
    md.push_str("| prefill chunk tokens | mixed-step prefill tokens | policy | attainment | P90 TTFT ms | P90 TPOT ms |\n|---|---|---|---|---|---|\n");
    let mut out = Vec::new();
    for &(chunk, mixed) in limits {
        let mut s = setup.clone();
        s.profile.prefill_chunk_tokens = chunk;
        s.profile.mixed_prefill_tokens = mixed;
        let mut target = s.target(test)?;
        let mut rows = Vec::new();
        for &b in policies {
            let m = run_baseline(&mut target, b)?;
            let sm = &m.summary;
            let cap = |n: u32| {
                if n == 0 {
                    "none".to_owned()
                } else {
                    n.to_string()
                }
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.3} | {:.0} | {:.1} |",
                cap(chunk),
                cap(mixed),
                m.policy,
                sm.attainment,
                sm.ttft.p90,
                sm.tpot.p90
            );
            rows.push(m);
        }
        out.push(StepLimitRow {
            prefill_chunk_tokens: chunk,
            mixed_prefill_tokens: mixed,
            rows,
        });
    }
    Ok(out)
}

/// `split` parsed, as the experiments name them.
pub fn split(s: &str) -> Result<Split, BenchError> {
    s.parse()
        .map_err(|e| BenchError::Experiment(format!("split {s}: {e}")))
}

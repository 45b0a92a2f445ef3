//! Tighter TPOT SLOs at the operating points (issue 14 target (a)): can a table learned to keep
//! every request's TPOT within a tight target, and its TTFT within 5 s, beat Dynamo 1.6 on both
//! P90s where Dynamo 1.6 meets 80% of the SLO? The tables are learned with the per-metric
//! reward at each TPOT target and measured on the operating point's test traffic.

use std::fmt::Write as _;

use dolphin_learn::fit::FitConfig;
use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::Reward;
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_workload::{Slo, Summary, Workload};
use serde::Serialize;

use super::operating::{TRAIN_SEED, point_cells};
use super::{
    Baseline, LoadKind, OperatingPoint, Setup, change_pct, learn, run_baseline, run_table,
};
use crate::BenchError;

/// The paper's margins at the 80% point: P90 TTFT and P90 TPOT this far below Dynamo 1.6, %.
pub const PAPER_TTFT_CUT_PCT: f64 = 5.7;
/// See [`PAPER_TTFT_CUT_PCT`].
pub const PAPER_TPOT_CUT_PCT: f64 = 2.6;

/// P90 TTFT and P90 TPOT of one policy against a reference, %.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct P90Change {
    /// P90 TTFT change, %.
    pub ttft_pct: f64,
    /// P90 TPOT change, %.
    pub tpot_pct: f64,
}

impl P90Change {
    /// `s` against `reference`.
    pub(super) fn of(reference: &Summary, s: &Summary) -> Self {
        Self {
            ttft_pct: change_pct(reference.ttft.p90, s.ttft.p90),
            tpot_pct: change_pct(reference.tpot.p90, s.tpot.p90),
        }
    }

    /// Both below the reference by the paper's margins.
    pub fn both(&self) -> bool {
        self.ttft_pct <= -PAPER_TTFT_CUT_PCT && self.tpot_pct <= -PAPER_TPOT_CUT_PCT
    }
}

/// One table learned at one TPOT target.
#[derive(Debug, Serialize)]
pub struct TpotSloTable {
    /// The TPOT target it was learned against, ms (TTFT: the run's).
    pub tpot_slo_ms: f64,
    /// Attainment on the test traffic under the run's SLO (end to end).
    pub attainment: f64,
    /// P90 TTFT against Dynamo 1.6's, %.
    pub ttft_p90_change_pct: f64,
    /// P90 TPOT against Dynamo 1.6's, %.
    pub tpot_p90_change_pct: f64,
    /// Share of requests sent remote.
    pub remote_share: f64,
    /// Both P90s below Dynamo 1.6's by the paper's margins.
    pub both: bool,
}

/// One operating point's sweep.
#[derive(Debug, Serialize)]
pub struct TpotSloRow {
    /// Workload name.
    pub workload: String,
    /// The split.
    pub split: String,
    /// The operating point's load (in `load_kind`'s unit).
    pub load: f64,
    /// How the load is offered.
    pub load_kind: LoadKind,
    /// Always-remote against Dynamo 1.6: P90 TTFT and P90 TPOT, %.
    pub always_remote_change_pct: (f64, f64),
    /// A table per TPOT target.
    pub tables: Vec<TpotSloTable>,
}

/// For each of `points` (of `workload`, whose training and test samples are `samples`): tables
/// learned with the per-metric reward at each of `tpot_slos_ms` (TTFT target unchanged),
/// measured on the point's test traffic against Dynamo 1.6. Appends a markdown table to `md`.
pub fn tpot_slo_sweep(
    base: &Setup,
    workload: &str,
    (train, test): &(Workload, Workload),
    points: &[&OperatingPoint],
    tpot_slos_ms: &[f64],
    md: &mut String,
) -> Result<Vec<TpotSloRow>, BenchError> {
    let base = &base.with_classifier_for(workload, train)?;
    let mut rows = Vec::new();
    for p in points {
        let at = |seed, slo| Setup {
            arrivals: p.load_kind.arrivals(p.load, seed),
            slo,
            ..base.clone()
        };
        let mut test_target = at(TRAIN_SEED + 1, base.slo).target(test)?;
        let dynamo = run_baseline(&mut test_target, Baseline::Dynamo16)?.summary;
        let remote = run_baseline(&mut test_target, Baseline::AlwaysRemote)?.summary;
        let mut tables = Vec::new();
        for &tpot in tpot_slos_ms {
            let s = at(TRAIN_SEED, Slo::new(base.slo.ttft_ms, tpot));
            let fit = FitConfig {
                reward: Reward::PerMetric,
                ..s.fit(workload, 8, ClusterMethod::Kmeans, 1)
            };
            let learned = learn(&s, train, &fit, &SearchConfig::new(8))?;
            let r = run_table(&mut test_target, "learned", &learned.table)?.summary;
            let change = P90Change::of(&dynamo, &r);
            tables.push(TpotSloTable {
                tpot_slo_ms: tpot,
                attainment: r.attainment,
                ttft_p90_change_pct: change.ttft_pct,
                tpot_p90_change_pct: change.tpot_pct,
                remote_share: r.remote as f64 / r.requests.max(1) as f64,
                both: change.both(),
            });
        }
        rows.push(TpotSloRow {
            workload: workload.to_owned(),
            split: p.split.clone(),
            load: p.load,
            load_kind: p.load_kind,
            always_remote_change_pct: {
                let c = P90Change::of(&dynamo, &remote);
                (c.ttft_pct, c.tpot_pct)
            },
            tables,
        });
    }
    write_table(&rows, md);
    Ok(rows)
}

fn write_table(rows: &[TpotSloRow], md: &mut String) {
    for r in rows {
        let _ = write!(
            md,
            "{} {:+.1}%, {:+.1}% |",
            point_cells(&r.workload, &r.split, r.load, r.load_kind),
            r.always_remote_change_pct.0,
            r.always_remote_change_pct.1
        );
        for t in &r.tables {
            let _ = write!(
                md,
                " {:+.1}%, {:+.1}%, {:.0}% remote{} |",
                t.ttft_p90_change_pct,
                t.tpot_p90_change_pct,
                100.0 * t.remote_share,
                if t.both { " (both)" } else { "" }
            );
        }
        md.push('\n');
    }
}

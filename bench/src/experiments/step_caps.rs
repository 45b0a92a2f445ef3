//! Tables learned under a mixed-step cap at the 80% points (issue 14 target (a)). A local
//! prefill of up to 2048 prompt tokens stalls every decode beside it for a whole step, which is
//! what keeps the learned tables' P90 TPOT above Dynamo 1.6's. `--mixed-prefill-tokens` bounds
//! that stall; here every engine runs under the cap, Dynamo 1.6 is measured under it, and a
//! table is learned under it, at each load where Dynamo 1.6 (without a cap) meets 80%.

use std::fmt::Write as _;

use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_workload::Workload;
use serde::Serialize;

use super::operating::{TRAIN_SEED, point_cells};
use super::tpot_slo::P90Change;
use super::{Baseline, LoadKind, OperatingPoint, Setup, learn, run_baseline, run_table};
use crate::BenchError;

/// One cap at one operating point.
#[derive(Debug, Serialize)]
pub struct StepCapCell {
    /// The most prompt tokens in a step that also decodes (0: no cap).
    pub mixed_prefill_tokens: u32,
    /// Dynamo 1.6 under the cap: attainment.
    pub dynamo_attainment: f64,
    /// Dynamo 1.6 under the cap against Dynamo 1.6 without it.
    pub dynamo_vs_uncapped: P90Change,
    /// The table learned under the cap: attainment.
    pub learned_attainment: f64,
    /// Its share of requests sent remote.
    pub learned_remote_share: f64,
    /// The learned table against Dynamo 1.6 without a cap (the paper's comparison).
    pub learned_vs_uncapped: P90Change,
    /// The learned table against Dynamo 1.6 under the same cap.
    pub learned_vs_capped: P90Change,
}

/// One operating point's caps.
#[derive(Debug, Serialize)]
pub struct StepCapRow {
    /// Workload name.
    pub workload: String,
    /// The split.
    pub split: String,
    /// The operating point's load (in `load_kind`'s unit).
    pub load: f64,
    /// How the load is offered.
    pub load_kind: LoadKind,
    /// Dynamo 1.6 without a cap: attainment.
    pub dynamo_uncapped_attainment: f64,
    /// One cell per cap.
    pub cells: Vec<StepCapCell>,
}

/// For each of `points` (of `workload`, whose training and test samples are `samples`) and
/// each of `caps` (0: none): Dynamo 1.6 and a table learned on the training sample (e2e
/// reward, K=8), both with every engine under the cap, measured on the point's test traffic.
/// Appends one markdown row per point to `md`.
pub fn step_cap_sweep(
    base: &Setup,
    workload: &str,
    (train, test): &(Workload, Workload),
    points: &[&OperatingPoint],
    caps: &[u32],
    md: &mut String,
) -> Result<Vec<StepCapRow>, BenchError> {
    let base = &base.with_classifier_for(workload, train)?;
    let mut rows = Vec::new();
    for p in points {
        let at = |seed, cap| {
            let mut s = Setup {
                arrivals: p.load_kind.arrivals(p.load, seed),
                ..base.clone()
            };
            s.profile.mixed_prefill_tokens = cap;
            s
        };
        let uncapped =
            run_baseline(&mut at(TRAIN_SEED + 1, 0).target(test)?, Baseline::Dynamo16)?.summary;
        let mut cells = Vec::new();
        for &cap in caps {
            let mut test_target = at(TRAIN_SEED + 1, cap).target(test)?;
            let dynamo = run_baseline(&mut test_target, Baseline::Dynamo16)?.summary;
            let s = at(TRAIN_SEED, cap);
            let learned = learn(
                &s,
                train,
                &s.fit(workload, 8, ClusterMethod::Kmeans, 1),
                &SearchConfig::new(8),
            )?;
            let r = run_table(&mut test_target, "learned", &learned.table)?.summary;
            cells.push(StepCapCell {
                mixed_prefill_tokens: cap,
                dynamo_attainment: dynamo.attainment,
                dynamo_vs_uncapped: P90Change::of(&uncapped, &dynamo),
                learned_attainment: r.attainment,
                learned_remote_share: r.remote as f64 / r.requests.max(1) as f64,
                learned_vs_uncapped: P90Change::of(&uncapped, &r),
                learned_vs_capped: P90Change::of(&dynamo, &r),
            });
        }
        rows.push(StepCapRow {
            workload: workload.to_owned(),
            split: p.split.clone(),
            load: p.load,
            load_kind: p.load_kind,
            dynamo_uncapped_attainment: uncapped.attainment,
            cells,
        });
    }
    write_table(&rows, md);
    Ok(rows)
}

/// The section's table header for `caps`.
pub fn step_cap_header(caps: &[u32]) -> String {
    let cap = |c: u32| {
        if c == 0 {
            "no cap".to_owned()
        } else {
            format!("cap {c}")
        }
    };
    format!(
        "| workload | split | load |{}\n|---|---|---|{}\n",
        caps.iter()
            .map(|&c| format!(" {}: Dynamo 1.6 | {}: learned |", cap(c), cap(c)))
            .collect::<String>(),
        "---|---|".repeat(caps.len())
    )
}

fn write_table(rows: &[StepCapRow], md: &mut String) {
    let pct = |c: &P90Change| format!("{:+.1}%, {:+.1}%", c.ttft_pct, c.tpot_pct);
    for r in rows {
        md.push_str(&point_cells(&r.workload, &r.split, r.load, r.load_kind));
        for c in &r.cells {
            let _ = write!(
                md,
                " {:.3}; {} | {:.3}; {}{}; {}{}; {:.0}% remote |",
                c.dynamo_attainment,
                pct(&c.dynamo_vs_uncapped),
                c.learned_attainment,
                pct(&c.learned_vs_uncapped),
                if c.learned_vs_uncapped.both() {
                    " (both)"
                } else {
                    ""
                },
                pct(&c.learned_vs_capped),
                if c.learned_vs_capped.both() {
                    " (both)"
                } else {
                    ""
                },
                100.0 * c.learned_remote_share,
            );
        }
        md.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use dolphin_engine::SimProfile;
    use dolphin_router::dolphin::Split;
    use dolphin_workload::{Arrivals, Slo, synthetic};

    use super::*;

    #[test]
    fn each_cap_is_measured_against_the_same_uncapped_run() {
        let setup = Setup {
            profile: SimProfile::builtin("qwen72b-h20").expect("profile"),
            split: Split::new(1, 1),
            total_blocks: 100_000,
            arrivals: Arrivals::ClosedLoop { concurrency: 1 },
            slo: Slo::new(5000.0, 250.0),
            classifier: None,
        };
        let point = OperatingPoint {
            workload: "hybrid".into(),
            split: "1p1d".into(),
            load_kind: LoadKind::ClosedLoop,
            target: 0.8,
            load: 4.0,
            rows: Vec::new(),
            best_baseline: String::new(),
        };
        let samples = (synthetic::hybrid(40, 1), synthetic::hybrid(40, 2));
        let mut md = String::new();
        let rows = step_cap_sweep(&setup, "hybrid", &samples, &[&point], &[0, 256], &mut md)
            .expect("runs");
        let cells = &rows[0].cells;
        assert_eq!(cells.len(), 2);
        // No cap is the uncapped run itself: Dynamo 1.6 equals it exactly.
        let none = &cells[0];
        assert_eq!(none.dynamo_vs_uncapped.ttft_pct, 0.0);
        assert_eq!(none.dynamo_vs_uncapped.tpot_pct, 0.0);
        assert_eq!(none.dynamo_attainment, rows[0].dynamo_uncapped_attainment);
        assert_eq!(
            none.learned_vs_uncapped.ttft_pct,
            none.learned_vs_capped.ttft_pct
        );
        assert_eq!(cells[1].mixed_prefill_tokens, 256);
        assert!((0.0..=1.0).contains(&cells[1].learned_remote_share));
        assert!(md.starts_with("| hybrid | 1p1d | 4 in flight |"), "{md}");
        assert_eq!(md.matches(" remote |").count(), 2, "{md}");
        assert!(step_cap_header(&[0, 256]).contains("| cap 256: learned |"));
    }

    #[test]
    fn both_needs_both_margins() {
        let c = |ttft_pct, tpot_pct| P90Change { ttft_pct, tpot_pct };
        assert!(c(-5.7, -2.6).both());
        assert!(!c(-5.6, -10.0).both());
        assert!(!c(-50.0, -2.5).both());
    }
}

//! Ablations of the learning procedure: K, the scan, the output-length feature, k-means against
//! GMM.

use std::fmt::Write as _;
use std::path::Path;

use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_workload::Workload;
use dolphinctl::chart::{self, Series};
use serde::Serialize;

use super::*;
use crate::BenchError;

/// One learned table of one variant.
#[derive(Debug, Serialize)]
pub struct Ablation {
    /// The variant's name.
    pub variant: String,
    /// Learning seed (clustering and search).
    pub seed: u64,
    /// Rounds run.
    pub rounds: u32,
    /// The round that found the learned table.
    pub converged_round: u32,
    /// Attainment on the training requests.
    pub train_attainment: f64,
    /// Attainment on the test requests.
    pub test_attainment: f64,
    /// Test P90 TTFT, ms.
    pub test_p90_ttft_ms: f64,
    /// Test P90 TPOT, ms.
    pub test_p90_tpot_ms: f64,
    /// Best attainment so far after each round.
    pub curve: Vec<f64>,
}

pub fn ablations(
    setup: &Setup,
    (train, test): &(Workload, Workload),
    seeds: u64,
    out: &Path,
    md: &mut String,
) -> Result<Vec<Ablation>, BenchError> {
    let mut rows = Vec::new();
    let variants: Vec<(String, usize, ClusterMethod, bool, bool)> = vec![
        ("K=2".into(), 2, ClusterMethod::Kmeans, true, true),
        ("K=4".into(), 4, ClusterMethod::Kmeans, true, true),
        ("K=8".into(), 8, ClusterMethod::Kmeans, true, true),
        ("K=16".into(), 16, ClusterMethod::Kmeans, true, true),
        ("K=8, no scan".into(), 8, ClusterMethod::Kmeans, false, true),
        (
            "K=8, no output-length feature".into(),
            8,
            ClusterMethod::Kmeans,
            true,
            false,
        ),
        ("K=8, GMM".into(), 8, ClusterMethod::Gmm, true, true),
    ];
    let setup = &setup.with_classifier_for("hybrid", train)?;
    let mut target = setup.target(test)?;
    for (name, k, method, scan, output) in &variants {
        for seed in 1..=seeds {
            let mut fit = setup.fit("hybrid", *k, *method, seed);
            if !output {
                fit.features = [true, true, true, false];
            }
            let mut search = SearchConfig::new(*k);
            search.scan = *scan;
            search.seed = seed;
            let learned = learn(setup, train, &fit, &search)?;
            let m = run_table(&mut target, name, &learned.table)?;
            let mut best = f64::NEG_INFINITY;
            let curve = learned
                .search
                .history
                .iter()
                .map(|r| {
                    best = best.max(r.best_attainment);
                    best
                })
                .collect();
            rows.push(Ablation {
                variant: name.clone(),
                seed,
                rounds: learned.search.rounds,
                converged_round: learned.search.converged_round,
                train_attainment: learned.search.attainment,
                test_attainment: m.summary.attainment,
                test_p90_ttft_ms: m.summary.ttft.p90,
                test_p90_tpot_ms: m.summary.tpot.p90,
                curve,
            });
        }
    }
    let _ = writeln!(
        md,
        "\n## Ablations\n\nHybrid, 3p1d, closed loop at {} in flight, learned on seed-1 requests and tested on seed-2 requests; mean over {seeds} learning seeds.\n\n| variant | rounds run | round that found the table | train attainment | test attainment | test P90 TTFT ms | test P90 TPOT ms |\n|---|---|---|---|---|---|---|",
        setup.arrivals.concurrency().unwrap_or(0)
    );
    let mut curves = Vec::new();
    for (name, ..) in &variants {
        let v: Vec<&Ablation> = rows.iter().filter(|r| &r.variant == name).collect();
        let mean = |f: &dyn Fn(&Ablation) -> f64| {
            v.iter().map(|r| f(r)).sum::<f64>() / v.len().max(1) as f64
        };
        let _ = writeln!(
            md,
            "| {name} | {:.1} | {:.1} | {:.3} | {:.3} | {:.0} | {:.1} |",
            mean(&|r| f64::from(r.rounds)),
            mean(&|r| f64::from(r.converged_round)),
            mean(&|r| r.train_attainment),
            mean(&|r| r.test_attainment),
            mean(&|r| r.test_p90_ttft_ms),
            mean(&|r| r.test_p90_tpot_ms),
        );
        let charted = ["K=2", "K=8", "K=16", "K=8, no scan"].contains(&name.as_str());
        if let Some(first) = v.first().filter(|_| charted) {
            curves.push(Series::new(name.clone(), first.curve.clone()));
        }
    }
    chart::line_chart(
        &out.join("learning_curves.png"),
        "Best training attainment by round (seed 1)",
        "round",
        "attainment",
        &curves,
    )
    .map_err(|e| BenchError::Experiment(e.to_string()))?;
    Ok(rows)
}

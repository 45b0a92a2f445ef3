//! The charts of `docs/results.md`.

use std::path::Path;

use dolphinctl::chart::{self, Series};

use super::*;
use crate::BenchError;

/// Latency CDFs (TTFT on a log axis, TPOT) of every policy of one comparison.
pub fn cdfs(out: &Path, name: &str, rows: &[Measured]) -> Result<(), BenchError> {
    for (metric, f) in [
        (
            "ttft",
            (|o: &dolphin_workload::RequestOutcome| o.ttft_ms) as fn(&_) -> f64,
        ),
        ("tpot", |o| o.tpot_ms),
    ] {
        let series: Vec<Series> = rows
            .iter()
            .map(|r| {
                Series::new(
                    r.policy.clone(),
                    r.outcomes.iter().filter(|o| o.ok).map(f).collect(),
                )
            })
            .collect();
        chart::cdf_chart(
            &out.join(format!("{name}_{metric}_cdf.png")),
            &format!("{} on {name}", metric.to_uppercase()),
            &format!("{} (ms)", metric.to_uppercase()),
            &series,
            metric == "ttft",
        )
        .map_err(|e| BenchError::Experiment(e.to_string()))?;
    }
    Ok(())
}

/// Attainment of every policy on the mixed and real-trace workloads, one group per workload,
/// split and load.
pub fn attainment_bars(out: &Path, comparisons: &[Comparison]) -> Result<(), BenchError> {
    let comparisons: Vec<&Comparison> = comparisons
        .iter()
        .filter(|c| c.workload == "hybrid" || c.workload == "mooncake")
        .collect();
    let cats: Vec<String> = comparisons
        .iter()
        .map(|c| {
            let w = if c.workload == "hybrid" {
                "Hyb"
            } else {
                "Moon"
            };
            format!("{w} {} c{}", c.split, c.concurrency)
        })
        .collect();
    let Some(first) = comparisons.first() else {
        return Ok(());
    };
    let series: Vec<Series> = (0..first.rows.len())
        .map(|i| {
            Series::new(
                first.rows[i].policy.clone(),
                comparisons
                    .iter()
                    .map(|c| c.rows[i].summary.attainment)
                    .collect(),
            )
        })
        .collect();
    chart::bar_chart(
        &out.join("attainment.png"),
        "SLO attainment (e2e): Hybrid (Hyb) and Mooncake (Moon), by split and concurrency (c)",
        "attainment",
        &cats,
        &series,
        true,
    )
    .map_err(|e| BenchError::Experiment(e.to_string()))
}

//! TaiChi's flip: the better fixed path changes with the SLO.

use std::fmt::Write as _;
use std::path::Path;

use dolphin_engine::SimProfile;
use dolphin_router::dolphin::Split;
use dolphin_workload::{Arrivals, Slo, Summary, synthetic};
use dolphinctl::chart::{self, Series};
use serde::Serialize;

use super::*;
use crate::BenchError;

/// One policy under one SLO.
#[derive(Debug, Serialize)]
pub struct FlipRow {
    /// The SLO.
    pub slo: Slo,
    /// The fixed policy.
    pub policy: String,
    /// Share meeting TTFT and TPOT each (TaiChi's criterion).
    pub attainment_each: f64,
    /// Share meeting the end-to-end SLO.
    pub attainment_e2e: f64,
    /// P90 TTFT, ms.
    pub p90_ttft_ms: f64,
    /// P90 TPOT, ms.
    pub p90_tpot_ms: f64,
}

/// TaiChi's observation: 300 ArXiv-like requests at `rate` per second (Poisson) on `split`; the
/// better fixed path flips between a tight-TTFT and a tight-TPOT SLO.
pub fn flip(
    profile: &SimProfile,
    split: Split,
    rate: f64,
    out: &Path,
    md: &mut String,
) -> Result<Vec<FlipRow>, BenchError> {
    let mut rows = Vec::new();
    let _ = write!(
        md,
        "## TaiChi's flip\n\nArXiv-like workload (300 requests, Poisson {rate}/s), split {split}.\n\n"
    );
    md.push_str("| SLO (TTFT / TPOT) | policy | attainment, TTFT and TPOT each | attainment, e2e | P90 TTFT ms | P90 TPOT ms |\n|---|---|---|---|---|---|\n");
    let mut bars = vec![
        Series::new("always-local", Vec::new()),
        Series::new("always-remote", Vec::new()),
    ];
    let mut cats = Vec::new();
    for slo in [Slo::new(5000.0, 250.0), Slo::new(16000.0, 60.0)] {
        let w = synthetic::arxiv(300, 7);
        let arrivals = Arrivals::Poisson {
            rate_per_s: rate,
            seed: 7,
        };
        let s = Setup {
            profile: profile.clone(),
            split,
            total_blocks: 100_000,
            arrivals,
            slo,
            classifier: None,
        };
        let mut target = s.target(&w)?;
        cats.push(format!(
            "{:.0} s / {:.0} ms",
            slo.ttft_ms / 1e3,
            slo.tpot_ms
        ));
        for (i, b) in [Baseline::AlwaysLocal, Baseline::AlwaysRemote]
            .into_iter()
            .enumerate()
        {
            let m = run_baseline(&mut target, b)?;
            let sm: &Summary = &m.summary;
            let _ = writeln!(
                md,
                "| {:.0} s / {:.0} ms | {} | {:.3} | {:.3} | {:.0} | {:.1} |",
                slo.ttft_ms / 1e3,
                slo.tpot_ms,
                m.policy,
                sm.attainment_each,
                sm.attainment,
                sm.ttft.p90,
                sm.tpot.p90
            );
            bars[i].values.push(sm.attainment_each);
            rows.push(FlipRow {
                slo,
                policy: m.policy,
                attainment_each: sm.attainment_each,
                attainment_e2e: sm.attainment,
                p90_ttft_ms: sm.ttft.p90,
                p90_tpot_ms: sm.tpot.p90,
            });
        }
    }
    chart::bar_chart(
        &out.join("taichi_flip.png"),
        &format!("TaiChi's flip: ArXiv-like at {rate}/s on {split} (TTFT and TPOT each met)"),
        "SLO attainment",
        &cats,
        &bars,
        true,
    )
    .map_err(|e| BenchError::Experiment(e.to_string()))?;
    Ok(rows)
}

//! Online learning after a split change (issue 14 item 10): the split changes, no table exists
//! for the new one, and the router starts from the nearest split's table and keeps learning on
//! live traffic. Attainment over simulated time against the offline table learned for the new
//! split, and what exploring costs on top of that offline table.

use std::fmt::Write as _;

use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::online::{OnlineConfig, seed_table};
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_router::dolphin::{CompiledTable, RoutingTable, Split, TrustConfig};
use dolphin_router::policy::{DolphinConfig, Policy, ThresholdConfig};
use dolphin_sim::SimReport;
use dolphin_workload::Workload;
use serde::Serialize;

use super::shift::Samples;
use super::{LoadKind, Setup, find_load, learn, learn_err};
use crate::BenchError;

/// Minutes per window of the attainment-over-time rows.
pub const WINDOW_MIN: f64 = 5.0;

/// One policy's run over the long traffic.
#[derive(Debug, Serialize)]
pub struct OnlineSeries {
    /// What routed.
    pub policy: String,
    /// Attainment per window of arrival time ([`WINDOW_MIN`] minutes each).
    pub windows: Vec<f64>,
    /// Attainment of the requests that arrived from minute 20 on.
    pub after_20_min: f64,
    /// Attainment of every request.
    pub overall: f64,
    /// Bits the online learner flipped, with the simulated minute of each.
    pub flips: Vec<(f64, u32, String)>,
    /// Requests explored.
    pub explored: u64,
}

/// A split change: the table of `from` seeds `to`.
#[derive(Debug, Serialize)]
pub struct OnlineRow {
    /// The workload.
    pub workload: String,
    /// The split with a table.
    pub from: String,
    /// The new split, without one.
    pub to: String,
    /// Poisson requests per second (where Dynamo 1.6 meets 80% on `to`).
    pub load_rps: f64,
    /// Requests in the long traffic.
    pub requests: usize,
    /// Its span in simulated minutes.
    pub minutes: f64,
    /// Dynamo 1.6, the offline table for `to`, the seed alone, and the online runs, under the
    /// first arrival seed.
    pub series: Vec<OnlineSeries>,
    /// Every policy over all arrival seeds.
    pub summary: Vec<SeedSummary>,
}

/// One policy over several arrival seeds.
#[derive(Debug, Serialize)]
pub struct SeedSummary {
    /// What routed.
    pub policy: String,
    /// Attainment from minute 20 on, per seed.
    pub after_20_min: Vec<f64>,
    /// Attainment of every request, per seed.
    pub overall: Vec<f64>,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn summarize(by_seed: &[Vec<OnlineSeries>]) -> Vec<SeedSummary> {
    let Some(first) = by_seed.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(i, s)| SeedSummary {
            policy: s.policy.clone(),
            after_20_min: by_seed.iter().map(|run| run[i].after_20_min).collect(),
            overall: by_seed.iter().map(|run| run[i].overall).collect(),
        })
        .collect()
}

fn write_summary(md: &mut String, seeds: &[u64], summary: &[SeedSummary]) {
    let _ = writeln!(
        md,
        "\nOver {} arrival seeds ({}): mean attainment, and its change against the offline table (row 2) in points, the worst seed in brackets.\n\n| policy | from minute 20 | change | overall | change |\n|---|---|---|---|---|",
        seeds.len(),
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let Some(offline) = summary.get(1) else {
        return;
    };
    let change = |v: &[f64], base: &[f64]| {
        let d: Vec<f64> = v.iter().zip(base).map(|(a, b)| (a - b) * 100.0).collect();
        format!(
            "{:+.1} ({:+.1})",
            mean(&d),
            d.iter().copied().fold(f64::INFINITY, f64::min)
        )
    };
    for s in summary {
        let _ = writeln!(
            md,
            "| {} | {:.3} | {} | {:.3} | {} |",
            s.policy,
            mean(&s.after_20_min),
            change(&s.after_20_min, &offline.after_20_min),
            mean(&s.overall),
            change(&s.overall, &offline.overall),
        );
    }
}

fn series(name: &str, report: &SimReport) -> OnlineSeries {
    let windows_n = (report
        .records
        .iter()
        .map(|r| r.arrival_ms)
        .fold(0.0, f64::max)
        / (WINDOW_MIN * 60_000.0))
        .floor() as usize
        + 1;
    let (mut met, mut all) = (vec![0u64; windows_n], vec![0u64; windows_n]);
    let (mut late_met, mut late) = (0u64, 0u64);
    for r in &report.records {
        let w = ((r.arrival_ms / (WINDOW_MIN * 60_000.0)).floor() as usize).min(windows_n - 1);
        all[w] += 1;
        met[w] += u64::from(r.met);
        if r.arrival_ms >= 20.0 * 60_000.0 {
            late += 1;
            late_met += u64::from(r.met);
        }
    }
    let online = report.online.as_ref();
    OnlineSeries {
        policy: name.to_owned(),
        windows: met
            .iter()
            .zip(&all)
            .map(|(&m, &a)| if a == 0 { 0.0 } else { m as f64 / a as f64 })
            .collect(),
        after_20_min: late_met as f64 / late.max(1) as f64,
        overall: report.attainment,
        flips: online.map_or_else(Vec::new, |o| {
            o.flips
                .iter()
                .map(|f| {
                    let how = if f.adopted { "adopted" } else { "to" };
                    (
                        f.at_ms / 60_000.0,
                        f.cluster,
                        format!("{how} {}", f.to.as_str()),
                    )
                })
                .collect()
        }),
        explored: online.map_or(0, |o| o.explored),
    }
}

/// The online settings the experiment runs: the router's defaults (a 10% share), half that
/// share (the default before 2026-12-05), and a faster one.
pub fn settings() -> [(&'static str, OnlineConfig); 3] {
    let defaults = OnlineConfig {
        enabled: true,
        ..OnlineConfig::default()
    };
    [
        ("defaults", defaults),
        (
            "share 0.05",
            OnlineConfig {
                explore_share: 0.05,
                ..defaults
            },
        ),
        (
            "share 0.2, 10 samples",
            OnlineConfig {
                explore_share: 0.2,
                min_samples: 10,
                ..defaults
            },
        ),
    ]
}

/// For each `(workload, from, to)`: the load where Dynamo 1.6 meets 80% on `to` (arrival seed
/// 2), tables learned offline on `from` and on `to` at that load (training sample, seed 1),
/// then the long traffic on `to`, under each arrival seed of `seeds`: Dynamo 1.6, the offline
/// `to` table, the `from` table with every bit taken, the `from` table learning online, and the
/// offline `to` table learning online.
pub fn split_change(
    base: &Setup,
    changes: &[(&str, Split, Split)],
    samples: &Samples<'_>,
    long: &dyn Fn(&str) -> Workload,
    seeds: &[u64],
    md: &mut String,
) -> Result<Vec<OnlineRow>, BenchError> {
    let mut rows = Vec::new();
    for &(name, from, to) in changes {
        let (train, _) = samples(name)?;
        let base = &base.with_classifier_for(name, &train)?;
        let traffic = long(name);
        let at = |split: Split| Setup {
            split,
            ..base.clone()
        };
        // Found on the long traffic itself: a load a short sample meets can still grow a queue
        // that swamps everything after its first minutes.
        let Some(load) = find_load(&at(to), &traffic, LoadKind::Poisson, 0.8)? else {
            let _ = writeln!(
                md,
                "\n{name} {from} to {to}: no load where Dynamo 1.6 meets 80%."
            );
            continue;
        };
        // Training traffic arrives with one seed, the long traffic with the seed `find_load`
        // measured it with.
        let arrivals = LoadKind::Poisson.arrivals(load, 1);
        let learned = |split: Split| -> Result<RoutingTable, BenchError> {
            let s = Setup {
                arrivals,
                ..at(split)
            };
            Ok(learn(
                &s,
                &train,
                &s.fit(name, 8, ClusterMethod::Kmeans, 1),
                &SearchConfig::new(8),
            )?
            .table)
        };
        let offline = learned(to)?;
        let seed = seed_table(&learned(from)?, to, "offline");
        let compile = |t: &RoutingTable| {
            CompiledTable::compile(t.clone())
                .map_err(|e| BenchError::Experiment(format!("table: {e}")))
        };
        let dolphin = |online, trust| {
            Policy::Dolphin(DolphinConfig {
                online,
                trust,
                ..DolphinConfig::default()
            })
        };
        let off = OnlineConfig::default();
        let checked = TrustConfig::default();
        let all = TrustConfig {
            enabled: false,
            ..checked
        };
        let runs: Vec<(String, &RoutingTable, OnlineConfig, TrustConfig)> =
            std::iter::once((format!("offline table for {to}"), &offline, off, checked))
                .chain(std::iter::once((
                    format!("{from}'s table, every bit taken, not learning"),
                    &seed,
                    off,
                    all,
                )))
                .chain(settings().into_iter().map(|(label, cfg)| {
                    (
                        format!("{from}'s table, learning online ({label})"),
                        &seed,
                        cfg,
                        checked,
                    )
                }))
                .chain(settings().into_iter().map(|(label, cfg)| {
                    (
                        format!("offline table for {to}, learning online ({label})"),
                        &offline,
                        cfg,
                        checked,
                    )
                }))
                .collect();
        // Per arrival seed, every policy's series (Dynamo 1.6 first).
        let mut by_seed: Vec<Vec<OnlineSeries>> = Vec::new();
        let mut first_dynamo = None;
        for &seed_arrivals in seeds {
            let s = Setup {
                arrivals: LoadKind::Poisson.arrivals(load, seed_arrivals),
                ..at(to)
            };
            let mut target = s.target(&traffic)?;
            let dynamo = target
                .run_report(Policy::Threshold(ThresholdConfig::default()), None)
                .map_err(learn_err)?;
            let mut series_of = vec![series("Dynamo 1.6 (no table: the fallback)", &dynamo)];
            for (label, table, online, trust) in &runs {
                let report = target
                    .run_report(dolphin(*online, *trust), Some(compile(table)?))
                    .map_err(learn_err)?;
                series_of.push(series(label, &report));
            }
            first_dynamo.get_or_insert(dynamo);
            by_seed.push(series_of);
        }
        let (Some(dynamo), Some(series_of)) = (first_dynamo, by_seed.first()) else {
            continue;
        };
        let minutes = dynamo
            .records
            .iter()
            .map(|r| r.arrival_ms)
            .fold(0.0, f64::max)
            / 60_000.0;
        write_row(
            md,
            name,
            from,
            to,
            load,
            traffic.requests.len(),
            minutes,
            series_of,
        );
        let summary = summarize(&by_seed);
        write_summary(md, seeds, &summary);
        rows.push(OnlineRow {
            workload: name.to_owned(),
            from: from.to_string(),
            to: to.to_string(),
            load_rps: load,
            requests: traffic.requests.len(),
            minutes,
            series: by_seed.swap_remove(0),
            summary,
        });
    }
    Ok(rows)
}

#[allow(clippy::too_many_arguments)]
fn write_row(
    md: &mut String,
    name: &str,
    from: Split,
    to: Split,
    load: f64,
    requests: usize,
    minutes: f64,
    series: &[OnlineSeries],
) {
    let windows = series.iter().map(|s| s.windows.len()).max().unwrap_or(0);
    let _ = writeln!(
        md,
        "\n### {name}: {from} to {to}\n\n{requests} requests over {minutes:.0} simulated minutes, Poisson at {load:.2} requests per second (Dynamo 1.6 meets 80% on {to} there). Attainment per {WINDOW_MIN:.0}-minute window of arrival time, from minute 20 on, and overall; changes of the online learner (minute: cluster, new path; \"adopted\": a cluster the fallback routed takes a path).\n"
    );
    md.push_str("| policy |");
    for w in 0..windows {
        let _ = write!(md, " {}-{} min |", w * 5, (w + 1) * 5);
    }
    md.push_str(" from minute 20 | overall | explored | flips |\n|---|");
    for _ in 0..windows + 4 {
        md.push_str("---|");
    }
    md.push('\n');
    for s in series {
        let _ = write!(md, "| {} |", s.policy);
        for w in 0..windows {
            match s.windows.get(w) {
                Some(a) => {
                    let _ = write!(md, " {a:.3} |");
                }
                None => md.push_str(" |"),
            }
        }
        let flips = s
            .flips
            .iter()
            .map(|(m, c, to)| format!("{m:.1}: {c} {to}"))
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(
            md,
            " {:.3} | {:.3} | {} | {} |",
            s.after_20_min, s.overall, s.explored, flips
        );
    }
}

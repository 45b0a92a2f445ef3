//! Issue 14 item 6: can `linfa-clustering`'s Gaussian mixture replace the tables' own fit?
//!
//! The tables' mixtures are diagonal (`docs/architecture.md`, "Learned routing"); linfa 0.8.1
//! fits full covariances only (`GmmCovarType::Full`). On the standardized features of a real
//! learning run (Hybrid and the Mooncake trace, 400 requests gathered under Dynamo 1.6 on the
//! simulator, as `dolphinctl learn --target sim` gathers them), this fits K = 8 both ways over
//! several seeds and reports: whether linfa's fit succeeds, its time, the mean log-likelihood of
//! each model, how often linfa's full-covariance assignment agrees with the diagonal model the
//! router would run if linfa's covariances were cut to their diagonals (pair-counting Rand
//! index), and how the tables' own diagonal fit compares. Writes `bench/results/linfa_gmm.json`.
//!
//! `cargo run --release -p dolphin-bench --bin linfa_gmm` (seconds).

use std::time::Instant;

use anyhow::Context;
use dolphin_engine::SimProfile;
use dolphin_learn::gmm::{self, Gmm};
use dolphin_learn::kmeans::Point;
use dolphin_learn::measure::records_from_outcomes;
use dolphin_learn::sim_target::SimTarget;
use dolphin_learn::stats;
use dolphin_router::dolphin::CompiledTable;
use dolphin_router::dolphin::table::N_FEATURES;
use dolphin_router::policy::{Policy, ThresholdConfig};
use dolphin_sim::SimClusterConfig;
use dolphin_workload::{Arrivals, Slo, Workload, synthetic, trace};
use linfa::DatasetBase;
use linfa::traits::{Fit, Predict};
use linfa_clustering::GaussianMixtureModel;
use rand_xoshiro::Xoshiro256Plus;
use rand_xoshiro::rand_core::SeedableRng;
use serde::Serialize;

const K: usize = 8;
const SEEDS: u64 = 5;

#[derive(Serialize)]
struct Run {
    seed: u64,
    /// linfa's error, if its fit failed.
    error: Option<String>,
    fit_ms: f64,
    /// Mean log-likelihood per point under linfa's full-covariance model.
    full_log_likelihood: Option<f64>,
    /// The same model with each covariance cut to its diagonal (what a table could hold).
    diagonal_cut_log_likelihood: Option<f64>,
    /// Rand index between linfa's assignment and the diagonal cut's.
    agreement_full_vs_cut: Option<f64>,
    /// Rand index between linfa's assignment and the tables' own diagonal fit's.
    agreement_full_vs_ours: Option<f64>,
}

#[derive(Serialize)]
struct WorkloadResult {
    workload: String,
    points: usize,
    /// The tables' own diagonal fit (seed 1): mean log-likelihood, time.
    ours_log_likelihood: f64,
    ours_fit_ms: f64,
    linfa: Vec<Run>,
}

#[derive(Serialize)]
struct Report {
    cpu: String,
    cpu_flags: Vec<&'static str>,
    k: usize,
    workloads: Vec<WorkloadResult>,
}

/// The standardized features of `w`'s requests, gathered under Dynamo 1.6 on 3p1d.
fn points(w: &Workload) -> anyhow::Result<Vec<Point>> {
    let profile = SimProfile::builtin("qwen72b-h20").context("profile")?;
    let mut cfg = SimClusterConfig::new(3, 1, profile);
    cfg.total_blocks = 100_000;
    let mut target = SimTarget::new(
        cfg,
        w,
        Arrivals::ClosedLoop { concurrency: 32 },
        Slo::new(5000.0, 250.0),
    )?;
    target.cap_max_tokens();
    let outcomes = target.run(Policy::Threshold(ThresholdConfig::default()), None)?;
    let raw: Vec<Point> = records_from_outcomes(&outcomes)
        .iter()
        .filter(|r| r.features.isl > 0)
        .map(|r| CompiledTable::raw(&r.features))
        .collect();
    let s = stats::fit_standardizer(&raw, &[true; N_FEATURES]);
    Ok(raw.iter().map(|x| stats::standardize(&s, x)).collect())
}

/// Mean log-likelihood of `points` under `g`.
fn log_likelihood(g: &Gmm, points: &[Point]) -> f64 {
    let per_point = |p: &Point| {
        let l: Vec<f64> = (0..g.weights.len()).map(|k| g.log_joint(k, p)).collect();
        let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + l.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    };
    points.iter().map(per_point).sum::<f64>() / points.len().max(1) as f64
}

/// Mean log-likelihood under a full-covariance mixture (Cholesky of each 4x4 covariance).
fn full_log_likelihood(m: &GaussianMixtureModel<f64>, points: &[Point]) -> Option<f64> {
    let k = m.weights().len();
    let mut comps = Vec::with_capacity(k);
    for c in 0..k {
        let cov = m.covariances().index_axis(ndarray::Axis(0), c);
        let mut l = [[0.0; N_FEATURES]; N_FEATURES];
        for i in 0..N_FEATURES {
            for j in 0..=i {
                let s = cov[[i, j]] - (0..j).map(|p| l[i][p] * l[j][p]).sum::<f64>();
                if i == j {
                    if s <= 0.0 {
                        return None;
                    }
                    l[i][i] = s.sqrt();
                } else {
                    l[i][j] = s / l[j][j];
                }
            }
        }
        let log_det: f64 = (0..N_FEATURES).map(|i| 2.0 * l[i][i].ln()).sum();
        comps.push((m.weights()[c].ln(), m.means().row(c).to_vec(), l, log_det));
    }
    let ln2pi = (2.0 * std::f64::consts::PI).ln();
    let per_point = |p: &Point| {
        let l: Vec<f64> = comps
            .iter()
            .map(|(lw, mean, chol, log_det)| {
                // Solve L y = x - mean; the Mahalanobis distance is |y|^2.
                let mut y = [0.0; N_FEATURES];
                for i in 0..N_FEATURES {
                    let s = p[i] - mean[i] - (0..i).map(|j| chol[i][j] * y[j]).sum::<f64>();
                    y[i] = s / chol[i][i];
                }
                let d2: f64 = y.iter().map(|v| v * v).sum();
                lw - 0.5 * (N_FEATURES as f64 * ln2pi + log_det + d2)
            })
            .collect();
        let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + l.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    };
    Some(points.iter().map(per_point).sum::<f64>() / points.len().max(1) as f64)
}

/// Pair-counting agreement of two partitions (1: the same up to relabelling).
fn rand_index(a: &[usize], b: &[usize]) -> f64 {
    let n = a.len();
    let (mut same, mut pairs) = (0u64, 0u64);
    for i in 0..n {
        for j in i + 1..n {
            pairs += 1;
            same += u64::from((a[i] == a[j]) == (b[i] == b[j]));
        }
    }
    same as f64 / pairs.max(1) as f64
}

fn run(points: &[Point], ours: &[usize], seed: u64) -> Run {
    let flat: Vec<f64> = points.iter().flatten().copied().collect();
    let data = match ndarray::Array2::from_shape_vec((points.len(), N_FEATURES), flat) {
        Ok(d) => d,
        Err(e) => {
            return Run {
                seed,
                error: Some(e.to_string()),
                fit_ms: 0.0,
                full_log_likelihood: None,
                diagonal_cut_log_likelihood: None,
                agreement_full_vs_cut: None,
                agreement_full_vs_ours: None,
            };
        }
    };
    let ds = DatasetBase::from(data.clone());
    let t = Instant::now();
    let fitted = GaussianMixtureModel::params(K)
        .with_rng(Xoshiro256Plus::seed_from_u64(seed))
        .max_n_iterations(300)
        .tolerance(1e-4)
        .fit(&ds);
    let fit_ms = t.elapsed().as_secs_f64() * 1e3;
    let m = match fitted {
        Ok(m) => m,
        Err(e) => {
            return Run {
                seed,
                error: Some(e.to_string()),
                fit_ms,
                full_log_likelihood: None,
                diagonal_cut_log_likelihood: None,
                agreement_full_vs_cut: None,
                agreement_full_vs_ours: None,
            };
        }
    };
    let full: Vec<usize> = m.predict(&data).to_vec();
    let cut = Gmm {
        weights: m.weights().to_vec(),
        means: m
            .means()
            .rows()
            .into_iter()
            .map(|r| std::array::from_fn(|d| r[d]))
            .collect(),
        variances: (0..K)
            .map(|c| std::array::from_fn(|d| m.covariances()[[c, d, d]].max(gmm::VARIANCE_FLOOR)))
            .collect(),
        mean_log_likelihood: 0.0,
        iterations: 0,
    };
    let cut_labels: Vec<usize> = points.iter().map(|p| cut.most_likely(p)).collect();
    Run {
        seed,
        error: None,
        fit_ms,
        full_log_likelihood: full_log_likelihood(&m, points),
        diagonal_cut_log_likelihood: Some(log_likelihood(&cut, points)),
        agreement_full_vs_cut: Some(rand_index(&full, &cut_labels)),
        agreement_full_vs_ours: Some(rand_index(&full, ours)),
    }
}

fn main() -> anyhow::Result<()> {
    let mooncake = trace::mooncake(std::path::Path::new(
        "../shared/traces/mooncake-conversation.jsonl",
    ));
    let mut workloads = vec![("hybrid".to_owned(), synthetic::hybrid(400, 1))];
    match mooncake {
        Ok(mut w) => {
            w.requests.truncate(400);
            workloads.push(("mooncake".to_owned(), w));
        }
        Err(e) => eprintln!("skipping the Mooncake trace: {e}"),
    }
    let mut results = Vec::new();
    for (name, w) in &workloads {
        let pts = points(w)?;
        let t = Instant::now();
        let ours = gmm::fit(&pts, K, 300, 1)?;
        let ours_fit_ms = t.elapsed().as_secs_f64() * 1e3;
        let labels: Vec<usize> = pts.iter().map(|p| ours.most_likely(p)).collect();
        let runs: Vec<Run> = (0..SEEDS).map(|s| run(&pts, &labels, s)).collect();
        println!(
            "{name}: {} points; ours (diagonal EM): log-likelihood {:.3}, {:.1} ms",
            pts.len(),
            log_likelihood(&ours, &pts),
            ours_fit_ms
        );
        for r in &runs {
            match &r.error {
                Some(e) => println!(
                    "  linfa seed {}: failed after {:.1} ms: {e}",
                    r.seed, r.fit_ms
                ),
                None => println!(
                    "  linfa seed {}: {:.1} ms, log-likelihood full {:.3}, cut to diagonal {:.3}; agreement full vs cut {:.3}, full vs ours {:.3}",
                    r.seed,
                    r.fit_ms,
                    r.full_log_likelihood.unwrap_or(f64::NAN),
                    r.diagonal_cut_log_likelihood.unwrap_or(f64::NAN),
                    r.agreement_full_vs_cut.unwrap_or(f64::NAN),
                    r.agreement_full_vs_ours.unwrap_or(f64::NAN),
                ),
            }
        }
        results.push(WorkloadResult {
            workload: name.clone(),
            points: pts.len(),
            ours_log_likelihood: log_likelihood(&ours, &pts),
            ours_fit_ms,
            linfa: runs,
        });
    }
    let path = dolphin_bench::results::write_json(
        "linfa_gmm",
        None,
        &Report {
            cpu: dolphin_bench::machine::cpu_name(),
            cpu_flags: dolphin_bench::machine::cpu_flags(),
            k: K,
            workloads: results,
        },
    )?;
    println!("wrote {}", path.display());
    Ok(())
}

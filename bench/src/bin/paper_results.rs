//! The simulator experiments of `docs/results.md`, on the 72B-like profile (`qwen72b-h20`):
//! TaiChi's flip, the learned table against Dynamo's rules and the fixed policies on mixed and
//! real-trace workloads and on each single-type workload, and the ablations (K, no scan, no
//! output-length feature, k-means against GMM). Writes `docs/results/results.json`, the charts
//! (`docs/results/*.png`) and the tables (`docs/results/tables.md`), and prints the tables.
//!
//! ```sh
//! cargo run --release -p dolphin-bench --bin paper_results            # about a minute
//! ```
//!
//! Every table is learned on one sample of a workload (seed 1, or the trace's first N rows) and
//! measured on another (seed 2, or the next N rows), under closed-loop (saturated) load.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Parser;
use dolphin_bench::BenchError;
use dolphin_bench::experiments::{
    Ablation, Baseline, Comparison, FlipRow, Setup, ablations, attainment_bars, best_baseline,
    cdfs, change_pct, flip, learn, run_baseline, run_table,
};
use dolphin_engine::SimProfile;
use dolphin_learn::fit::FitConfig;
use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_router::dolphin::{Reward, Split};
use dolphin_workload::{Arrivals, Slo, Workload, synthetic, trace};
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(about = "Simulator experiments of docs/results.md")]
struct Args {
    /// Where the JSON, the charts and the tables go.
    #[arg(long, default_value = "docs/results")]
    out: PathBuf,
    /// Requests in each training and each test sample.
    #[arg(long, default_value_t = 400)]
    requests: usize,
    /// Closed-loop concurrencies (requests in flight) of the comparisons, one table each.
    #[arg(long, value_delimiter = ',', default_value = "16,32")]
    concurrency: Vec<u32>,
    /// Closed-loop concurrency of the ablations.
    #[arg(long, default_value_t = 32)]
    ablation_concurrency: u32,
    /// TTFT SLO, ms.
    #[arg(long, default_value_t = 5000.0)]
    slo_ttft_ms: f64,
    /// TPOT SLO, ms.
    #[arg(long, default_value_t = 250.0)]
    slo_tpot_ms: f64,
    /// Seeds of the ablations (each configuration is learned once per seed).
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// TaiChi's flip: the split.
    #[arg(long, default_value = "2p3d")]
    flip_split: Split,
    /// TaiChi's flip: ArXiv-like requests per second (Poisson).
    #[arg(long, default_value_t = 0.7)]
    flip_rate: f64,
    /// Only TaiChi's flip (for exploring its load).
    #[arg(long)]
    flip_only: bool,
    /// The Mooncake conversation trace.
    #[arg(long, default_value = "../shared/traces/mooncake-conversation.jsonl")]
    mooncake: PathBuf,
}

#[derive(Serialize)]
struct Results {
    profile: String,
    requests: usize,
    concurrency: Vec<u32>,
    ablation_concurrency: u32,
    slo: Slo,
    flip: Vec<FlipRow>,
    comparisons: Vec<Comparison>,
    ablations: Vec<Ablation>,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("paper_results: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), BenchError> {
    let profile = SimProfile::builtin("qwen72b-h20")
        .ok_or_else(|| BenchError::Experiment("the qwen72b-h20 profile is missing".into()))?;
    let slo = Slo::new(args.slo_ttft_ms, args.slo_tpot_ms);
    std::fs::create_dir_all(&args.out)
        .map_err(BenchError::io(format!("create {}", args.out.display())))?;
    let mut md = String::new();
    let setup = |split: Split, concurrency: u32| Setup {
        profile: profile.clone(),
        split,
        total_blocks: 100_000,
        arrivals: Arrivals::ClosedLoop { concurrency },
        slo,
    };

    let flip = flip(
        &profile,
        args.flip_split,
        args.flip_rate,
        &args.out,
        &mut md,
    )?;
    if args.flip_only {
        println!("{md}");
        return Ok(());
    }

    let mut comparisons = Vec::new();
    let mooncake =
        trace::mooncake(&args.mooncake).map_err(|e| BenchError::Experiment(e.to_string()))?;
    let samples = |name: &str| -> Result<(Workload, Workload), BenchError> {
        let n = args.requests;
        Ok(match name {
            "mooncake" => {
                let mut train = mooncake.clone();
                let mut test = mooncake.clone();
                if mooncake.requests.len() < 2 * n {
                    return Err(BenchError::Experiment(format!(
                        "the Mooncake trace has fewer than {} rows",
                        2 * n
                    )));
                }
                train.requests = mooncake.requests[..n].to_vec();
                test.requests = mooncake.requests[n..2 * n].to_vec();
                (train, test)
            }
            "arxiv" => (synthetic::arxiv(n, 1), synthetic::arxiv(n, 2)),
            "leval" => (synthetic::leval(n, 1), synthetic::leval(n, 2)),
            "humaneval" => (synthetic::humaneval(n, 1), synthetic::humaneval(n, 2)),
            _ => (synthetic::hybrid(n, 1), synthetic::hybrid(n, 2)),
        })
    };
    for &concurrency in &args.concurrency {
        let _ = writeln!(
            md,
            "\n## Learned table against the fixed rules, {} in flight\n\n{} test requests per row, closed loop at {} in flight, SLO {} ms TTFT / {} ms TPOT; change against Dynamo 1.6 in brackets.\n",
            concurrency, args.requests, concurrency, slo.ttft_ms, slo.tpot_ms
        );
        md.push_str("| workload | split | policy | attainment | P90 TTFT ms | P90 TPOT ms | remote | per-metric attainment |\n|---|---|---|---|---|---|---|---|\n");
        let mut per_metric = format!(
            "\n### Per-metric reward, {concurrency} in flight\n\nAttainment with TTFT and TPOT each within their SLO (TaiChi's criterion), change against Dynamo 1.6 in points: the best baseline by this measure, the table learned with the e2e reward, and the table learned with the per-metric reward (`dolphinctl learn --reward per-metric`).\n\n| workload | split | Dynamo 1.6 | best baseline | learned, e2e reward | learned, per-metric reward |\n|---|---|---|---|---|---|\n"
        );
        let mut vs_best = format!(
            "\n### The learned table against the best baseline, {concurrency} in flight\n\nThe baseline with the highest attainment in each setting (of the {} above), and the learned table's attainment and P90 changes against it.\n\n| workload | split | best baseline | its attainment | learned | P90 TTFT | P90 TPOT |\n|---|---|---|---|---|---|---|\n",
            Baseline::ALL.len()
        );
        let mixed = [
            ("hybrid", "3p1d"),
            ("hybrid", "2p2d"),
            ("mooncake", "3p1d"),
            ("mooncake", "2p2d"),
        ];
        let single = [("arxiv", "3p1d"), ("leval", "3p1d"), ("humaneval", "3p1d")];
        for (name, split) in mixed.iter().chain(&single) {
            let split: Split = split
                .parse()
                .map_err(|e| BenchError::Experiment(format!("{e}")))?;
            let s = setup(split, concurrency);
            let (train, test) = samples(name)?;
            let learned = learn(
                &s,
                &train,
                &s.fit(name, 8, ClusterMethod::Kmeans, 1),
                &SearchConfig::new(8),
            )?;
            let learned_per_metric = learn(
                &s,
                &train,
                &FitConfig {
                    reward: Reward::PerMetric,
                    ..s.fit(name, 8, ClusterMethod::Kmeans, 1)
                },
                &SearchConfig::new(8),
            )?;
            let mut target = s.target(&test)?;
            let mut rows = Vec::new();
            for b in Baseline::ALL {
                rows.push(run_baseline(&mut target, b)?);
            }
            rows.push(run_table(
                &mut target,
                "learned (k-means, K=8)",
                &learned.table,
            )?);
            rows.push(run_table(
                &mut target,
                "learned, per-metric reward",
                &learned_per_metric.table,
            )?);
            let dynamo = rows[2].summary.clone();
            for r in &rows {
                let s = &r.summary;
                let _ = writeln!(
                    md,
                    "| {name} | {split} | {} | {:.3} ({:+.1} pt) | {:.0} ({:+.1}%) | {:.1} ({:+.1}%) | {:.0}% | {:.3} ({:+.1} pt) |",
                    r.policy,
                    s.attainment,
                    (s.attainment - dynamo.attainment) * 100.0,
                    s.ttft.p90,
                    change_pct(dynamo.ttft.p90, s.ttft.p90),
                    s.tpot.p90,
                    change_pct(dynamo.tpot.p90, s.tpot.p90),
                    100.0 * s.remote as f64 / s.requests.max(1) as f64,
                    s.attainment_each,
                    (s.attainment_each - dynamo.attainment_each) * 100.0,
                );
            }
            let baselines = &rows[..Baseline::ALL.len()];
            let best = best_baseline(baselines, |s| s.attainment);
            let (learned_e2e, learned_pm) = (&rows[baselines.len()], &rows[baselines.len() + 1]);
            let each = |m: &dolphin_bench::experiments::Measured| {
                let a = m.summary.attainment_each;
                format!("{a:.3} ({:+.1} pt)", (a - dynamo.attainment_each) * 100.0)
            };
            if let Some(b) = best_baseline(baselines, |s| s.attainment_each) {
                let _ = writeln!(
                    per_metric,
                    "| {name} | {split} | {:.3} | {} {} | {} | {} |",
                    dynamo.attainment_each,
                    b.policy,
                    each(b),
                    each(learned_e2e),
                    each(learned_pm),
                );
            }
            if let Some(b) = best {
                let l = learned_e2e;
                let _ = writeln!(
                    vs_best,
                    "| {name} | {split} | {} | {:.3} | {:.3} ({:+.1} pt) | {:+.1}% | {:+.1}% |",
                    b.policy,
                    b.summary.attainment,
                    l.summary.attainment,
                    (l.summary.attainment - b.summary.attainment) * 100.0,
                    change_pct(b.summary.ttft.p90, l.summary.ttft.p90),
                    change_pct(b.summary.tpot.p90, l.summary.tpot.p90),
                );
            }
            let best = best.map_or(String::new(), |b| b.policy.clone());
            if *name == "hybrid" || *name == "mooncake" {
                cdfs(&args.out, &format!("{name}_{split}_c{concurrency}"), &rows)?;
            }
            comparisons.push(Comparison {
                concurrency,
                workload: (*name).to_owned(),
                split: split.to_string(),
                rows,
                learned_rounds: learned.search.rounds,
                learned_converged_round: learned.search.converged_round,
                learned_bits: learned.search.bits.clone(),
                best_baseline: best,
            });
        }
        md.push_str(&vs_best);
        md.push_str(&per_metric);
    }
    attainment_bars(&args.out, &comparisons)?;

    let ablations = ablations(
        &setup(Split::new(3, 1), args.ablation_concurrency),
        &samples("hybrid")?,
        args.seeds,
        &args.out,
        &mut md,
    )?;

    let results = Results {
        profile: profile.name.clone(),
        requests: args.requests,
        concurrency: args.concurrency.clone(),
        ablation_concurrency: args.ablation_concurrency,
        slo,
        flip,
        comparisons,
        ablations,
    };
    let json = args.out.join("results.json");
    dolphin_bench::results::write_json("paper_results", Some(&json), &results)?;
    let tables = args.out.join("tables.md");
    std::fs::write(&tables, &md).map_err(BenchError::io(format!("write {}", tables.display())))?;
    println!("{md}");
    println!(
        "wrote {}, {} and the charts in {}",
        json.display(),
        tables.display(),
        args.out.display()
    );
    Ok(())
}

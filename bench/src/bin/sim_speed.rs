//! Speed of the cluster simulator (`dolphin-sim`): a Hybrid-like workload of 100,000 requests
//! on 64 prefill + 64 decode workers with the 72B-like profile, on one core. Target: at most
//! 10 s for the run (CPU time of the process; wall time is reported beside it, as the two differ
//! on a shared machine).
//!
//! The workload mixes three request types in equal shares: ArXiv-like (6k-10k-token prompts,
//! nothing shared), L-Eval-like (a 19k-token document shared by about 16 questions, plus the
//! question) and HumanEval-like (about 200 tokens). Prompts are built from hash ids (one per
//! 512 tokens, as in Mooncake traces); arrivals are Poisson. The policy is Dynamo 1.6's
//! threshold rule: requests whose prompt is mostly cached on their decode worker prefill locally,
//! the rest (almost all here) remotely.
//!
//! `cargo run --release -p dolphin-bench --bin sim_speed [-- --requests 100000]`

use std::time::Instant;

use anyhow::ensure;
use clap::{Parser, ValueEnum};
use dolphin_bench::stats::median;
use dolphin_engine::SimProfile;
use dolphin_router::policy::{Decision, Policy, ThresholdConfig};
use dolphin_sim::{PrefixLookup, SimCluster, SimClusterConfig, SimReport, SimRequest, Slo};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

// The KV pool queues a small vector per cache event; mimalloc makes those cheap, as it does for
// the router and dolphinctl (whose learn and replay --target sim run this simulator): with
// glibc's malloc this run took 4-5% longer (14.4-14.6 s against 13.6-13.9 s, 2026-12-06).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Issue 11: at most 10 s on one core (issue 3 asked for 60 s).
const TARGET_S: f64 = 10.0;
const TOKENS_PER_ID: u32 = 512;

/// `--prefix-lookup`: [`PrefixLookup`] on the command line and in the result.
#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Lookup {
    Pools,
    RouterIndex,
}

#[derive(Debug, Parser)]
#[command(about = "Wall time of the cluster simulator on a large cluster and workload")]
struct Args {
    /// Requests to simulate.
    #[arg(long, default_value_t = 100_000)]
    requests: u32,
    /// Prefill workers.
    #[arg(long, default_value_t = 64)]
    prefill: u32,
    /// Decode workers.
    #[arg(long, default_value_t = 64)]
    decode: u32,
    /// Arrival rate, requests per simulated second (16 keeps the prefill pool below saturation
    /// under Dynamo's rule, which sends almost every request remote here).
    #[arg(long, default_value_t = 16.0)]
    rate: f64,
    /// KV blocks (of 16 tokens) per worker: 256k tokens, 80 GiB of the 72B model's KV.
    #[arg(long, default_value_t = 16_384)]
    total_blocks: u32,
    /// Timing profile.
    #[arg(long, default_value = "qwen72b-h20")]
    profile: String,
    /// How often the simulated router refreshes its view of worker load, ms (0: instantly).
    #[arg(long, default_value_t = dolphin_sim::DEFAULT_LOAD_INTERVAL_MS)]
    load_interval_ms: f64,
    /// Where the simulated router reads the workers' cached prefixes: `pools` (the pools
    /// themselves, the simulator's default) or `router-index` (the router's index, fed by cache
    /// events). Both give the same outcome.
    #[arg(long, value_enum, default_value_t = Lookup::Pools)]
    prefix_lookup: Lookup,
    /// Workload seed.
    #[arg(long, default_value_t = 20_261_129)]
    seed: u64,
    /// Runs of the same simulation (deterministic: each gives the same outcome); the result
    /// reports every run's time and judges the median, since a shared host slows some runs.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Where to write the result (default: bench/results/sim_speed.json).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct Workload {
    requests: u32,
    rate_per_s: f64,
    mix: &'static str,
    prompt_tokens_mean: f64,
    output_tokens_mean: f64,
    seed: u64,
}

#[derive(Debug, Serialize)]
struct Outcome {
    p90_ttft_ms: f64,
    p90_tpot_ms: f64,
    p90_e2e_ms: f64,
    attainment: f64,
    remote_share: f64,
    simulated_s: f64,
    events: u64,
}

#[derive(Debug, Serialize)]
struct Result {
    bench: &'static str,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    split: String,
    profile: String,
    total_blocks_per_worker: u32,
    policy: &'static str,
    prefix_lookup: Lookup,
    workload: Workload,
    build_workload_s: f64,
    /// Median over the runs of the wall time of one run.
    run_wall_s: f64,
    /// Median over the runs of the process's CPU time (user + system) during one run: on a
    /// shared machine the wall time includes waiting for the core.
    run_cpu_s: f64,
    /// Every run's CPU time, in order.
    runs_cpu_s: Vec<f64>,
    events_per_s: f64,
    simulated_over_wall: f64,
    target_s: f64,
    /// `run_cpu_s < target_s`.
    passed: bool,
    /// `run_wall_s < target_s`.
    passed_wall: bool,
    outcome: Outcome,
}

/// The Hybrid-like mix (see the module docs).
fn workload(args: &Args) -> Vec<SimRequest> {
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let slo = Slo::new(5000.0, 250.0);
    let mut next_id: u64 = 1;
    let mut fresh = |n: u32| -> Vec<u64> {
        let ids = (next_id..next_id + u64::from(n)).collect();
        next_id += u64::from(n);
        ids
    };
    // L-Eval-like documents: 37 ids (about 19k tokens) each, a new one every 16 questions.
    let mut doc: Vec<u64> = Vec::new();
    let mut t = 0.0;
    (0..args.requests)
        .map(|i| {
            t += -(1.0 - rng.random::<f64>()).ln() / args.rate * 1e3;
            let (ids, prompt, output) = match i % 3 {
                0 => {
                    let prompt = rng.random_range(6144..10240u32);
                    (
                        fresh(prompt.div_ceil(TOKENS_PER_ID)),
                        prompt,
                        rng.random_range(128..384),
                    )
                }
                1 => {
                    if doc.is_empty() || rng.random_ratio(1, 16) {
                        doc = fresh(37);
                    }
                    let question = rng.random_range(64..512u32);
                    let mut ids = doc.clone();
                    ids.extend(fresh(1));
                    (
                        ids,
                        37 * TOKENS_PER_ID + question,
                        rng.random_range(32..256),
                    )
                }
                _ => (
                    fresh(1),
                    rng.random_range(120..280u32),
                    rng.random_range(64..512),
                ),
            };
            SimRequest::from_hash_ids(t, &ids, TOKENS_PER_ID, prompt, output, slo, 16)
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let profile = SimProfile::load(&args.profile)?;
    let started = Instant::now();
    let reqs = workload(&args);
    let build_workload_s = started.elapsed().as_secs_f64();

    let mut cfg = SimClusterConfig::new(args.prefill, args.decode, profile);
    cfg.total_blocks = args.total_blocks;
    cfg.load_interval_ms = args.load_interval_ms;
    cfg.policy = Policy::Threshold(ThresholdConfig::default());
    cfg.prefix_lookup = match args.prefix_lookup {
        Lookup::Pools => PrefixLookup::Pools,
        Lookup::RouterIndex => PrefixLookup::RouterIndex,
    };
    let mut sim = SimCluster::new(cfg)?;
    let cpu = dolphin_bench::proc_stat::CpuClock::new(std::process::id());
    let (mut walls, mut cpus) = (Vec::new(), Vec::new());
    let mut last: Option<SimReport> = None;
    for rep in 0..args.reps.max(1) {
        let cpu_before = cpu.cpu_time()?;
        let started = Instant::now();
        let report: SimReport = sim.run(&reqs)?;
        walls.push(started.elapsed().as_secs_f64());
        cpus.push((cpu.cpu_time()? - cpu_before).as_secs_f64());
        println!(
            "run {rep}: {:.2} s CPU, {:.2} s wall",
            cpus[rep as usize], walls[rep as usize]
        );
        ensure!(
            report.records.iter().all(|r| r.e2e_ms.is_finite()),
            "every request must finish"
        );
        if let Some(prev) = &last {
            ensure!(
                prev.events == report.events && prev.ttft.p90 == report.ttft.p90,
                "runs of the same simulation differ"
            );
        }
        last = Some(report);
    }
    let report = last.expect("at least one run");
    let run_wall_s = median(walls.iter().copied());
    let run_cpu_s = median(cpus.iter().copied());

    let n = f64::from(args.requests.max(1));
    let remote = report
        .records
        .iter()
        .filter(|r| r.decision == Decision::Remote)
        .count();
    let result = Result {
        bench: "sim_speed",
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        split: format!("{}p{}d", args.prefill, args.decode),
        profile: args.profile.clone(),
        total_blocks_per_worker: args.total_blocks,
        policy: "threshold (dynamo-1.6)",
        prefix_lookup: args.prefix_lookup,
        workload: Workload {
            requests: args.requests,
            rate_per_s: args.rate,
            mix: "hybrid: 1/3 arxiv-like 6k-10k unique, 1/3 l-eval-like 19k shared documents, 1/3 humaneval-like ~200",
            prompt_tokens_mean: reqs.iter().map(|r| f64::from(r.prompt_len)).sum::<f64>() / n,
            output_tokens_mean: reqs.iter().map(|r| f64::from(r.output_len)).sum::<f64>() / n,
            seed: args.seed,
        },
        build_workload_s,
        run_wall_s,
        run_cpu_s,
        runs_cpu_s: cpus,
        events_per_s: report.events as f64 / run_wall_s,
        simulated_over_wall: report.makespan_ms / 1e3 / run_wall_s,
        target_s: TARGET_S,
        // The target is one core's work: judged on CPU time, since on a shared machine the wall
        // time also counts the time the process waited for its core (both are reported).
        passed: run_cpu_s < TARGET_S,
        passed_wall: run_wall_s < TARGET_S,
        outcome: Outcome {
            p90_ttft_ms: report.ttft.p90,
            p90_tpot_ms: report.tpot.p90,
            p90_e2e_ms: report.e2e.p90,
            attainment: report.attainment,
            remote_share: remote as f64 / n,
            simulated_s: report.makespan_ms / 1e3,
            events: report.events,
        },
    };
    let path = dolphin_bench::results::write_json("sim_speed", args.out.as_deref(), &result)?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    println!("wrote {}", path.display());
    Ok(())
}

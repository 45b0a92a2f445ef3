//! Simulator versus live cluster: the same workload, with the same arrivals, on the cluster
//! simulator (`dolphin-sim`, through `dolphinctl replay`'s `replay_sim`) and on a live local
//! cluster of sim-engine workers (started with `dolphinctl up`, replayed with `replay_live`),
//! for each split; compares P50/P90 TTFT and TPOT (target: P90s within 15%), attainment,
//! remote share and prefix-cache hits, and pairs the two sides request by request to measure
//! the live cluster's own overhead. Writes `bench/results/sim_crosscheck.json` (and every
//! request of both sides to `<log dir>/<split>/outcomes.json`).
//!
//! Both sides get the same configuration: the profile, KV blocks per worker, block size, tokens
//! per step, router policy and overlap weight are passed to the workers and the router as
//! flags and set in the simulator from the same values; the simulator models the router's
//! periodic load reports (100 ms). The KV link is the one each live engine charges: sim-engine
//! workers move `kv_bytes_per_token x --sim-byte-scale` bytes per token over loopback TCP but
//! charge an imported prompt the profile's bytes over the profile's link (`LinkModel`, as the
//! simulator does), so the simulator keeps the profile's bytes and link; candle workers charge
//! nothing but the real transfer, so there the simulator is given the engine's real bytes per
//! token and a loopback rate.
//!
//! What the simulator leaves out on purpose is the live implementation's own cost per request
//! (gRPC hops, hashing and shipping the prompt, exporting and importing KV block by block): the
//! paired comparison reports it per path and prompt size rather than folding it into the model.
//!
//! With `--engine candle` the live workers run the real model (SmolLM2 on candle) and the
//! simulator runs the profile `dolphinctl profile fit` measured for it (`--profile FILE`), its
//! pool sized from `--kv-bytes`, its steps from the engine's `--max-batched-tokens`, its KV
//! moving the engine's real bytes per token over the loopback rate; `--length-scale` shrinks
//! the workload to what a CPU serves.
//!
//! `cargo build --release -p dolphin-bench --bin sim_crosscheck` and the router, worker and
//! dolphinctl binaries, then `target/release/sim_crosscheck [--sim-only]` (about 3 minutes).

mod cluster;
mod compare;
mod paired;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use dolphin_engine::{CandleConfig, SimConfig, SimProfile};
use dolphin_router::dolphin::Split;
use dolphin_router::policy::ThresholdConfig;
use dolphin_sim::SimClusterConfig;
use dolphin_worker_common::args::parse_bytes;
use dolphin_workload::{Arrivals, RequestOutcome, Slo, Workload, WorkloadSpec};
use dolphinctl::cli::{Engine, Policy};
use dolphinctl::replay::{LiveConfig, SimTargetConfig, replay_live, replay_sim, router_policy};
use serde::Serialize;

use crate::cluster::{LiveCluster, LiveSetup};
use crate::compare::{Diff, Side};
use crate::paired::Paired;

#[derive(Debug, Parser)]
#[command(about = "P90 TTFT / TPOT of the cluster simulator against a live sim-engine cluster")]
struct Args {
    /// Splits to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1p1d,2p2d")]
    splits: Vec<Split>,
    /// Workload (a synthetic mix or a trace, as for `dolphinctl replay`).
    #[arg(long, default_value = "hybrid")]
    workload: WorkloadSpec,
    /// Requests per split.
    #[arg(long, default_value_t = 240)]
    requests: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Poisson arrival rate per decode worker, requests per (profile) second: 2.5 queues
    /// without saturating (the simulator's P90 TTFT of 1p1d grows tenfold by 4).
    #[arg(long, default_value_t = 2.5)]
    rate_per_decode: f64,
    /// Seed of the Poisson arrivals.
    #[arg(long, default_value_t = 11)]
    arrival_seed: u64,
    /// Timing profile of every worker (shipped name or JSON file).
    #[arg(long, default_value = "dynamo-mocker")]
    profile: String,
    /// The router's prefill policy (threshold sends cache-hitting prompts local, others remote).
    #[arg(long, value_enum, default_value_t = Policy::Threshold)]
    policy: Policy,
    /// The workers' `--sim-time-scale`; live latencies are divided by it before comparing.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// The workers' `--sim-byte-scale` (KV bytes moved per token, relative to the profile's).
    #[arg(long, default_value_t = 0.001)]
    byte_scale: f64,
    /// Rate of the live KV path (loopback TCP), Gb/s, for the simulator's link with `--engine
    /// candle` (sim-engine workers charge the profile's link): the median of the kv_transfer
    /// benchmark on the 2-core machine (3.41 GB/s).
    #[arg(long, default_value_t = 27.3)]
    loopback_gbps: f64,
    /// KV blocks per worker.
    #[arg(long, default_value_t = 8192)]
    total_blocks: u32,
    /// TTFT SLO, ms (attainment only).
    #[arg(long, default_value_t = 300.0)]
    slo_ttft_ms: f64,
    /// TPOT SLO, ms (attainment only).
    #[arg(long, default_value_t = 30.0)]
    slo_tpot_ms: f64,
    /// Largest relative P90 difference that counts as agreement.
    #[arg(long, default_value_t = 0.15)]
    tolerance: f64,
    /// Tie-breaking seeds the simulator is also run with, to show how much P90s move with
    /// worker selection alone (seed 1 is the one compared).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    sim_seeds: u64,
    /// The live workers' engine: the sim engine under `--profile`, or the real model on candle
    /// (then `--profile` should be one `dolphinctl profile fit` measured for the same
    /// `--threads` and `--kv-bytes`).
    #[arg(long, value_enum, default_value_t = Engine::Sim)]
    engine: Engine,
    /// Candle: compute threads per worker.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Candle: KV memory per worker; the simulator's pool is this over the profile's KV bytes
    /// per token and the block size.
    #[arg(long, default_value = "512MiB")]
    kv_bytes: String,
    /// Tokens per engine step on both sides (default: the engine's, 2048 sim, 256 candle).
    #[arg(long)]
    max_batched_tokens: Option<u32>,
    /// Multiplies every prompt and output length and the tokens each shared-prefix id stands
    /// for (so prefix sharing keeps its shape): a workload a CPU-bound real model can serve.
    #[arg(long, default_value_t = 1.0)]
    length_scale: f64,
    /// Run the simulator only (to choose a load quickly).
    #[arg(long)]
    sim_only: bool,
    /// Where the cluster's logs go (default: a directory under /tmp).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Where to write the result (default: bench/results/sim_crosscheck.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The configuration both sides share, as recorded in the result.
#[derive(Debug, Serialize)]
struct Config {
    engine: &'static str,
    workload: String,
    length_scale: f64,
    requests: usize,
    seed: u64,
    rate_per_decode: f64,
    arrival_seed: u64,
    profile: String,
    policy: &'static str,
    time_scale: f64,
    block_size: u32,
    total_blocks: u32,
    max_batched_tokens: u32,
    overlap_weight: f64,
    /// KV bytes per token the live workers really move.
    wire_kv_bytes_per_token: u64,
    /// KV bytes per token and link rate the simulator charges a remote prefill (what the live
    /// engine charges: the profile's for sim workers, the real bytes at loopback for candle).
    sim_kv_bytes_per_token: u64,
    sim_link_gbps: f64,
    slo: Slo,
    tolerance: f64,
}

/// P90s of the simulator over its tie-breaking seeds.
#[derive(Debug, Serialize)]
struct SeedSpread {
    seeds: u64,
    p90_ttft_ms: [f64; 2],
    p90_tpot_ms: [f64; 2],
}

impl SeedSpread {
    fn of(sides: &[Side]) -> SeedSpread {
        let range = |f: fn(&Side) -> f64| {
            let v = sides.iter().map(f);
            [
                v.clone().fold(f64::INFINITY, f64::min),
                v.fold(0.0, f64::max),
            ]
        };
        SeedSpread {
            seeds: sides.len() as u64,
            p90_ttft_ms: range(|s| s.ttft.p90),
            p90_tpot_ms: range(|s| s.tpot.p90),
        }
    }
}

/// One split's comparison.
#[derive(Debug, Serialize)]
struct SplitResult {
    split: String,
    rate_per_s: f64,
    sim: Side,
    sim_seed_spread: SeedSpread,
    live: Option<Side>,
    diff: Option<Diff>,
    paired: Option<Paired>,
    /// Wall time of the live replay, s.
    live_wall_s: Option<f64>,
    /// CPU seconds each live process used during the replay.
    live_cpu_s: Vec<(String, Option<f64>)>,
}

#[derive(Debug, Serialize)]
struct Output {
    config: Config,
    splits: Vec<SplitResult>,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    /// When the run ended, seconds since the Unix epoch.
    written_unix_s: u64,
    cpus: usize,
    load_average_before: String,
    notes: &'static str,
}

const NOTES: &str = "Same workload, Poisson arrivals and configuration on both sides; live \
latencies measured at the replay client and divided by the time scale; diff = (live - sim) / sim \
for latencies, live - sim for shares. paired: the same request on both sides (same path), median \
live - sim TTFT per path and kind; remote_fit = [ms fixed, us per computed token] of the live \
remote path's overhead. sim_seed_spread: the simulator's P90s over its tie-breaking seeds.";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.time_scale > 0.0 && args.time_scale.is_finite(),
        "--time-scale must be positive (the live cluster must take time)"
    );
    anyhow::ensure!(
        args.engine == Engine::Sim || args.time_scale == 1.0,
        "--time-scale applies to the sim engine only (a real model takes its own time)"
    );
    let profile = SimProfile::load(&args.profile).context("loading the profile")?;
    let mut spec = args.workload.clone();
    spec.requests = Some(args.requests);
    spec.seed = args.seed;
    let mut base = spec.load().context("loading the workload")?;
    anyhow::ensure!(
        args.length_scale > 0.0 && args.length_scale.is_finite(),
        "--length-scale must be positive"
    );
    scale_lengths(&mut base, args.length_scale);
    let slo = Slo::new(args.slo_ttft_ms, args.slo_tpot_ms);
    // The engine's and the simulator's defaults for what the flags below do not cover.
    let defaults = SimClusterConfig::new(1, 1, profile.clone());
    let mut engine = SimConfig::new(profile.clone());
    engine.byte_scale = args.byte_scale;
    // (bytes per token on the wire, the simulator's bytes per token and link, blocks, step)
    let (wire_bytes, sim_link, total_blocks, max_batched_tokens) = match args.engine {
        Engine::Sim => (
            engine.wire_bytes_per_token(),
            (profile.kv_bytes_per_token, profile.link_gbps),
            args.total_blocks,
            args.max_batched_tokens
                .unwrap_or(defaults.max_batched_tokens),
        ),
        Engine::Candle => {
            let kv_bytes = parse_bytes(&args.kv_bytes).map_err(anyhow::Error::msg)?;
            let per_block = profile.kv_bytes_per_token * u64::from(defaults.block_size);
            let blocks = u32::try_from(kv_bytes / per_block.max(1)).context("--kv-bytes")?;
            let step = CandleConfig::new("model.gguf").max_batched_tokens;
            (
                profile.kv_bytes_per_token,
                (profile.kv_bytes_per_token, args.loopback_gbps),
                blocks,
                args.max_batched_tokens.unwrap_or(step),
            )
        }
    };
    let config = Config {
        engine: match args.engine {
            Engine::Sim => "sim",
            Engine::Candle => "candle",
        },
        length_scale: args.length_scale,
        workload: base.name.clone(),
        requests: base.requests.len(),
        seed: args.seed,
        rate_per_decode: args.rate_per_decode,
        arrival_seed: args.arrival_seed,
        profile: profile.name.clone(),
        policy: router_policy(args.policy, ThresholdConfig::default()).name(),
        time_scale: args.time_scale,
        block_size: defaults.block_size,
        total_blocks,
        max_batched_tokens,
        overlap_weight: defaults.overlap_weight,
        wire_kv_bytes_per_token: wire_bytes,
        sim_kv_bytes_per_token: sim_link.0,
        sim_link_gbps: sim_link.1,
        slo,
        tolerance: args.tolerance,
    };
    let load_average_before = dolphin_bench::machine::load_average();
    let log_root = args.log_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("dolphin-crosscheck-{}", std::process::id()))
    });
    let mut results = Vec::new();
    for &split in &args.splits {
        let rate = args.rate_per_decode * f64::from(split.decode);
        let mut w = base.clone();
        Arrivals::Poisson {
            rate_per_s: rate,
            seed: args.arrival_seed,
        }
        .apply(&mut w);
        let mut sim_profile = profile.clone();
        sim_profile.kv_bytes_per_token = config.sim_kv_bytes_per_token;
        sim_profile.link_gbps = config.sim_link_gbps;
        let mut target = SimTargetConfig {
            split,
            profile: sim_profile,
            policy: router_policy(args.policy, ThresholdConfig::default()),
            table: None,
            total_blocks,
            seed: 1,
            // The live side's replay sends the output length as max_tokens: so does this one.
            classifier: None,
            cap_max_tokens: false,
            max_batched_tokens: Some(max_batched_tokens),
        };
        let sim_run = replay_sim(&target, &w, Arrivals::Trace { time_scale: 1.0 }, slo)?;
        let sim = Side::of(&sim_run.outcomes);
        let mut sides = vec![sim];
        for seed in 2..=args.sim_seeds {
            target.seed = seed;
            let run = replay_sim(&target, &w, Arrivals::Trace { time_scale: 1.0 }, slo)?;
            sides.push(Side::of(&run.outcomes));
        }
        let spread = SeedSpread::of(&sides);
        let mut result = SplitResult {
            split: split.to_string(),
            rate_per_s: rate,
            sim,
            sim_seed_spread: spread,
            live: None,
            diff: None,
            paired: None,
            live_wall_s: None,
            live_cpu_s: Vec::new(),
        };
        if !args.sim_only {
            let setup = LiveSetup {
                split,
                engine: args.engine,
                threads: args.threads,
                kv_bytes: args.kv_bytes.clone(),
                profile: args.profile.clone(),
                time_scale: args.time_scale,
                byte_scale: args.byte_scale,
                block_size: config.block_size,
                total_blocks,
                max_batched_tokens: config.max_batched_tokens,
                policy: config.policy,
                overlap_weight: config.overlap_weight,
            };
            let log_dir = log_root.join(split.to_string());
            eprintln!(
                "sim_crosscheck: {split}: live replay, logs in {}",
                log_dir.display()
            );
            let (outcomes, wall_s, cpu) = live(&setup, &log_dir, &w, args.time_scale, slo).await?;
            // Every request of both sides, for a closer look at the differences.
            let both = serde_json::json!({ "sim": &sim_run.outcomes, "live": &outcomes });
            let path = log_dir.join("outcomes.json");
            std::fs::write(&path, serde_json::to_string(&both)?)
                .with_context(|| format!("writing {}", path.display()))?;
            let live = Side::of(&outcomes);
            result.paired = Some(Paired::of(&sim_run.outcomes, &outcomes));
            result.diff = Some(Diff::of(&sim, &live, args.tolerance));
            result.live = Some(live);
            result.live_wall_s = Some(wall_s);
            result.live_cpu_s = cpu;
        }
        print!(
            "{}",
            compare::table(
                &result.split,
                &result.sim,
                result.live.as_ref(),
                result.diff.as_ref(),
                result.paired.as_ref(),
            )
        );
        let sp = &result.sim_seed_spread;
        println!(
            "       sim over {} seeds: P90 TTFT {:.1}-{:.1} ms, P90 TPOT {:.1}-{:.1} ms",
            sp.seeds, sp.p90_ttft_ms[0], sp.p90_ttft_ms[1], sp.p90_tpot_ms[0], sp.p90_tpot_ms[1]
        );
        results.push(result);
    }
    let output = Output {
        config,
        splits: results,
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        written_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load_average_before: load_average_before.trim().to_string(),
        notes: NOTES,
    };
    let path = dolphin_bench::results::write_json("sim_crosscheck", args.out.as_deref(), &output)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Multiplies every prompt and output length (at least 1 token each) and the tokens a
/// shared-prefix id stands for by `f`.
fn scale_lengths(w: &mut Workload, f: f64) {
    if f == 1.0 {
        return;
    }
    let scale = |n: u32| ((f64::from(n) * f).round() as u32).max(1);
    w.tokens_per_id = scale(w.tokens_per_id);
    for r in &mut w.requests {
        r.prompt_len = scale(r.prompt_len);
        r.output_len = scale(r.output_len);
    }
    w.name = format!("{}x{f}", w.name);
}

/// Replays `w` on a fresh live cluster, `scale` times slower than profile time; returns the
/// outcomes in profile milliseconds, the wall time and each process's CPU seconds.
async fn live(
    setup: &LiveSetup,
    log_dir: &std::path::Path,
    w: &Workload,
    scale: f64,
    slo: Slo,
) -> anyhow::Result<(Vec<RequestOutcome>, f64, Vec<(String, Option<f64>)>)> {
    let cluster = LiveCluster::start(setup, log_dir).await?;
    let cfg = LiveConfig {
        router_grpc: cluster.grpc_addr.clone(),
        model: None,
        vocab_size: None,
        max_in_flight: 100_000,
        progress: std::io::stderr().is_terminal(),
        // As the simulated side: the router sees the output length (both sides alike).
        cap_max_tokens: false,
    };
    let before = cluster.cpu_seconds();
    let started = Instant::now();
    let scaled_slo = Slo::new(slo.ttft_ms * scale, slo.tpot_ms * scale);
    let run = replay_live(&cfg, w, Arrivals::Trace { time_scale: scale }, scaled_slo).await;
    let wall_s = started.elapsed().as_secs_f64();
    let after = cluster.cpu_seconds();
    cluster.stop().await;
    let run = run?;
    let cpu = before
        .into_iter()
        .zip(after)
        .map(|((name, b), (_, a))| (name, a.zip(b).map(|(a, b)| a - b)))
        .collect();
    let outcomes = run
        .outcomes
        .into_iter()
        .map(|mut o| {
            o.sent_ms /= scale;
            o.ttft_ms /= scale;
            o.tpot_ms /= scale;
            o.e2e_ms /= scale;
            o.judge(&slo)
        })
        .collect();
    Ok((outcomes, wall_s, cpu))
}

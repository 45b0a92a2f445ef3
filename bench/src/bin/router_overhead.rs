//! What the router adds to a request: the decode worker called directly (gRPC
//! `DecodeWorker.Decode`) against the router in front of it (gRPC `Inference.Generate`, HTTP
//! `/v1/completions` whole and streamed), at 1 and at 16 concurrent connections, with real
//! processes: one decode and one prefill worker on the zero-delay sim engine and a router with
//! static discovery and the always-local policy.
//!
//! Per mode: requests/s, p50/p99 latency, the router's added p50 over direct at the same
//! concurrency, and the router's CPU time per request (utime + stime from `/proc/<pid>/stat`
//! over the timed phase; "net" subtracts the router's idle rate measured during the direct
//! phases, when it serves nothing).
//!
//! Needs the release binaries beside this one:
//! `cargo build --release --bins -p dolphin-router -p dolphin-decode-worker -p dolphin-prefill-worker -p dolphin-bench`
//! then `target/release/router_overhead [--duration-secs 4]`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use dolphin_bench::load::{self, RunResult};
use dolphin_bench::overhead_clients::{Client, Mode, Prompts};
use dolphin_bench::overhead_cluster::{self, RouterLaunch};
use dolphin_bench::proc_stat::CpuClock;
use dolphin_bench::stats::Summary;
use dolphin_router::tokenizer::{SimTokenizer, Tokenizer};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

const MODEL: &str = "sim-model";
/// The brief's targets at one connection.
const TARGET_CPU_US: f64 = 30.0;
const TARGET_ADDED_P50_MS: f64 = 0.1;

#[derive(Debug, Parser)]
#[command(about = "Router overhead: direct decode worker vs router over gRPC and HTTP")]
struct Args {
    /// Timed seconds per phase.
    #[arg(long, default_value_t = 4.0)]
    duration_secs: f64,
    /// Untimed warm-up seconds per phase (fresh connections, caches, allocator).
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Concurrent connections, one phase per value and mode.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    concurrency: Vec<usize>,
    /// Modes to run, in this order (direct first: the router modes' added latency is against
    /// it).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct_grpc,router_grpc,router_http,router_http_sse"
    )]
    modes: Vec<Mode>,
    /// Prompt length in tokens (one printable character is one sim token).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 8)]
    max_tokens: u32,
    /// Distinct prompts cycled through.
    #[arg(long, default_value_t = 256)]
    prompts: usize,
    /// Tokio worker threads of the router (TOKIO_WORKER_THREADS; default: one per core).
    #[arg(long)]
    router_worker_threads: Option<usize>,
    /// Run the router under this command (split on spaces), e.g. for a profile:
    /// "valgrind --tool=callgrind --callgrind-out-file=/tmp/router.cg". The router is stopped
    /// with SIGTERM at the end so such a tool can write its output.
    #[arg(long)]
    router_wrapper: Option<String>,
    /// Where to write the JSON result (default: bench/results/router_overhead.json).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct Phase {
    mode: Mode,
    concurrency: usize,
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed_s: f64,
    requests_per_s: f64,
    latency: Summary,
    /// Router p50 minus direct p50 at the same concurrency, in ms (absent for direct).
    added_p50_ms: Option<f64>,
    router_cpu_us_per_request: f64,
    router_cpu_us_per_request_net_of_idle: f64,
    decode_worker_cpu_us_per_request: f64,
}

#[derive(Debug, Serialize)]
struct Targets {
    router_cpu_us_per_request_max: f64,
    added_p50_ms_max: f64,
    /// Per router mode at concurrency 1: (mode, cpu target met, added-p50 target met).
    at_one_connection: Vec<(Mode, bool, bool)>,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    prompt_tokens: usize,
    max_tokens: u32,
    duration_secs: f64,
    warmup_secs: f64,
    cpu_tick_us: f64,
    loadavg_at_start: String,
    router_idle_cpu_us_per_s: f64,
    phases: Vec<Phase>,
    targets: Targets,
}

fn make_prompts(args: &Args) -> Prompts {
    let mut rng = SmallRng::seed_from_u64(64);
    let texts: Vec<String> = (0..args.prompts.max(1))
        .map(|_| {
            (0..args.prompt_tokens)
                .map(|_| rng.random_range(b' '..=b'~') as char)
                .collect()
        })
        .collect();
    // The router's own tokenizer: the direct calls get exactly the ids the router would send.
    let tokens = texts.iter().map(|t| SimTokenizer.encode(t)).collect();
    Prompts::new(texts, tokens, MODEL, args.max_tokens)
}

struct Measured {
    run: RunResult,
    router_cpu: Duration,
    decode_cpu: Duration,
}

async fn run_phase(
    mode: Mode,
    conc: usize,
    args: &Args,
    prompts: &Arc<Prompts>,
    addrs: (&str, &str, &str),
    clocks: (&CpuClock, &CpuClock),
) -> anyhow::Result<Measured> {
    let mut clients = Vec::with_capacity(conc);
    for i in 0..conc {
        clients.push(Client::connect(mode, i, prompts.clone(), addrs.0, addrs.1, addrs.2).await?);
    }
    let (clients, warm) = load::run_for(clients, Duration::from_secs_f64(args.warmup_secs)).await;
    if warm.errors > 0 {
        bail!(
            "{} warm-up failed: {}",
            mode.as_str(),
            warm.first_error.unwrap_or_default()
        );
    }
    let (r0, d0) = (clocks.0.cpu_time()?, clocks.1.cpu_time()?);
    let (clients, run) = load::run_for(clients, Duration::from_secs_f64(args.duration_secs)).await;
    let (r1, d1) = (clocks.0.cpu_time()?, clocks.1.cpu_time()?);
    drop(clients);
    Ok(Measured {
        run,
        router_cpu: r1 - r0,
        decode_cpu: d1 - d0,
    })
}

fn per_request_us(cpu: Duration, n: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / n.max(1) as f64
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let loadavg = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    let log_dir =
        std::env::temp_dir().join(format!("dolphin-router-overhead-{}", std::process::id()));
    // Started from the main thread: the workers' PDEATHSIG follows the thread that forked them.
    let launch = RouterLaunch {
        worker_threads: args.router_worker_threads,
        wrapper: args
            .router_wrapper
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    };
    let cluster =
        overhead_cluster::start(&log_dir, MODEL, &launch).context("starting the cluster")?;
    println!("processes started; logs in {}", log_dir.display());
    let router_grpc = cluster.router.ready_field("grpc_addr")?.to_string();
    let router_http = cluster.router.ready_field("http_addr")?.to_string();
    let decode_grpc = cluster.decode.ready_field("grpc_addr")?.to_string();
    let router_clock = CpuClock::new(cluster.router.pid());
    let decode_clock = CpuClock::new(cluster.decode.pid());
    let prompts = Arc::new(make_prompts(&args));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut phases = Vec::new();
    let mut idle_rates = Vec::new();
    rt.block_on(cluster.wait_for_workers())?;
    for &conc in &args.concurrency {
        let mut direct_p50_ms = None;
        for &mode in &args.modes {
            let addrs = (
                decode_grpc.as_str(),
                router_grpc.as_str(),
                router_http.as_str(),
            );
            let m = rt.block_on(run_phase(
                mode,
                conc,
                &args,
                &prompts,
                addrs,
                (&router_clock, &decode_clock),
            ))?;
            let mut run = m.run;
            let elapsed = run.elapsed.as_secs_f64();
            if mode == Mode::DirectGrpc {
                idle_rates.push(m.router_cpu.as_secs_f64() * 1e6 / elapsed);
            }
            let latency = Summary::from_nanos(&mut run.latencies_ns);
            let p50_ms = latency.p50_us / 1e3;
            let added = match mode {
                Mode::DirectGrpc => {
                    direct_p50_ms = Some(p50_ms);
                    None
                }
                _ => direct_p50_ms.map(|d| p50_ms - d),
            };
            let idle_us =
                idle_rates.iter().fold(0.0, |a, b| a + b) / idle_rates.len().max(1) as f64;
            let cpu_us = per_request_us(m.router_cpu, run.ok);
            let phase = Phase {
                mode,
                concurrency: conc,
                requests: run.ok,
                errors: run.errors,
                first_error: run.first_error.clone(),
                elapsed_s: elapsed,
                requests_per_s: run.rps(),
                latency,
                added_p50_ms: added,
                router_cpu_us_per_request: cpu_us,
                router_cpu_us_per_request_net_of_idle: (cpu_us
                    - idle_us * elapsed / run.ok.max(1) as f64)
                    .max(0.0),
                decode_worker_cpu_us_per_request: per_request_us(m.decode_cpu, run.ok),
            };
            print_phase(&phase);
            phases.push(phase);
        }
    }
    if !cluster.stop(Duration::from_secs(60)) {
        eprintln!("the router did not exit on SIGTERM; killed");
    }
    let router_idle = idle_rates.iter().fold(0.0, |a, b| a + b) / idle_rates.len().max(1) as f64;
    let at_one: Vec<(Mode, bool, bool)> = phases
        .iter()
        .filter(|p| p.concurrency == 1 && p.mode != Mode::DirectGrpc)
        .map(|p| {
            (
                p.mode,
                p.router_cpu_us_per_request <= TARGET_CPU_US,
                p.added_p50_ms.is_some_and(|a| a <= TARGET_ADDED_P50_MS),
            )
        })
        .collect();
    let failed: u64 = phases.iter().map(|p| p.errors).sum();
    let report = Report {
        bench: "router_overhead",
        prompt_tokens: args.prompt_tokens,
        max_tokens: args.max_tokens,
        duration_secs: args.duration_secs,
        warmup_secs: args.warmup_secs,
        cpu_tick_us: router_clock.resolution().as_secs_f64() * 1e6,
        loadavg_at_start: loadavg,
        router_idle_cpu_us_per_s: router_idle,
        phases,
        targets: Targets {
            router_cpu_us_per_request_max: TARGET_CPU_US,
            added_p50_ms_max: TARGET_ADDED_P50_MS,
            at_one_connection: at_one,
        },
    };
    println!("router idle CPU: {router_idle:.0} us/s (subtracted in the \"net\" column)");
    for (mode, cpu_ok, p50_ok) in &report.targets.at_one_connection {
        println!(
            "targets at 1 connection, {:<16} CPU <= {TARGET_CPU_US} us: {:<6} added p50 <= {TARGET_ADDED_P50_MS} ms: {}",
            mode.as_str(),
            if *cpu_ok { "met" } else { "MISSED" },
            if *p50_ok { "met" } else { "MISSED" },
        );
    }
    let path = dolphin_bench::results::write_json("router_overhead", args.out.as_deref(), &report)?;
    println!("wrote {}", path.display());
    if failed > 0 {
        bail!("{failed} requests failed; the numbers above are not trustworthy");
    }
    Ok(())
}

fn print_phase(p: &Phase) {
    println!(
        "{:<16} c={:<3} {:>8.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  added p50 {:>8}  router CPU {:>6.1} us/req (net {:>6.1})  decode CPU {:>6.1} us/req  n={} err={}",
        p.mode.as_str(),
        p.concurrency,
        p.requests_per_s,
        p.latency.p50_us / 1e3,
        p.latency.p99_us / 1e3,
        p.added_p50_ms
            .map_or("-".to_string(), |a| format!("{a:.3} ms")),
        p.router_cpu_us_per_request,
        p.router_cpu_us_per_request_net_of_idle,
        p.decode_worker_cpu_us_per_request,
        p.requests,
        p.errors,
    );
    if let Some(e) = &p.first_error {
        println!("  first error: {e}");
    }
}

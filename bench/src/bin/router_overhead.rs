//! What a router adds to a request, against the peers, in one run with one load generator and
//! one request (a 64-character prompt, 8 tokens out, `POST /v1/completions` whole and streamed,
//! or gRPC `Inference.Generate`), at 1 and at 16 concurrent connections:
//!
//! - Dolphin's router over one decode and one prefill worker on the zero-delay sim engine, with
//!   the local path (policy always-local) and the remote path (a second router, always-remote:
//!   the prefill worker computes and ships the KV), against the decode worker called directly;
//! - nginx as a plain HTTP reverse proxy with an upstream keepalive pool (no routing at all: the
//!   floor of forwarding), and SGLang's gateway `smg` 1.13.0 in cache-aware and in P/D mode, in
//!   front of mock workers that answer instantly (`mock_http_worker`), against the mock called
//!   directly. `scripts/install-peers.sh` installs the peers; one that is missing is reported as
//!   missing.
//!
//! Per mode: requests/s, p50/p99 latency, the added p50 over the mode's no-router baseline at the
//! same concurrency, and the router's CPU time per request (utime + stime from `/proc/<pid>/stat`
//! over the timed phase; "net" subtracts the router's idle rate, measured while the baselines
//! run and it serves nothing), with ratios to nginx and smg at the same concurrency.
//!
//! Needs the release binaries beside this one:
//! `cargo build --release --bins -p dolphin-router -p dolphin-decode-worker -p dolphin-prefill-worker -p dolphin-bench`
//! then `scripts/install-peers.sh` and `target/release/router_overhead [--duration-secs 4]`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use dolphin_bench::load::{self, RunResult};
use dolphin_bench::overhead_clients::{Addrs, Client, Mode, Prompts, Target};
use dolphin_bench::overhead_cluster::{self, RouterLaunch};
use dolphin_bench::peers::{self, Peer, PeerBins, SmgMode};
use dolphin_bench::proc_stat::CpuClock;
use dolphin_bench::stats::{Summary, median};
use dolphin_router::tokenizer::SimTokenizer;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

const MODEL: &str = "sim-model";
/// The targets: router CPU per request at most nginx's on the local path (remote within
/// 1.2x of that), at most half of smg's, and at most 0.1 ms added p50 at one connection.
const TARGET_CPU_VS_NGINX_LOCAL: f64 = 1.0;
const TARGET_CPU_VS_NGINX_REMOTE: f64 = 1.2;
const TARGET_CPU_VS_SMG: f64 = 0.5;
const TARGET_ADDED_P50_MS: f64 = 0.1;

/// nginx's worker processes in this benchmark (`peers::nginx_conf`: no master, one worker).
const NGINX_WORKER_PROCESSES: usize = 1;

const DEFAULT_MODES: &str = "direct_grpc,mock_http,mock_http_sse,router_grpc,router_http,\
router_http_sse,remote_grpc,remote_http,remote_http_sse,nginx_http,nginx_http_sse,smg_http,\
smg_http_sse,smg_pd_http,smg_pd_http_sse";

#[derive(Debug, Parser)]
#[command(about = "Router overhead: Dolphin's router against nginx and smg, in one run")]
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
    /// Modes to run (the baselines, direct_grpc and mock_http[_sse], always run first at each
    /// concurrency: added latency is measured against them).
    #[arg(long, value_enum, value_delimiter = ',', default_value = DEFAULT_MODES)]
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
    /// Serving threads of Dolphin's routers (`--worker-threads`). 1 by default, as nginx runs one
    /// worker process here: CPU per request is compared like for like. 0: the router's own
    /// default, one per core (on 2 cores its CPU per request at 16 connections measured 1.3x
    /// that of one thread, the shards sleeping and waking apart).
    #[arg(long, default_value_t = NGINX_WORKER_PROCESSES)]
    router_worker_threads: usize,
    /// Run the local-path router under this command (split on spaces), e.g. for a profile:
    /// "perf record -g -o /tmp/router.perf". The router is stopped with SIGTERM at the end so
    /// such a tool can write its output.
    #[arg(long)]
    router_wrapper: Option<String>,
    /// The router binary of both Dolphin routers, local and remote path (default:
    /// dolphin-router beside this binary), e.g. the PGO build `scripts/pgo-router.sh` prints
    /// (`BENCH_PGO=1 scripts/bench.sh router_overhead` passes it).
    #[arg(long)]
    router_bin: Option<PathBuf>,
    /// The nginx binary (default: from PATH or /usr/sbin).
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// The smg launcher (default: the venv of scripts/install-peers.sh).
    #[arg(long)]
    smg: Option<PathBuf>,
    /// Rounds: every mode at every concurrency once per round, in the same order, so a busy
    /// moment on this shared machine lands in one round instead of one router's phase. The
    /// JSON's `phases` hold, per mode and concurrency, the round with the median CPU per
    /// request, with the median of the rounds' own added p50 and ratios; `rounds_phases` all
    /// of them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Where to write the JSON result (default: bench/results/router_overhead.json; with
    /// `--router-wrapper`, the temporary directory's `router_overhead_wrapped.json`).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize)]
struct Phase {
    mode: Mode,
    router: Target,
    concurrency: usize,
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed_s: f64,
    requests_per_s: f64,
    latency: Summary,
    /// The mode's no-router baseline.
    baseline: Mode,
    /// p50 minus the baseline's p50 at the same concurrency, in ms (absent for a baseline).
    added_p50_ms: Option<f64>,
    /// Router CPU per request, gross.
    router_cpu_us_per_request: f64,
    /// Router CPU per request less its idle rate: the number compared across routers.
    cpu_us_per_req: f64,
    /// `cpu_us_per_req` over nginx's at the same concurrency and response shape (whole or SSE).
    ratio_to_nginx: Option<f64>,
    /// `cpu_us_per_req` over smg's (cache-aware for the local path, P/D for the remote one) at
    /// the same concurrency and response shape.
    ratio_to_smg: Option<f64>,
    /// CPU per request of the worker behind the router (the decode worker or the mock).
    worker_cpu_us_per_request: f64,
}

#[derive(Debug, Serialize)]
struct Check {
    what: String,
    value: Option<f64>,
    limit: f64,
    met: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    prompt_tokens: usize,
    max_tokens: u32,
    duration_secs: f64,
    warmup_secs: f64,
    cpu_tick_us: f64,
    loadavg_at_start: String,
    /// Serving threads of Dolphin's routers (0: one per core) and nginx's worker processes.
    router_worker_threads: usize,
    nginx_worker_processes: usize,
    /// Cargo profile the Dolphin binaries were built with (`release`, `dist`: the directory
    /// they run from).
    build_profile: String,
    /// The Dolphin routers' binary, when `--router-bin` named one (else the one beside this
    /// benchmark, of `build_profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    router_bin: Option<String>,
    /// Peers that could not be started, and why (their modes are not in `phases`).
    missing: BTreeMap<String, String>,
    smg_version: &'static str,
    /// Each router's idle CPU, us per second (subtracted in `cpu_us_per_req`).
    idle_cpu_us_per_s: BTreeMap<String, f64>,
    rounds: u32,
    phases: Vec<Phase>,
    /// Every round's phases, with that round's own ratios (only with more than one round).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rounds_phases: Vec<Vec<Phase>>,
    targets: Vec<Check>,
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

/// The processes whose CPU time is measured: each router, and the worker behind each mode.
struct Clocks {
    routers: HashMap<Target, CpuClock>,
    decode: CpuClock,
    mock: Option<CpuClock>,
}

impl Clocks {
    fn read(&self) -> anyhow::Result<HashMap<Target, Duration>> {
        self.routers
            .iter()
            .map(|(t, c)| Ok((*t, c.cpu_time()?)))
            .collect()
    }

    fn worker(&self, mode: Mode) -> Option<&CpuClock> {
        match mode.target() {
            Target::DolphinLocal | Target::DolphinRemote => Some(&self.decode),
            Target::None if mode.grpc() => Some(&self.decode),
            _ => self.mock.as_ref(),
        }
    }
}

struct Measured {
    run: RunResult,
    /// CPU time of every router over the timed phase.
    routers: HashMap<Target, Duration>,
    worker: Duration,
}

async fn run_phase(
    mode: Mode,
    conc: usize,
    args: &Args,
    prompts: &Arc<Prompts>,
    addrs: &Addrs,
    clocks: &Clocks,
) -> anyhow::Result<Measured> {
    let mut clients = Vec::with_capacity(conc);
    for i in 0..conc {
        clients.push(Client::connect(mode, i, prompts.clone(), addrs).await?);
    }
    let (clients, warm) = load::run_for(clients, Duration::from_secs_f64(args.warmup_secs)).await;
    if warm.errors > 0 {
        bail!(
            "{} warm-up failed: {}",
            mode.as_str(),
            warm.first_error.unwrap_or_default()
        );
    }
    let worker_clock = clocks.worker(mode);
    let r0 = clocks.read()?;
    let w0 = worker_clock.map(CpuClock::cpu_time).transpose()?;
    let (clients, run) = load::run_for(clients, Duration::from_secs_f64(args.duration_secs)).await;
    let r1 = clocks.read()?;
    let w1 = worker_clock.map(CpuClock::cpu_time).transpose()?;
    drop(clients);
    let routers = r1.iter().map(|(t, d)| (*t, *d - r0[t])).collect();
    Ok(Measured {
        run,
        routers,
        worker: w1.zip(w0).map_or(Duration::ZERO, |(a, b)| a - b),
    })
}

fn per_request_us(cpu: Duration, n: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / n.max(1) as f64
}

fn target_name(t: Target) -> &'static str {
    match t {
        Target::None => "none",
        Target::DolphinLocal => "dolphin_local",
        Target::DolphinRemote => "dolphin_remote",
        Target::Nginx => "nginx",
        Target::Smg => "smg",
        Target::SmgPd => "smg_pd",
    }
}

/// Everything started: Dolphin's processes, the mocks and the peers that could be started.
struct Running {
    cluster: overhead_cluster::OverheadCluster,
    remote: Option<dolphin_bench::process::ChildProcess>,
    mocks: Vec<Peer>,
    peers: Vec<(Target, Peer)>,
}

async fn start_peers(
    args: &Args,
    log_dir: &std::path::Path,
    missing: &mut BTreeMap<String, String>,
) -> anyhow::Result<(Vec<Peer>, Vec<(Target, Peer)>)> {
    let wants = |t: Target| args.modes.iter().any(|m| m.target() == t);
    let any_peer = wants(Target::Nginx) || wants(Target::Smg) || wants(Target::SmgPd);
    let wants_mock = any_peer || args.modes.iter().any(|m| m.baseline() != Mode::DirectGrpc);
    let mut mocks = Vec::new();
    if !wants_mock {
        return Ok((mocks, Vec::new()));
    }
    mocks.push(peers::start_mock(log_dir, "mock", MODEL).await?);
    // smg's P/D mode needs a prefill worker of its own.
    if wants(Target::SmgPd) {
        mocks.push(peers::start_mock(log_dir, "mock-prefill", MODEL).await?);
    }
    let mock = mocks[0].http_addr.clone();
    let bins = PeerBins::locate(args.nginx.clone(), args.smg.clone());
    let mut started = Vec::new();
    let mut record = |t: Target, r: Result<Peer, String>| match r {
        Ok(p) => started.push((t, p)),
        Err(e) => {
            eprintln!("{}: missing: {e}", target_name(t));
            missing.insert(target_name(t).to_string(), e);
        }
    };
    if wants(Target::Nginx) {
        let r = match &bins.nginx {
            Ok(bin) => peers::start_nginx(bin, log_dir, &mock)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        record(Target::Nginx, r);
    }
    if wants(Target::Smg) {
        let mode = SmgMode::Regular {
            workers: vec![mock.clone()],
        };
        let r = match &bins.smg {
            Ok(bin) => peers::start_smg(bin, log_dir, "smg", &mode)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        record(Target::Smg, r);
    }
    if wants(Target::SmgPd) {
        let mode = SmgMode::Pd {
            prefill: vec![mocks[1].http_addr.clone()],
            decode: vec![mock.clone()],
        };
        let r = match &bins.smg {
            Ok(bin) => peers::start_smg(bin, log_dir, "smg-pd", &mode)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        record(Target::SmgPd, r);
    }
    Ok((mocks, started))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let router_threads = (args.router_worker_threads > 0).then_some(args.router_worker_threads);
    let loadavg = dolphin_bench::machine::load_average();
    let log_dir =
        std::env::temp_dir().join(format!("dolphin-router-overhead-{}", std::process::id()));
    // Started from the main thread: the children's PDEATHSIG follows the thread that forked them.
    let launch = RouterLaunch {
        worker_threads: router_threads,
        wrapper: args
            .router_wrapper
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        bin: args.router_bin.clone(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let cluster = rt
        .block_on(overhead_cluster::start(&log_dir, MODEL, &launch))
        .context("starting the cluster")?;
    let wants_remote = args
        .modes
        .iter()
        .any(|m| m.target() == Target::DolphinRemote);
    let remote = if wants_remote {
        let plain = RouterLaunch {
            worker_threads: router_threads,
            wrapper: Vec::new(),
            bin: args.router_bin.clone(),
        };
        let workers = (cluster.decode.grpc_addr()?, cluster.prefill.grpc_addr()?);
        Some(rt.block_on(overhead_cluster::start_router(
            &log_dir,
            "router-remote",
            MODEL,
            workers,
            "always-remote",
            &plain,
        ))?)
    } else {
        None
    };
    let mut missing = BTreeMap::new();
    let (mocks, peer_list) = rt.block_on(start_peers(&args, &log_dir, &mut missing))?;
    let mut running = Running {
        cluster,
        remote,
        mocks,
        peers: peer_list,
    };
    println!("processes started; logs in {}", log_dir.display());

    let mut addrs = Addrs {
        decode_grpc: Some(running.cluster.decode.grpc_addr()?.to_string()),
        router_grpc: Some(running.cluster.router.grpc_addr()?.to_string()),
        router_http: Some(running.cluster.router.http_addr()?.to_string()),
        mock_http: running.mocks.first().map(|m| m.http_addr.clone()),
        ..Addrs::default()
    };
    let mut routers = HashMap::new();
    routers.insert(
        Target::DolphinLocal,
        CpuClock::new(running.cluster.router.pid()),
    );
    if let Some(r) = &running.remote {
        addrs.remote_grpc = Some(r.grpc_addr()?.to_string());
        addrs.remote_http = Some(r.http_addr()?.to_string());
        routers.insert(Target::DolphinRemote, CpuClock::new(r.pid()));
    }
    for (t, p) in &running.peers {
        let a = Some(p.http_addr.clone());
        match t {
            Target::Nginx => addrs.nginx_http = a,
            Target::Smg => addrs.smg_http = a,
            Target::SmgPd => addrs.smg_pd_http = a,
            _ => {}
        }
        routers.insert(*t, CpuClock::new(p.process.pid()));
    }
    let clocks = Clocks {
        routers,
        decode: CpuClock::new(running.cluster.decode.pid()),
        mock: running
            .mocks
            .first()
            .map(|m| CpuClock::new(m.process.pid())),
    };
    let prompts = Arc::new(make_prompts(&args));
    rt.block_on(running.cluster.wait_for_workers())?;
    if let Some(r) = &running.remote {
        rt.block_on(overhead_cluster::wait_for_workers(r.admin_addr()?, 2))?;
    }

    // Baselines first (stable: the rest keep their order); modes whose router is missing go.
    let mut modes: Vec<Mode> = args
        .modes
        .iter()
        .copied()
        .filter(|m| addrs.of(*m).is_some())
        .collect();
    modes.sort_by_key(|m| m.target() != Target::None);
    modes.dedup();

    let mut rounds_phases: Vec<Vec<Phase>> = Vec::new();
    // Idle CPU per router, us/s, from the baseline phases (no router serves anything then).
    let mut idle: HashMap<Target, Vec<f64>> = HashMap::new();
    for round in 0..args.rounds {
        if args.rounds > 1 {
            println!("round {} of {}", round + 1, args.rounds);
        }
        let mut phases: Vec<Phase> = Vec::new();
        for &conc in &args.concurrency {
            let mut base_p50: HashMap<Mode, f64> = HashMap::new();
            for &mode in &modes {
                let m = rt.block_on(run_phase(mode, conc, &args, &prompts, &addrs, &clocks))?;
                let mut run = m.run;
                let elapsed = run.elapsed.as_secs_f64();
                if mode.target() == Target::None {
                    for (t, cpu) in &m.routers {
                        idle.entry(*t)
                            .or_default()
                            .push(cpu.as_secs_f64() * 1e6 / elapsed);
                    }
                }
                let latency = Summary::from_nanos(&mut run.latencies_ns);
                let p50_ms = latency.p50_us / 1e3;
                let added = if mode.target() == Target::None {
                    base_p50.insert(mode, p50_ms);
                    None
                } else {
                    base_p50.get(&mode.baseline()).map(|b| p50_ms - b)
                };
                let router = mode.target();
                let (gross, net) = match m.routers.get(&router) {
                    Some(cpu) => {
                        let gross = per_request_us(*cpu, run.ok);
                        let rates = idle.get(&router).map(Vec::as_slice).unwrap_or_default();
                        let idle_us = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
                        (
                            gross,
                            (gross - idle_us * elapsed / run.ok.max(1) as f64).max(0.0),
                        )
                    }
                    None => (0.0, 0.0),
                };
                let phase = Phase {
                    mode,
                    router,
                    concurrency: conc,
                    requests: run.ok,
                    errors: run.errors,
                    first_error: run.first_error.clone(),
                    elapsed_s: elapsed,
                    requests_per_s: run.rps(),
                    latency,
                    baseline: mode.baseline(),
                    added_p50_ms: added,
                    router_cpu_us_per_request: gross,
                    cpu_us_per_req: net,
                    ratio_to_nginx: None,
                    ratio_to_smg: None,
                    worker_cpu_us_per_request: per_request_us(m.worker, run.ok),
                };
                print_phase(&phase);
                phases.push(phase);
            }
        }
        fill_ratios(&mut phases);
        rounds_phases.push(phases);
    }
    let phases = median_phases(&rounds_phases);
    if args.rounds > 1 {
        println!("medians over {} rounds:", args.rounds);
        for p in &phases {
            print_phase(p);
        }
    } else {
        rounds_phases.clear();
    }
    let targets = checks(&phases);

    if !rt.block_on(running.cluster.stop(Duration::from_secs(60))) {
        eprintln!("the router did not exit on SIGTERM; killed");
    }
    drop((running.remote.take(), std::mem::take(&mut running.peers)));
    drop(std::mem::take(&mut running.mocks));

    let idle_cpu_us_per_s = idle
        .iter()
        .map(|(t, r)| {
            (
                target_name(*t).to_string(),
                r.iter().sum::<f64>() / r.len().max(1) as f64,
            )
        })
        .collect();
    let failed: u64 = phases.iter().map(|p| p.errors).sum();
    let report = Report {
        bench: "router_overhead",
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        prompt_tokens: args.prompt_tokens,
        max_tokens: args.max_tokens,
        duration_secs: args.duration_secs,
        warmup_secs: args.warmup_secs,
        cpu_tick_us: clocks.decode.resolution().as_secs_f64() * 1e6,
        loadavg_at_start: loadavg,
        router_worker_threads: args.router_worker_threads,
        nginx_worker_processes: NGINX_WORKER_PROCESSES,
        build_profile: dolphin_bench::process::build_profile(),
        router_bin: args.router_bin.as_ref().map(|p| p.display().to_string()),
        missing,
        smg_version: peers::SMG_VERSION,
        idle_cpu_us_per_s,
        rounds: args.rounds,
        phases,
        rounds_phases,
        targets,
    };
    for c in &report.targets {
        let v = c.value.map_or("-".into(), |v| format!("{v:.3}"));
        let verdict = if c.met { "met" } else { "MISSED" };
        println!("{:<60} {v:>8} (limit {:.2}): {verdict}", c.what, c.limit);
    }
    let out = dolphin_bench::results::out_path(
        "router_overhead",
        args.out.as_deref(),
        args.router_wrapper.is_some(),
    );
    let path = dolphin_bench::results::write_json("router_overhead", out.as_deref(), &report)?;
    println!("wrote {}", path.display());
    if failed > 0 {
        bail!("{failed} requests failed; the numbers above are not trustworthy");
    }
    Ok(())
}

/// The peer phase a Dolphin (or smg) phase is compared with: same concurrency, same response
/// shape (gRPC counts as whole).
fn peer_of(phases: &[Phase], target: Target, like: &Phase) -> Option<f64> {
    phases
        .iter()
        .find(|p| {
            p.router == target
                && p.concurrency == like.concurrency
                && p.mode.sse() == like.mode.sse()
        })
        .map(|p| p.cpu_us_per_req)
        .filter(|c| *c > 0.0)
}

fn fill_ratios(phases: &mut [Phase]) {
    let ratios: Vec<(Option<f64>, Option<f64>)> = phases
        .iter()
        .map(|p| {
            let smg = match p.router {
                Target::DolphinLocal => peer_of(phases, Target::Smg, p),
                Target::DolphinRemote => peer_of(phases, Target::SmgPd, p),
                _ => None,
            };
            let nginx = match p.router {
                Target::None | Target::Nginx => None,
                _ => peer_of(phases, Target::Nginx, p),
            };
            (
                nginx.map(|n| p.cpu_us_per_req / n),
                smg.map(|s| p.cpu_us_per_req / s),
            )
        })
        .collect();
    for (p, (n, s)) in phases.iter_mut().zip(ratios) {
        p.ratio_to_nginx = n;
        p.ratio_to_smg = s;
    }
}

/// Per mode and concurrency (every round runs them in the same order): the round with the
/// median CPU per request, carrying the median of the rounds' added p50 and same-round ratios.
fn median_phases(rounds: &[Vec<Phase>]) -> Vec<Phase> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|i| {
            let mut of: Vec<&Phase> = rounds.iter().filter_map(|r| r.get(i)).collect();
            of.sort_by(|a, b| a.cpu_us_per_req.total_cmp(&b.cpu_us_per_req));
            let median_of = |f: fn(&Phase) -> Option<f64>| {
                let v: Vec<f64> = of.iter().filter_map(|p| f(p)).collect();
                (!v.is_empty()).then(|| median(v.iter().copied()))
            };
            Phase {
                added_p50_ms: median_of(|p| p.added_p50_ms),
                ratio_to_nginx: median_of(|p| p.ratio_to_nginx),
                ratio_to_smg: median_of(|p| p.ratio_to_smg),
                ..of[of.len() / 2].clone()
            }
        })
        .collect()
}

fn checks(phases: &[Phase]) -> Vec<Check> {
    let mut out = Vec::new();
    for p in phases {
        let name = format!("{} c={}", p.mode.as_str(), p.concurrency);
        match p.router {
            Target::DolphinLocal | Target::DolphinRemote => {
                let limit = if p.router == Target::DolphinLocal {
                    TARGET_CPU_VS_NGINX_LOCAL
                } else {
                    TARGET_CPU_VS_NGINX_REMOTE
                };
                out.push(Check {
                    what: format!("{name}: CPU / nginx's"),
                    value: p.ratio_to_nginx,
                    limit,
                    met: p.ratio_to_nginx.is_some_and(|r| r <= limit),
                });
                out.push(Check {
                    what: format!("{name}: CPU / smg's"),
                    value: p.ratio_to_smg,
                    limit: TARGET_CPU_VS_SMG,
                    met: p.ratio_to_smg.is_some_and(|r| r <= TARGET_CPU_VS_SMG),
                });
                if p.concurrency == 1 {
                    out.push(Check {
                        what: format!("{name}: added p50 ms"),
                        value: p.added_p50_ms,
                        limit: TARGET_ADDED_P50_MS,
                        met: p.added_p50_ms.is_some_and(|a| a <= TARGET_ADDED_P50_MS),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

fn print_phase(p: &Phase) {
    println!(
        "{:<16} c={:<3} {:>8.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  added p50 {:>9}  router CPU {:>6.1} us/req (net {:>6.1})  worker CPU {:>6.1} us/req  n={} err={}",
        p.mode.as_str(),
        p.concurrency,
        p.requests_per_s,
        p.latency.p50_us / 1e3,
        p.latency.p99_us / 1e3,
        p.added_p50_ms
            .map_or("-".to_string(), |a| format!("{a:.3} ms")),
        p.router_cpu_us_per_request,
        p.cpu_us_per_req,
        p.worker_cpu_us_per_request,
        p.requests,
        p.errors,
    );
    if let Some(e) = &p.first_error {
        println!("  first error: {e}");
    }
}

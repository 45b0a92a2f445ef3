//! Load and faults through the real router (issue 12 item 8), on the zero-delay sim engine with
//! etcd membership: two decode workers, one prefill worker, one router.
//!
//! - `streams`: 10,000 concurrent gRPC streams at once (over `--connections` connections), and
//!   the same requests sent straight to the decode workers as the baseline. Reports errors,
//!   TTFT and end-to-end p50/p99 with the router's added latency, the peak number of open
//!   streams the router counted, and its memory: peak RSS over the idle RSS, per open stream.
//! - `kill`: closed-loop load while a decode worker is SIGKILLed every `--kill-every-ms` and
//!   started again (alternating, so one is always alive). Every request must complete, by
//!   migration; reports failures, migrations and kills.
//! - `etcd`: closed-loop load while etcd is SIGKILLed for `--etcd-down-secs` and started again
//!   on its data: the router serves on the last known membership, nothing fails, and the
//!   membership is whole afterwards.
//!
//! Needs the release binaries and etcd:
//! `cargo build --release --bins -p dolphin-router -p dolphin-decode-worker -p dolphin-prefill-worker -p dolphin-bench`
//! then `target/release/load_faults` (JSON in `bench/results/load_faults.json`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use dolphin_bench::machine;
use dolphin_bench::overhead_cluster::wait_for_workers;
use dolphin_bench::process::{
    ChildProcess, router_listener_args, sibling_binary, spawn_ready, strings, wrapped,
};
use dolphin_bench::stats::Summary;
use dolphin_cluster::testing::EtcdServer;
use dolphin_proto::v1::decode_worker_client::DecodeWorkerClient;
use dolphin_proto::v1::generate_request::Input;
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::{self, FinishReason};
use parking_lot::Mutex;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

const MODEL: &str = "sim-model";
const READY: Duration = Duration::from_secs(60);
/// The targets.
const TARGET_BYTES_PER_STREAM: f64 = 20.0 * 1024.0;

#[derive(Debug, Parser)]
#[command(about = "10,000 streams, decode workers killed, etcd down: through the real router")]
struct Args {
    /// Phases to run, comma-separated: streams, kill, etcd.
    #[arg(long, default_value = "streams,kill,etcd")]
    phases: String,
    /// Concurrent streams of the `streams` phase.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// Client connections the streams share.
    #[arg(long, default_value_t = 100)]
    connections: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// Concurrent clients of the closed-loop phases.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Seconds of the `kill` phase.
    #[arg(long, default_value_t = 20)]
    kill_secs: u64,
    /// A decode worker is killed this often in the `kill` phase.
    #[arg(long, default_value_t = 3000)]
    kill_every_ms: u64,
    /// Seconds etcd stays down in the `etcd` phase.
    #[arg(long, default_value_t = 30)]
    etcd_down_secs: u64,
    /// Where the processes' logs go.
    #[arg(long, default_value = "target/load_faults")]
    log_dir: std::path::PathBuf,
    /// Run the router under this command (split on spaces), e.g. a heap profiler:
    /// "heaptrack -o /tmp/router" with a router built `--features system-allocator`. The
    /// router is stopped with SIGTERM at the end so the tool can write its output. Its memory
    /// figures are then the wrapper's process, not the router's.
    #[arg(long)]
    router_wrapper: Option<String>,
    /// The router binary (default: dolphin-router beside this binary).
    #[arg(long)]
    router_bin: Option<std::path::PathBuf>,
    /// Write the JSON here instead of `bench/results/load_faults.json` (with
    /// `--router-wrapper`: the temporary directory's `load_faults_wrapped.json`).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// The cluster: etcd, two decode workers, one prefill worker, the router.
struct Cluster {
    etcd: EtcdServer,
    decode: Vec<ChildProcess>,
    prefill: ChildProcess,
    router: ChildProcess,
    log_dir: std::path::PathBuf,
    restarts: usize,
}

fn worker_args(etcd: &str, extra: &[&str]) -> Vec<String> {
    let mut a = strings(&["--grpc-addr", "127.0.0.1:0", "--engine", "sim"]);
    a.extend(strings(&["--sim-time-scale", "0", "--model", MODEL]));
    // Room for every stream's blocks: 5,000 streams of 96 tokens per worker is 30,000 blocks.
    a.extend(strings(&[
        "--total-blocks",
        "65536",
        "--lease-ttl-secs",
        "5",
    ]));
    a.extend(strings(&["--etcd", etcd]));
    a.extend(strings(extra));
    a
}

impl Cluster {
    async fn start(log_dir: &Path, launch: &Args) -> anyhow::Result<Self> {
        let etcd = EtcdServer::start().await;
        let url = etcd.endpoint();
        let decode_bin = sibling_binary("dolphin-decode-worker")?;
        let mut decode = Vec::new();
        for i in 0..2 {
            let args = worker_args(&url, &["--kv-addr", "127.0.0.1:0"]);
            decode.push(
                spawn_ready(
                    &format!("decode-{i}"),
                    &decode_bin,
                    &args,
                    &[],
                    log_dir,
                    READY,
                )
                .await?,
            );
        }
        let prefill_bin = sibling_binary("dolphin-prefill-worker")?;
        let prefill = spawn_ready(
            "prefill",
            &prefill_bin,
            &worker_args(&url, &[]),
            &[],
            log_dir,
            READY,
        )
        .await?;
        let mut args = router_listener_args();
        args.extend(strings(&["--etcd", &url, "--model", MODEL]));
        // The router's own limit above the phase's streams: this measures memory, not shedding.
        args.extend(strings(&["--max-inflight", "20000"]));
        let router_bin = match &launch.router_bin {
            Some(bin) => bin.clone(),
            None => sibling_binary("dolphin-router")?,
        };
        let wrapper: Vec<String> = launch
            .router_wrapper
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let (program, args) = wrapped(&wrapper, router_bin, args);
        let router = spawn_ready("router", &program, &args, &[], log_dir, READY).await?;
        wait_for_workers(router.admin_addr()?, 3).await?;
        Ok(Self {
            etcd,
            decode,
            prefill,
            router,
            log_dir: log_dir.to_owned(),
            restarts: 0,
        })
    }

    /// SIGKILLs decode worker `i` and starts a new one in its place (a new id, registered in
    /// etcd, as a restarted pod would).
    async fn kill_and_restart(&mut self, i: usize) -> anyhow::Result<()> {
        let url = self.etcd.endpoint();
        self.restarts += 1;
        let name = format!("decode-{i}-restart-{}", self.restarts);
        let args = worker_args(&url, &["--kv-addr", "127.0.0.1:0"]);
        let bin = sibling_binary("dolphin-decode-worker")?;
        // Dropping the old process SIGKILLs it.
        let old = std::mem::replace(
            &mut self.decode[i],
            spawn_ready(&name, &bin, &args, &[], &self.log_dir, READY).await?,
        );
        drop(old);
        Ok(())
    }

    fn grpc_addr(&self) -> anyhow::Result<String> {
        Ok(self.router.grpc_addr()?.to_owned())
    }
}

/// Resident and peak resident memory of `pid`, in bytes.
fn memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Ok((
        field("VmRSS:").context("VmRSS")?,
        field("VmHWM:").context("VmHWM")?,
    ))
}

/// The router's `dolphin_router_inflight_requests` gauge.
async fn router_inflight(metrics_addr: &str) -> Option<f64> {
    let text = http_get(metrics_addr, "/metrics").await.ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("dolphin_router_inflight_requests "))
        .and_then(|v| v.trim().parse().ok())
}

async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

async fn channels(addr: &str, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            Endpoint::from_shared(format!("http://{addr}"))?
                .tcp_nodelay(true)
                .connect()
                .await?,
        );
    }
    Ok(out)
}

fn prompt(i: usize, len: usize) -> Vec<u32> {
    // Printable ids of the sim tokenizer's range, distinct per request.
    (0..len)
        .map(|j| 100 + ((i * 31 + j * 7) % 90) as u32)
        .collect()
}

fn sampling(max_tokens: u32) -> v1::SamplingParams {
    v1::SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// One finished request as the client saw it.
#[derive(Clone, Debug, Default)]
struct Outcome {
    ttft: Option<Duration>,
    e2e: Duration,
    tokens: usize,
    complete: bool,
    migrations: u32,
    error: Option<String>,
}

impl Outcome {
    /// Counts one message of the stream: its tokens, and whether it finished the request.
    fn message(&mut self, started: Instant, tokens: usize, finish_reason: i32, max_tokens: u32) {
        if tokens > 0 {
            self.ttft.get_or_insert_with(|| started.elapsed());
            self.tokens += tokens;
        }
        if finish_reason == FinishReason::Length as i32 {
            self.complete = self.tokens == max_tokens as usize;
        }
    }

    /// Closes the outcome: the stream's end (`result`) and the time it took.
    fn end(mut self, started: Instant, result: Result<(), tonic::Status>) -> Self {
        if let Err(s) = result {
            self.error = Some(format!("{:?}: {}", s.code(), s.message()));
        } else if !self.complete {
            self.error = Some(format!("incomplete: {} tokens", self.tokens));
        }
        self.e2e = started.elapsed();
        self
    }
}

async fn through_router(ch: Channel, i: usize, args: &Args) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome::default();
    let req = v1::GenerateRequest {
        model: MODEL.into(),
        input: Some(Input::TokenIds(v1::TokenIds {
            ids: prompt(i, args.prompt_tokens),
        })),
        sampling: Some(sampling(args.max_tokens)),
        ..Default::default()
    };
    let result = async {
        let mut stream = InferenceClient::new(ch).generate(req).await?.into_inner();
        while let Some(msg) = stream.message().await? {
            out.message(
                started,
                msg.token_ids.len(),
                msg.finish_reason,
                args.max_tokens,
            );
            if let Some(r) = &msg.routing {
                out.migrations = r.migrations;
            }
        }
        Ok::<_, tonic::Status>(())
    }
    .await;
    out.end(started, result)
}

async fn direct(ch: Channel, i: usize, args: &Args) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome::default();
    let req = v1::DecodeRequest {
        request_id: format!("direct-{i}"),
        token_ids: prompt(i, args.prompt_tokens),
        sampling: Some(sampling(args.max_tokens)),
        remote: None,
    };
    let result = async {
        let mut stream = DecodeWorkerClient::new(ch).decode(req).await?.into_inner();
        while let Some(msg) = stream.message().await? {
            out.message(
                started,
                msg.token_ids.len(),
                msg.finish_reason,
                args.max_tokens,
            );
        }
        Ok::<_, tonic::Status>(())
    }
    .await;
    out.end(started, result)
}

#[derive(Debug, Serialize)]
struct Latency {
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    e2e_p50_ms: f64,
    e2e_p99_ms: f64,
}

fn latency(outcomes: &[Outcome]) -> Latency {
    let summary = |f: &dyn Fn(&Outcome) -> Option<Duration>| {
        let mut ns: Vec<u64> = outcomes
            .iter()
            .filter_map(f)
            .map(|d| d.as_nanos() as u64)
            .collect();
        Summary::from_nanos(&mut ns)
    };
    let ttft = summary(&|o| o.ttft);
    let e2e = summary(&|o| Some(o.e2e));
    Latency {
        ttft_p50_ms: ttft.p50_us / 1e3,
        ttft_p99_ms: ttft.p99_us / 1e3,
        e2e_p50_ms: e2e.p50_us / 1e3,
        e2e_p99_ms: e2e.p99_us / 1e3,
    }
}

fn errors(outcomes: &[Outcome]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in outcomes.iter().filter_map(|o| o.error.as_ref()) {
        // One line per kind: the message without the worker ids.
        let key: String = e.chars().take(120).collect();
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

#[derive(Debug, Serialize)]
struct StreamsResult {
    streams: usize,
    connections: usize,
    errors: usize,
    error_kinds: BTreeMap<String, usize>,
    router: Latency,
    direct: Latency,
    direct_errors: usize,
    added_ttft_p50_ms: f64,
    added_ttft_p99_ms: f64,
    added_e2e_p50_ms: f64,
    added_e2e_p99_ms: f64,
    peak_open_streams: f64,
    router_rss_idle_bytes: u64,
    router_rss_peak_bytes: u64,
    bytes_per_open_stream: f64,
    target_bytes_per_stream: f64,
    met: bool,
}

async fn phase_streams(cluster: &Cluster, args: &Arc<Args>) -> anyhow::Result<StreamsResult> {
    let router_pid = cluster.router.pid();
    // Direct baseline first: the same requests, split over both decode workers.
    let mut direct_channels = Vec::new();
    for d in &cluster.decode {
        direct_channels.extend(channels(d.grpc_addr()?, args.connections / 2).await?);
    }
    let t = Instant::now();
    let tasks: Vec<_> = (0..args.streams)
        .map(|i| {
            let ch = direct_channels[i % direct_channels.len()].clone();
            let a = Arc::clone(args);
            tokio::spawn(async move { direct(ch, i + 1_000_000, &a).await })
        })
        .collect();
    let mut direct_out = Vec::new();
    for t in tasks {
        direct_out.push(t.await?);
    }
    println!(
        "direct: {} streams in {:.1} s",
        direct_out.len(),
        t.elapsed().as_secs_f64()
    );
    drop(direct_channels);

    let chans = channels(&cluster.grpc_addr()?, args.connections).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_rss, _) = memory(router_pid)?;
    let peak_rss = Arc::new(AtomicU64::new(idle_rss));
    let peak_open = Arc::new(Mutex::new(0f64));
    let done = Arc::new(AtomicBool::new(false));
    let metrics_addr = cluster.router.metrics_addr()?.to_owned();
    let sampler = {
        let (peak_rss, peak_open, done) = (peak_rss.clone(), peak_open.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                if let Ok((rss, _)) = memory(router_pid) {
                    peak_rss.fetch_max(rss, Ordering::Relaxed);
                }
                if let Some(n) = router_inflight(&metrics_addr).await {
                    let mut p = peak_open.lock();
                    *p = p.max(n);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let t = Instant::now();
    let tasks: Vec<_> = (0..args.streams)
        .map(|i| {
            let ch = chans[i % chans.len()].clone();
            let a = Arc::clone(args);
            tokio::spawn(async move { through_router(ch, i, &a).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await?);
    }
    done.store(true, Ordering::Relaxed);
    sampler.await?;
    println!(
        "router: {} streams in {:.1} s",
        out.len(),
        t.elapsed().as_secs_f64()
    );
    let (_, hwm) = memory(router_pid)?;
    let peak = peak_rss.load(Ordering::Relaxed).max(hwm);
    let peak_open = *peak_open.lock();
    let router = latency(&out);
    let base = latency(&direct_out);
    let errors_n = out.iter().filter(|o| o.error.is_some()).count();
    let per_stream = (peak.saturating_sub(idle_rss)) as f64 / peak_open.max(1.0);
    Ok(StreamsResult {
        streams: args.streams,
        connections: args.connections,
        errors: errors_n,
        error_kinds: errors(&out),
        added_ttft_p50_ms: router.ttft_p50_ms - base.ttft_p50_ms,
        added_ttft_p99_ms: router.ttft_p99_ms - base.ttft_p99_ms,
        added_e2e_p50_ms: router.e2e_p50_ms - base.e2e_p50_ms,
        added_e2e_p99_ms: router.e2e_p99_ms - base.e2e_p99_ms,
        router,
        direct: base,
        direct_errors: direct_out.iter().filter(|o| o.error.is_some()).count(),
        peak_open_streams: peak_open,
        router_rss_idle_bytes: idle_rss,
        router_rss_peak_bytes: peak,
        bytes_per_open_stream: per_stream,
        target_bytes_per_stream: TARGET_BYTES_PER_STREAM,
        // Under a wrapper the pid measured is the wrapper's: no memory verdict.
        met: errors_n == 0
            && args.router_wrapper.is_none()
            && per_stream <= TARGET_BYTES_PER_STREAM,
    })
}

#[derive(Debug, Serialize)]
struct LoadResult {
    seconds: f64,
    clients: usize,
    requests: usize,
    failed: usize,
    error_kinds: BTreeMap<String, usize>,
    migrated_requests: usize,
    migrations: u64,
    latency: Latency,
}

/// Closed-loop load from `clients` clients until `stop` is set; the outcomes.
async fn closed_loop(chans: &[Channel], args: &Arc<Args>, stop: Arc<AtomicBool>) -> Vec<Outcome> {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..args.clients)
        .map(|c| {
            let ch = chans[c % chans.len()].clone();
            let (stop, next) = (stop.clone(), next.clone());
            let a = Arc::clone(args);
            tokio::spawn(async move {
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    out.push(through_router(ch.clone(), i, &a).await);
                }
                out
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        if let Ok(o) = t.await {
            out.extend(o);
        }
    }
    out
}

fn load_result(out: &[Outcome], seconds: f64, clients: usize) -> LoadResult {
    LoadResult {
        seconds,
        clients,
        requests: out.len(),
        failed: out.iter().filter(|o| o.error.is_some()).count(),
        error_kinds: errors(out),
        migrated_requests: out.iter().filter(|o| o.migrations > 0).count(),
        migrations: out.iter().map(|o| u64::from(o.migrations)).sum(),
        latency: latency(out),
    }
}

#[derive(Debug, Serialize)]
struct KillResult {
    load: LoadResult,
    kills: usize,
    met: bool,
}

async fn phase_kill(cluster: &mut Cluster, args: &Arc<Args>) -> anyhow::Result<KillResult> {
    let chans = channels(&cluster.grpc_addr()?, args.connections.min(16)).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let t = Instant::now();
    let load = {
        let (chans, stop, a) = (chans.clone(), stop.clone(), Arc::clone(args));
        tokio::spawn(async move { closed_loop(&chans, &a, stop).await })
    };
    let mut kills = 0;
    while t.elapsed() < Duration::from_secs(args.kill_secs) {
        tokio::time::sleep(Duration::from_millis(args.kill_every_ms)).await;
        let victim = kills % 2;
        cluster.kill_and_restart(victim).await?;
        kills += 1;
        println!("killed and restarted decode worker {victim} ({kills})");
    }
    stop.store(true, Ordering::Relaxed);
    let out = load.await?;
    let load = load_result(&out, t.elapsed().as_secs_f64(), args.clients);
    let met = load.failed == 0 && load.requests > 0;
    Ok(KillResult { load, kills, met })
}

#[derive(Debug, Serialize)]
struct EtcdResult {
    load: LoadResult,
    etcd_down_secs: u64,
    workers_before: usize,
    workers_after: usize,
    met: bool,
}

async fn listed_workers(admin_addr: &str) -> anyhow::Result<usize> {
    let mut admin =
        v1::router_admin_client::RouterAdminClient::connect(format!("http://{admin_addr}")).await?;
    Ok(admin
        .list_workers(v1::ListWorkersRequest {})
        .await?
        .into_inner()
        .workers
        .len())
}

async fn phase_etcd(cluster: &mut Cluster, args: &Arc<Args>) -> anyhow::Result<EtcdResult> {
    let admin = cluster.router.admin_addr()?.to_owned();
    // Let restarted workers of the kill phase settle and old leases expire.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let workers_before = listed_workers(&admin).await?;
    let chans = channels(&cluster.grpc_addr()?, args.connections.min(16)).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let t = Instant::now();
    let load = {
        let (chans, stop, a) = (chans.clone(), stop.clone(), Arc::clone(args));
        tokio::spawn(async move { closed_loop(&chans, &a, stop).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.etcd.kill();
    println!("etcd down");
    tokio::time::sleep(Duration::from_secs(args.etcd_down_secs)).await;
    cluster.etcd.restart().await;
    println!("etcd up again");
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    let out = load.await?;
    let workers_after = listed_workers(&admin).await?;
    let load = load_result(&out, t.elapsed().as_secs_f64(), args.clients);
    let met = load.failed == 0 && workers_after == workers_before;
    Ok(EtcdResult {
        load,
        etcd_down_secs: args.etcd_down_secs,
        workers_before,
        workers_after,
        met,
    })
}

#[derive(Debug, Serialize)]
struct Report {
    cpu: String,
    cpu_flags: Vec<&'static str>,
    cores: usize,
    /// The kernel's transparent huge page mode: it moves the router's resident memory.
    transparent_huge_pages: String,
    /// `MIMALLOC_*` settings the router inherited (its allocator's options).
    mimalloc_env: BTreeMap<String, String>,
    command: String,
    streams: Option<StreamsResult>,
    kill: Option<KillResult>,
    etcd: Option<EtcdResult>,
}

fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Arc<Args>) -> anyhow::Result<()> {
    let phases: Vec<&str> = args.phases.split(',').map(str::trim).collect();
    for p in &phases {
        if !["streams", "kill", "etcd"].contains(p) {
            bail!("unknown phase {p:?} (streams, kill, etcd)");
        }
    }
    let mut cluster = Cluster::start(&args.log_dir, &args).await?;
    let mut report = Report {
        cpu: machine::cpu_name(),
        cpu_flags: machine::cpu_flags(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        transparent_huge_pages: machine::transparent_huge_pages(),
        mimalloc_env: std::env::vars()
            .filter(|(k, _)| k.starts_with("MIMALLOC_"))
            .collect(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        streams: None,
        kill: None,
        etcd: None,
    };
    if phases.contains(&"streams") {
        let r = phase_streams(&cluster, &args).await?;
        println!("{}", serde_json::to_string_pretty(&r)?);
        report.streams = Some(r);
    }
    if phases.contains(&"kill") {
        let r = phase_kill(&mut cluster, &args).await?;
        println!("{}", serde_json::to_string_pretty(&r)?);
        report.kill = Some(r);
    }
    if phases.contains(&"etcd") {
        let r = phase_etcd(&mut cluster, &args).await?;
        println!("{}", serde_json::to_string_pretty(&r)?);
        report.etcd = Some(r);
    }
    let out = dolphin_bench::results::out_path(
        "load_faults",
        args.out.as_deref(),
        args.router_wrapper.is_some(),
    );
    let path = dolphin_bench::results::write_json("load_faults", out.as_deref(), &report)?;
    println!("wrote {}", path.display());
    if !cluster.router.stop(Duration::from_secs(60)).await {
        eprintln!("the router did not exit within 60 s of SIGTERM");
    }
    drop(cluster.prefill);
    Ok(())
}

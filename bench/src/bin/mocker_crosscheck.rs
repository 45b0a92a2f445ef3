//! Dolphin's cluster simulator against NVIDIA Dynamo's mocker, the engine it models, on the same
//! requests in the same run (issue 14 item 7). Target: P50 and P90 TTFT and TPOT within 10%.
//!
//! The mocker runs through Dynamo 1.6.1's own offline replay (`dynamo.replay.run_trace_replay`:
//! the mocker's vLLM scheduler, KV manager and timing on a virtual clock), driven by
//! `bench/peers/dynamo_mocker_replay.py` in the venv `scripts/install-peers.sh` makes
//! (`$DOLPHIN_PEERS_DIR/dynamo-venv`). The simulator runs the `dynamo-mocker` profile (the
//! mocker's timing polynomials) with the mocker's engine settings: blocks of 16 tokens, 16,384
//! blocks per worker, 8,192 tokens per step, no other cap on prefill tokens, KV at 131,072
//! bytes per token over 12.5 GB/s. Prompts are hash ids, one per block, on both sides. When the
//! mocker is not installed, its side is reported as missing and the simulator's numbers alone
//! are written.
//!
//! The simulator is compared with `SchedulerModel::Vllm` (the requests of one instant enter one
//! step, as in the mocker's replay); its default, Dolphin's engine (a step starts on the first
//! arrival), is reported beside it. Two differences are Dolphin's design and are marked so in
//! the result: its prefill worker samples the first token, and its decode worker reserves KV
//! before a remote prefill starts.
//!
//! Cases: single requests of 111, 2,011 and 8,011 prompt tokens; sixteen requests at once over
//! one shared 2,000-token prefix (in a 16,384-block and a 4,096-block pool: decode time follows
//! the KV each sequence reads); sixteen unique 2,011-token prompts at once; one remote prefill
//! (prefill, KV transfer, decode); and the first 400 requests of the Mooncake conversation trace,
//! at their own arrival times and at four times their intervals, on one aggregated worker and
//! on one prefill plus one decode worker.
//!
//! `cargo build --release -p dolphin-bench --bin mocker_crosscheck`, then
//! `scripts/install-peers.sh && target/release/mocker_crosscheck` (a few seconds).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use dolphin_engine::SimProfile;
use dolphin_router::policy::Policy;
use dolphin_sim::{Percentiles, SchedulerModel, SimCluster, SimClusterConfig, SimRequest, Slo};
use serde::{Deserialize, Serialize};

/// Issue 14: the sim engine within 10% of the mocker.
const TARGET_PCT: f64 = 10.0;
/// Tokens per KV block on both sides (and per hash id).
const BLOCK: u32 = 16;
/// Tokens each Mooncake trace id stands for.
const MOONCAKE_TOKENS_PER_ID: u32 = 512;

#[derive(Debug, Parser)]
#[command(about = "TTFT / TPOT of Dolphin's simulator against Dynamo's mocker, same requests")]
struct Args {
    /// Python of the venv with Dynamo 1.6.1 (default: $DOLPHIN_PEERS_DIR/dynamo-venv/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
    /// The Mooncake conversation trace.
    #[arg(long, default_value = "../shared/traces/mooncake-conversation.jsonl")]
    mooncake: PathBuf,
    /// Requests taken from the start of the trace, at their own arrival times.
    #[arg(long, default_value_t = 400)]
    mooncake_requests: usize,
    /// The trace's arrival times multiplied by each of these, one pair of cases per value: at
    /// its own rate (1) the trace overloads one worker; at 4 the queues stay seconds long.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    mooncake_stretch: Vec<f64>,
    /// Timing profile of the simulator.
    #[arg(long, default_value = "dynamo-mocker")]
    profile: String,
    /// Where to write the result (default: bench/results/mocker_crosscheck.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Engine settings shared by both sides.
#[derive(Clone, Copy, Debug, Serialize)]
struct EngineSettings {
    block_size: u32,
    num_gpu_blocks: u32,
    max_num_batched_tokens: u32,
    kv_transfer_bytes_per_token: u64,
    /// GB/s.
    kv_transfer_bandwidth: f64,
}

impl EngineSettings {
    fn mocker_defaults(profile: &SimProfile) -> Self {
        EngineSettings {
            block_size: BLOCK,
            num_gpu_blocks: 16_384,
            max_num_batched_tokens: 8192,
            kv_transfer_bytes_per_token: profile.kv_bytes_per_token,
            kv_transfer_bandwidth: profile.link_gbps / 8.0,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
struct Req {
    arrival_ms: f64,
    input_length: u32,
    output_length: u32,
    /// One per `BLOCK` tokens.
    hash_ids: Vec<u64>,
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    what: &'static str,
    /// 0: aggregated workers, every prompt local.
    prefill: u32,
    decode: u32,
    engine: EngineSettings,
    requests: Vec<Req>,
}

/// Dolphin's prefill worker samples the first token and ships it with the KV.
const FIRST_TOKEN_ON_PREFILL: &str = "Dolphin's prefill worker samples the first token and sends it \
    with the KV; the mocker's decode worker computes it in a decode step after the transfer";
/// Dolphin's decode worker reserves KV before the remote prefill starts.
const RESERVE_BEFORE_PREFILL: &str = "Dolphin's decode worker reserves the prompt's and the \
    answer's KV before the remote prefill starts, so an admitted request is never preempted; \
    the mocker's decode worker allocates when the KV arrives and preempts when full. Where \
    decode memory is the bottleneck, requests wait longer for it";

#[derive(Serialize)]
struct MockerCase<'a> {
    name: &'a str,
    prefill: u32,
    decode: u32,
    engine: EngineSettings,
    requests: &'a [Req],
}

#[derive(Deserialize)]
struct MockerOutput {
    dynamo_version: String,
    cases: Vec<MockerCaseOut>,
}

#[derive(Deserialize)]
struct MockerCaseOut {
    name: String,
    requests: Vec<MockerRecord>,
    wall_ms: f64,
}

#[derive(Deserialize)]
struct MockerRecord {
    ttft_ms: f64,
    tpot_ms: f64,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Side {
    ttft: Percentiles,
    tpot: Percentiles,
    /// Wall time of the simulation itself, ms.
    wall_ms: f64,
}

impl Side {
    fn of(ttft: impl Iterator<Item = f64>, tpot: impl Iterator<Item = f64>, wall_ms: f64) -> Self {
        Side {
            ttft: Percentiles::of(&mut ttft.collect::<Vec<_>>()),
            tpot: Percentiles::of(&mut tpot.collect::<Vec<_>>()),
            wall_ms,
        }
    }
}

/// Ours against the mocker's, percent.
#[derive(Clone, Copy, Debug, Serialize)]
struct Diff {
    ttft_p50: f64,
    ttft_p90: f64,
    tpot_p50: f64,
    tpot_p90: f64,
}

impl Diff {
    fn of(ours: &Side, theirs: &Side) -> Self {
        let pct = |a: f64, b: f64| if b > 0.0 { (a / b - 1.0) * 100.0 } else { 0.0 };
        Diff {
            ttft_p50: pct(ours.ttft.p50, theirs.ttft.p50),
            ttft_p90: pct(ours.ttft.p90, theirs.ttft.p90),
            tpot_p50: pct(ours.tpot.p50, theirs.tpot.p50),
            tpot_p90: pct(ours.tpot.p90, theirs.tpot.p90),
        }
    }

    fn worst(&self) -> f64 {
        [self.ttft_p50, self.ttft_p90, self.tpot_p50, self.tpot_p90]
            .into_iter()
            .map(f64::abs)
            .fold(0.0, f64::max)
    }
}

#[derive(Serialize)]
struct CaseResult {
    name: String,
    what: &'static str,
    split: String,
    requests: usize,
    num_gpu_blocks: u32,
    /// The simulator with vLLM's scheduling (`SchedulerModel::Vllm`), the one compared.
    dolphin_sim: Side,
    /// The simulator with Dolphin's engine's scheduling (its default): what differs where a
    /// burst shares a prefix no step has computed yet.
    dolphin_sim_own_engine: Side,
    mocker: Option<Side>,
    /// Dolphin's simulator against the mocker, percent.
    diff_pct: Option<Diff>,
    /// Every one of the four within the target.
    within_target: Option<bool>,
    /// A difference that comes from how Dolphin's cluster works, not from the model.
    by_design: Option<&'static str>,
}

#[derive(Serialize)]
struct Report {
    bench: &'static str,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    profile: String,
    /// The mocker's version, or why it did not run.
    mocker: Result<String, String>,
    target_pct: f64,
    cases: Vec<CaseResult>,
}

/// Hands out hash ids no other prompt uses.
struct Ids(u64);

impl Ids {
    fn fresh(&mut self, n: u32) -> Vec<u64> {
        let ids = (self.0..self.0 + u64::from(n)).collect();
        self.0 += u64::from(n);
        ids
    }

    /// A request whose prompt shares nothing.
    fn unique(&mut self, arrival_ms: f64, input: u32, output: u32) -> Req {
        Req {
            arrival_ms,
            input_length: input,
            output_length: output,
            hash_ids: self.fresh(input.div_ceil(BLOCK)),
        }
    }
}

fn cases(args: &Args, engine: EngineSettings) -> anyhow::Result<Vec<Case>> {
    let mut ids = Ids(1);
    let agg = |name: &str, what, requests| Case {
        name: name.to_string(),
        what,
        prefill: 0,
        decode: 1,
        engine,
        requests,
    };
    let mut out = vec![
        agg(
            "single_111",
            "one request, 111-token prompt, 100 tokens out",
            vec![ids.unique(0.0, 111, 100)],
        ),
        agg(
            "single_2011",
            "one request, 2,011-token prompt, 100 tokens out",
            vec![ids.unique(0.0, 2011, 100)],
        ),
        agg(
            "single_8011",
            "one request, 8,011-token prompt, 100 tokens out",
            vec![ids.unique(0.0, 8011, 100)],
        ),
        agg(
            "unique_burst_16",
            "16 unique 2,011-token prompts at once, 100 tokens out",
            (0..16).map(|_| ids.unique(0.0, 2011, 100)).collect(),
        ),
    ];
    // Sixteen 2,011-token prompts: a shared 2,000-token prefix (125 blocks) and 11 tokens each.
    let prefix = ids.fresh(125);
    let shared: Vec<Req> = (0..16)
        .map(|_| {
            let mut hash_ids = prefix.clone();
            hash_ids.extend(ids.fresh(1));
            Req {
                arrival_ms: 0.0,
                input_length: 2011,
                output_length: 100,
                hash_ids,
            }
        })
        .collect();
    out.push(agg(
        "shared_prefix_16",
        "16 prompts at once over one 2,000-token prefix, 100 tokens out",
        shared.clone(),
    ));
    let mut small = agg(
        "shared_prefix_16_pool_4096",
        "the same in a 4,096-block pool (decode reads a larger share of it)",
        shared,
    );
    small.engine.num_gpu_blocks = 4096;
    out.push(small);
    out.push(Case {
        name: "remote_2011".into(),
        what: "one 2,011-token prompt prefilled remotely: prefill, KV transfer, decode",
        prefill: 1,
        decode: 1,
        engine,
        requests: vec![ids.unique(0.0, 2011, 100)],
    });
    for &stretch in &args.mooncake_stretch {
        let trace = mooncake(&args.mooncake, args.mooncake_requests, stretch)?;
        out.push(Case {
            name: format!("mooncake_agg_x{stretch}"),
            what: "Mooncake conversation trace, its first requests, arrival times multiplied by x, one worker",
            prefill: 0,
            decode: 1,
            engine,
            requests: trace.clone(),
        });
        out.push(Case {
            name: format!("mooncake_1p1d_x{stretch}"),
            what: "the same on one prefill and one decode worker, every prompt remote",
            prefill: 1,
            decode: 1,
            engine,
            requests: trace,
        });
    }
    Ok(out)
}

/// The first `n` requests of the trace, each 512-token id split into the 32 blocks it stands
/// for (ids `id * 32 + k`), cut to the prompt's blocks.
fn mooncake(path: &Path, n: usize, stretch: f64) -> anyhow::Result<Vec<Req>> {
    let w = dolphin_workload::trace::mooncake(path)
        .with_context(|| format!("read {}", path.display()))?;
    anyhow::ensure!(
        w.tokens_per_id == MOONCAKE_TOKENS_PER_ID,
        "unexpected trace id size"
    );
    let per_id = u64::from(MOONCAKE_TOKENS_PER_ID / BLOCK);
    Ok(w.requests
        .iter()
        .take(n)
        .enumerate()
        .map(|(i, r)| {
            let blocks = r.prompt_len.div_ceil(BLOCK) as usize;
            let mut hash_ids: Vec<u64> = r
                .hash_ids
                .iter()
                .flat_map(|&id| (0..per_id).map(move |k| id * per_id + k))
                .take(blocks)
                .collect();
            // Ids covering less than the prompt: the rest is this request's own content.
            let own = (1 << 40) + ((i as u64) << 20);
            while hash_ids.len() < blocks {
                hash_ids.push(own + hash_ids.len() as u64);
            }
            Req {
                arrival_ms: r.arrival_ms * stretch,
                input_length: r.prompt_len,
                output_length: r.output_len,
                hash_ids,
            }
        })
        .collect())
}

fn simulate(case: &Case, profile: &SimProfile, scheduler: SchedulerModel) -> anyhow::Result<Side> {
    let mut cfg = SimClusterConfig::new(case.prefill, case.decode, profile.clone());
    cfg.block_size = case.engine.block_size;
    cfg.total_blocks = case.engine.num_gpu_blocks;
    cfg.max_batched_tokens = case.engine.max_num_batched_tokens;
    cfg.prefill_chunk_tokens = 0;
    cfg.mixed_prefill_tokens = 0;
    cfg.link_gbps = case.engine.kv_transfer_bandwidth * 8.0;
    cfg.scheduler = scheduler;
    cfg.policy = if case.prefill == 0 {
        Policy::AlwaysLocal
    } else {
        Policy::AlwaysRemote
    };
    // Loose targets: attainment is not compared here.
    let slo = Slo::new(1e9, 1e9);
    let reqs: Vec<SimRequest> = case
        .requests
        .iter()
        .map(|r| {
            SimRequest::from_hash_ids(
                r.arrival_ms,
                &r.hash_ids,
                case.engine.block_size,
                r.input_length,
                r.output_length,
                slo,
                case.engine.block_size,
            )
        })
        .collect();
    let mut sim = SimCluster::new(cfg)?;
    let started = Instant::now();
    let report = sim.run(&reqs)?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(Side::of(
        report.records.iter().map(|r| r.ttft_ms),
        report.records.iter().map(|r| r.tpot_ms),
        wall_ms,
    ))
}

fn default_python() -> PathBuf {
    dolphin_bench::peers::peers_dir().join("dynamo-venv/bin/python")
}

/// Runs every case on the mocker: its version and one side per case, or why it could not run.
fn run_mocker(python: &Path, cases: &[Case]) -> anyhow::Result<(String, Vec<Side>)> {
    if !python.is_file() {
        bail!(
            "{} not found (run scripts/install-peers.sh)",
            python.display()
        );
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/dynamo_mocker_replay.py");
    let spec = serde_json::json!({
        "cases": cases.iter().map(|c| MockerCase {
            name: &c.name,
            prefill: c.prefill,
            decode: c.decode,
            engine: c.engine,
            requests: &c.requests,
        }).collect::<Vec<_>>(),
    });
    let mut child = Command::new(python)
        .arg(&script)
        .env("DYN_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {} {}", python.display(), script.display()))?;
    let mut stdin = child.stdin.take().context("mocker stdin")?;
    let body = serde_json::to_vec(&spec)?;
    // Written from a thread: the child may fill its stdout pipe before reading all its input.
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let out = child.wait_with_output().context("wait for the mocker")?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("stdin writer panicked"))?
        .context("write the mocker's input")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!(
            "mocker replay failed ({}): {}",
            out.status,
            tail.join(" | ")
        );
    }
    let parsed: MockerOutput =
        serde_json::from_slice(&out.stdout).context("parse the mocker's output")?;
    let mut sides = Vec::with_capacity(cases.len());
    for (case, got) in cases.iter().zip(&parsed.cases) {
        anyhow::ensure!(
            got.name == case.name,
            "mocker answered {} for {}",
            got.name,
            case.name
        );
        anyhow::ensure!(
            got.requests.len() == case.requests.len(),
            "{}: records missing",
            case.name
        );
        sides.push(Side::of(
            got.requests.iter().map(|r| r.ttft_ms),
            got.requests.iter().map(|r| r.tpot_ms),
            got.wall_ms,
        ));
    }
    anyhow::ensure!(
        sides.len() == cases.len(),
        "mocker answered {} cases",
        sides.len()
    );
    Ok((parsed.dynamo_version, sides))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let profile = SimProfile::load(&args.profile)?;
    let cases = cases(&args, EngineSettings::mocker_defaults(&profile))?;
    let python = args.python.clone().unwrap_or_else(default_python);
    let (mocker, theirs) = match run_mocker(&python, &cases) {
        Ok((version, sides)) => (Ok(version), sides.into_iter().map(Some).collect()),
        Err(e) => {
            eprintln!("mocker_crosscheck: the mocker is missing: {e:#}");
            (Err(format!("{e:#}")), vec![None; cases.len()])
        }
    };
    println!(
        "{:<28} {:>6} | {:>9} {:>9} {:>8} {:>8} | {:>9} {:>9} {:>8} {:>8} | worst",
        "case", "split", "TTFT p50", "p90", "TPOT p50", "p90", "mocker", "p90", "TPOT p50", "p90"
    );
    let mut results = Vec::with_capacity(cases.len());
    for (case, mocker_side) in cases.iter().zip(theirs) {
        let ours =
            simulate(case, &profile, SchedulerModel::Vllm).with_context(|| case.name.clone())?;
        let own =
            simulate(case, &profile, SchedulerModel::Dolphin).with_context(|| case.name.clone())?;
        let diff = mocker_side.as_ref().map(|m| Diff::of(&ours, m));
        let split = if case.prefill == 0 {
            format!("{}agg", case.decode)
        } else {
            format!("{}p{}d", case.prefill, case.decode)
        };
        let m = mocker_side.unwrap_or(Side::of(std::iter::empty(), std::iter::empty(), 0.0));
        println!(
            "{:<28} {:>6} | {:>9.1} {:>9.1} {:>8.2} {:>8.2} | {:>9.1} {:>9.1} {:>8.2} {:>8.2} | {}",
            case.name,
            split,
            ours.ttft.p50,
            ours.ttft.p90,
            ours.tpot.p50,
            ours.tpot.p90,
            m.ttft.p50,
            m.ttft.p90,
            m.tpot.p50,
            m.tpot.p90,
            diff.map_or("-".into(), |d| format!("{:.1}%", d.worst())),
        );
        results.push(CaseResult {
            name: case.name.clone(),
            what: case.what,
            split,
            requests: case.requests.len(),
            num_gpu_blocks: case.engine.num_gpu_blocks,
            dolphin_sim: ours,
            dolphin_sim_own_engine: own,
            mocker: mocker_side,
            by_design: match case.name.as_str() {
                "remote_2011" => Some(FIRST_TOKEN_ON_PREFILL),
                n if n.starts_with("mooncake_1p1d") => Some(RESERVE_BEFORE_PREFILL),
                _ => None,
            },
            within_target: diff.map(|d| d.worst() <= TARGET_PCT),
            diff_pct: diff,
        });
    }
    let report = Report {
        bench: "mocker_crosscheck",
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        profile: args.profile.clone(),
        mocker,
        target_pct: TARGET_PCT,
        cases: results,
    };
    let path =
        dolphin_bench::results::write_json("mocker_crosscheck", args.out.as_deref(), &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_expand_into_the_blocks_they_stand_for() {
        let dir = std::env::temp_dir().join(format!("mocker-crosscheck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("trace.jsonl");
        // Two prompts sharing their first 512-token id; the second's ids cover less than it.
        std::fs::write(
            &path,
            "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [7, 8]}\n\
             {\"timestamp\": 10, \"input_length\": 1030, \"output_length\": 4, \"hash_ids\": [7]}\n",
        )
        .expect("write");
        let reqs = mooncake(&path, 10, 2.0).expect("read");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[1].arrival_ms, 20.0, "intervals stretched");
        for r in &reqs {
            assert_eq!(r.hash_ids.len(), r.input_length.div_ceil(BLOCK) as usize);
        }
        // The shared id is the same 32 blocks in both; what follows differs.
        assert_eq!(reqs[0].hash_ids[..32], reqs[1].hash_ids[..32]);
        assert_eq!(reqs[0].hash_ids[..2], [7 * 32, 7 * 32 + 1]);
        assert_ne!(reqs[0].hash_ids[32], reqs[1].hash_ids[32]);
        let all: std::collections::HashSet<u64> = reqs
            .iter()
            .flat_map(|r| r.hash_ids.iter().copied())
            .collect();
        assert_eq!(
            all.len(),
            38 + 65 - 32,
            "no id repeats except the shared prefix"
        );
    }
}

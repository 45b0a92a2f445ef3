//! The candle engine alone on SmolLM2-135M (or any llama GGUF): prefill tokens/s for a
//! 512-token prompt, decode tokens/s at batch 1 and batch 8, KV bytes per token.
//!
//! Each number is the median of `--reps` runs; prompts differ between runs (no prefix-cache
//! hits). The machine's load average is recorded before and after: on a shared 2-core machine
//! other work skews everything.
//!
//! `cargo run --release -p dolphin-bench --bin engine_candle [-- --threads 2 --weights q8_0]`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use dolphin_bench::candle_measure::CandleMeasure;
use dolphin_bench::proc_stat::CpuClock;
use dolphin_bench::stats::median;
use dolphin_bench::timed_generate::synthetic_prompt;
use dolphin_engine::candle::{CandleConfig, MatmulKernel, Padding, WeightFormat, candle_engine};
use dolphin_engine::{Engine, Sampling, SeqOutput, SeqRequest};
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(about = "candle engine throughput: prefill, decode at batch 1 and 8")]
struct Args {
    /// GGUF model (default: SmolLM2-135M-Instruct from scripts/fetch-model.sh).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Compute threads (default: DOLPHIN_THREADS, else 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Weight format: auto (the workers' default), keep, q8_0, q4k, f32.
    #[arg(long, default_value = "auto")]
    weights: WeightFormat,
    /// Inner-dimension padding to multiples of 256: auto, on, off.
    #[arg(long, default_value = "auto")]
    padding: Padding,
    /// Quantized matmul kernels: auto (the tiled kernels for Q4_1, and for Q8_0 on x86 without
    /// VNNI), candle, tiled, tiled-avx2 (the tiled kernels on AVX2 instructions only).
    #[arg(long, default_value = "auto")]
    matmul: MatmulKernel,
    /// What is measured: prompt and output sizes, batch, runs.
    #[command(flatten)]
    m: CandleMeasure,
    /// Where to write the JSON result (default: bench/results/engine_candle.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Report {
    model: String,
    weights: String,
    padded: bool,
    /// Whether the Q8_0 matmuls ran on the tiled AVX2 kernel (else candle's).
    tiled_q8: bool,
    /// Whether Q4_1 matmuls (`--weights keep`) ran on the tiled kernel.
    tiled_q4: bool,
    /// Its instructions: "avx512vnni" or "avx2" (absent where Q4_1 ran on candle's).
    tiled_q4_isa: Option<&'static str>,
    threads: usize,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    load_avg_before: String,
    load_avg_after: String,
    prefill_tokens: usize,
    /// Medians by the wall clock.
    prefill_tok_s: f64,
    decode_b1_tok_s: f64,
    decode_batch_tok_s: f64,
    batch_gain: f64,
    /// Medians per second of process CPU time (one compute thread: an idle core's rate).
    cpu_prefill_tok_s: f64,
    cpu_decode_b1_tok_s: f64,
    cpu_decode_batch_tok_s: f64,
    cpu_batch_gain: f64,
    prefill_runs: Vec<Rate>,
    decode_tokens: u32,
    decode_b1_runs: Vec<Rate>,
    batch: usize,
    decode_batch_runs: Vec<Rate>,
    kv_bytes_per_token: u64,
    kv_bytes_exported_per_token: f64,
    targets: Targets,
    command: String,
}

#[derive(Debug, Serialize)]
struct Targets {
    source: &'static str,
    prefill_tok_s: f64,
    decode_b1_tok_s: f64,
    batch_gain: f64,
}

fn request(id: String, prompt: Vec<u32>, max_tokens: u32) -> SeqRequest {
    SeqRequest {
        request_id: id,
        prompt,
        sampling: Sampling {
            max_tokens,
            ignore_eos: true,
            ..Sampling::default()
        },
    }
}

/// Throughput of one measurement: by the wall clock, and per second of this process's CPU
/// time (with one compute thread, what the engine would do on an idle core: robust to other
/// work on a shared machine).
#[derive(Clone, Copy, Debug, Serialize)]
struct Rate {
    wall: f64,
    cpu: f64,
}

/// A point in time by both clocks.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    at: Instant,
    cpu: Duration,
}

impl Stamp {
    fn now(clock: &CpuClock) -> anyhow::Result<Stamp> {
        Ok(Stamp {
            at: Instant::now(),
            cpu: clock.cpu_time()?,
        })
    }

    fn rate(self, end: Stamp, tokens: f64) -> anyhow::Result<Rate> {
        let wall = end.at.saturating_duration_since(self.at).as_secs_f64();
        let cpu = end.cpu.saturating_sub(self.cpu).as_secs_f64();
        ensure!(wall > 0.0 && cpu > 0.0, "nothing measured");
        Ok(Rate {
            wall: tokens / wall,
            cpu: tokens / cpu,
        })
    }
}

/// Runs `n` sequences together; decode tokens/s from the moment every sequence has its first
/// token until the last one finishes.
async fn decode(
    engine: &Arc<dyn Engine>,
    n: usize,
    prompt_len: usize,
    max_tokens: u32,
    salt: u64,
) -> anyhow::Result<Rate> {
    let clock = Arc::new(CpuClock::new(std::process::id()));
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let req = request(
            format!("d{salt}-{i}"),
            synthetic_prompt(prompt_len, salt * 100 + i as u64),
            max_tokens,
        );
        streams.push(engine.generate(req).await?);
    }
    let mut handles = Vec::with_capacity(n);
    for mut s in streams {
        let clock = clock.clone();
        handles.push(tokio::spawn(async move {
            let mut first = None;
            let mut count = 0u32;
            while let Some(ev) = s.recv().await {
                match ev {
                    SeqOutput::Token(_) => {
                        count += 1;
                        if first.is_none() {
                            first = Some(Stamp::now(&clock)?);
                        }
                    }
                    SeqOutput::Finished { .. } => break,
                    SeqOutput::Error(e) => return Err(anyhow::anyhow!(e)),
                }
            }
            Ok((first.context("no token")?, count, Stamp::now(&clock)?))
        }));
    }
    let mut start: Option<Stamp> = None;
    let mut end: Option<Stamp> = None;
    let mut tokens = 0u32;
    for h in handles {
        let (first, count, last) = h.await??;
        tokens += count - 1;
        start = Some(start.map_or(first, |s| if first.at > s.at { first } else { s }));
        end = Some(end.map_or(last, |e| if last.at > e.at { last } else { e }));
    }
    start
        .context("no sequence")?
        .rate(end.context("no sequence")?, f64::from(tokens))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = match &args.model {
        Some(p) => p.clone(),
        None => dolphin_tokenizer::find_model(dolphin_tokenizer::SMOLLM2_FILE)
            .context("SmolLM2 not found: run scripts/fetch-model.sh or pass --model")?,
    };
    let threads = dolphin_engine::candle::configure_threads(args.threads)?;
    let mut cfg = CandleConfig::new(&model);
    cfg.weights = args.weights;
    cfg.padding = args.padding;
    cfg.matmul = args.matmul;
    let mut cfg = cfg.resolved()?;
    let (tiled_q8, tiled_q4, tiled_q4_isa) = (cfg.tiled_q8(), cfg.tiled_q4(), cfg.tiled_q4_isa());
    cfg.max_batched_tokens = args.m.prefill_tokens.max(512) as u32;
    let padded = cfg.pads();
    let cfg_weights = cfg.weights;
    let load_avg_before = dolphin_bench::machine::load_average();
    let t = Instant::now();
    let engine = tokio::task::spawn_blocking(move || candle_engine(cfg)).await??;
    eprintln!(
        "loaded {} in {:.1} s ({threads} threads)",
        model.display(),
        t.elapsed().as_secs_f64()
    );
    let info = engine.info().clone();

    // Warm-up: first-use costs (weight repacking, allocations) stay out of the numbers.
    engine
        .prefill(request("warm".into(), synthetic_prompt(64, 999), 1), 0)
        .await?;
    decode(&engine, 1, args.m.decode_prompt, 4, 998).await?;

    let clock = CpuClock::new(std::process::id());
    let mut prefill_runs = Vec::new();
    let mut exported = 0f64;
    for rep in 0..args.m.reps {
        let req = request(
            format!("p{rep}"),
            synthetic_prompt(args.m.prefill_tokens, rep as u64 + 1),
            1,
        );
        let start = Stamp::now(&clock)?;
        let out = engine.prefill(req, 0).await?;
        let end = Stamp::now(&clock)?;
        let bytes: usize = out.blocks.iter().map(|b| b.len()).sum();
        exported = bytes as f64 / args.m.prefill_tokens as f64;
        // The engine's own prefill time (admission to first token) is the wall figure.
        let mut rate = start.rate(end, args.m.prefill_tokens as f64)?;
        rate.wall = args.m.prefill_tokens as f64 / out.prefill.as_secs_f64();
        eprintln!("prefill {rep}: {rate:?} tok/s");
        prefill_runs.push(rate);
    }
    let mut b1 = Vec::new();
    let mut bn = Vec::new();
    for rep in 0..args.m.reps {
        b1.push(
            decode(
                &engine,
                1,
                args.m.decode_prompt,
                args.m.decode_tokens,
                10 + rep as u64,
            )
            .await?,
        );
        bn.push(
            decode(
                &engine,
                args.m.batch,
                args.m.decode_prompt,
                args.m.decode_tokens,
                20 + rep as u64,
            )
            .await?,
        );
        eprintln!(
            "decode {rep}: batch 1 {:?}, batch {} {:?} tok/s",
            b1[rep], args.m.batch, bn[rep]
        );
    }
    let wall = |rs: &[Rate]| median(rs.iter().map(|r| r.wall));
    let cpu = |rs: &[Rate]| median(rs.iter().map(|r| r.cpu));
    let report = Report {
        model: info.model,
        weights: cfg_weights.to_string(),
        padded,
        tiled_q8,
        tiled_q4,
        tiled_q4_isa,
        threads,
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        load_avg_before,
        load_avg_after: dolphin_bench::machine::load_average(),
        prefill_tokens: args.m.prefill_tokens,
        prefill_tok_s: wall(&prefill_runs),
        decode_b1_tok_s: wall(&b1),
        decode_batch_tok_s: wall(&bn),
        batch_gain: wall(&bn) / wall(&b1),
        cpu_prefill_tok_s: cpu(&prefill_runs),
        cpu_decode_b1_tok_s: cpu(&b1),
        cpu_decode_batch_tok_s: cpu(&bn),
        cpu_batch_gain: cpu(&bn) / cpu(&b1),
        prefill_runs,
        decode_tokens: args.m.decode_tokens,
        decode_b1_runs: b1,
        batch: args.m.batch,
        decode_batch_runs: bn,
        kv_bytes_per_token: info.kv_bytes_per_token,
        kv_bytes_exported_per_token: exported,
        targets: Targets {
            source: "llama.cpp on this machine, same model file (shared/NOTES.md)",
            prefill_tok_s: 265.0,
            decode_b1_tok_s: 64.0,
            batch_gain: 2.0,
        },
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let path = dolphin_bench::results::write_json("engine_candle", args.out.as_deref(), &report)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    eprintln!("wrote {}", path.display());
    Ok(())
}

//! llama.cpp against Dolphin's candle engine, in one run, on the same model file and thread
//! count: prefill tokens/s of a 512-token prompt, decode tokens/s at batch 1, and the batch-8
//! gain (batch-8 decode tokens/s over batch-1). It runs Dolphin's `engine_candle` (built beside
//! the workspace, `target/release/engine_candle`) first, then llama.cpp through the
//! `llama-cpp-2` crate with the same workload, and writes both and their ratios, with the CPU
//! model and flags, to `bench/results/engine_vs_llamacpp_avx512.json` on CPUs with AVX-512 VNNI
//! and `engine_vs_llamacpp_avx2.json` elsewhere.
//!
//! ```text
//! cargo build --release -p dolphin-bench --bin engine_candle
//! RUSTFLAGS="-C target-cpu=native" cargo run --release --manifest-path bench/llama-peer/Cargo.toml -- --threads 1
//! ```
//!
//! Prompts are synthetic token ids (the same recipe for both engines, differing per repetition
//! so nothing is cached); decoding is greedy; each number is the median of `--reps` runs, and the
//! engines take turns repetition by repetition.
//!
//! Build llama.cpp for the CPU it runs on (`target-cpu=native`, so ggml compiles its AVX-512
//! and VNNI paths where the CPU has them): the workspace's `.cargo/config.toml` would otherwise
//! give it x86-64-v3, AVX2 only. The JSON records what it was built for.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use clap::Parser;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(about = "llama.cpp vs Dolphin's candle engine, same model file and threads, one run")]
struct Args {
    /// GGUF model (default: SmolLM2-135M-Instruct from scripts/fetch-model.sh).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Compute threads for both engines.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Prompt tokens of the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prefill_tokens: usize,
    /// Prompt tokens of each decoding sequence.
    #[arg(long, default_value_t = 32)]
    decode_prompt: usize,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Sequences decoded together for the batch gain.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Repetitions (median reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Extra arguments for Dolphin's `engine_candle` (e.g. `--dolphin-arg=--weights=keep`).
    #[arg(long = "dolphin-arg", allow_hyphen_values = true)]
    dolphin_args: Vec<String>,
    /// Dolphin's `engine_candle` binary (default: `$CARGO_TARGET_DIR/release/engine_candle`, else
    /// the workspace's `target/release/engine_candle`).
    #[arg(long)]
    dolphin_bin: Option<PathBuf>,
    /// Skip Dolphin's engine (llama.cpp only).
    #[arg(long)]
    no_dolphin: bool,
    /// Where to write the JSON (default: bench/results/engine_vs_llamacpp_{avx512,avx2}.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Serialize, Clone, Copy)]
struct Numbers {
    prefill_tok_s: f64,
    decode_b1_tok_s: f64,
    decode_batch_tok_s: f64,
    batch_gain: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    model: String,
    threads: usize,
    /// Extra `engine_candle` arguments.
    dolphin_args: Vec<String>,
    prefill_tokens: usize,
    decode_prompt: usize,
    decode_tokens: usize,
    batch: usize,
    reps: usize,
    /// Medians over the repetitions.
    llamacpp: Numbers,
    llamacpp_reps: Vec<Numbers>,
    llamacpp_crate: &'static str,
    /// The x86 features llama.cpp was compiled for: this crate's target features, which
    /// `llama-cpp-sys-2` hands to ggml's build (`RUSTFLAGS="-C target-cpu=native"` gives
    /// GGML_NATIVE, the CPU's own).
    llamacpp_built_for: Vec<&'static str>,
    /// Medians over the repetitions (each a fresh `engine_candle` process, run in turn with
    /// llama.cpp's repetition of the same index).
    dolphin_median: Option<Numbers>,
    dolphin_reps: Vec<Numbers>,
    /// The last `engine_candle` result in full (its configuration and CPU time).
    dolphin: Option<serde_json::Value>,
    /// Dolphin over llama.cpp (above 1: Dolphin ahead).
    ratio_prefill: Option<f64>,
    ratio_decode_b1: Option<f64>,
    ratio_batch_gain: Option<f64>,
    ahead_on_all: Option<bool>,
}

/// The SIMD features this crate (and so llama.cpp) was compiled with.
fn built_for() -> Vec<&'static str> {
    [
        ("avx2", cfg!(target_feature = "avx2")),
        ("fma", cfg!(target_feature = "fma")),
        ("f16c", cfg!(target_feature = "f16c")),
        ("avx512f", cfg!(target_feature = "avx512f")),
        ("avx512bw", cfg!(target_feature = "avx512bw")),
        ("avx512vnni", cfg!(target_feature = "avx512vnni")),
        ("avxvnni", cfg!(target_feature = "avxvnni")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

// As dolphin-bench's `machine` module: this crate stays outside the workspace so it does not
// build Dolphin, so it cannot use it.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

fn cpu_flags() -> Vec<&'static str> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    ["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni"]
        .into_iter()
        .filter(|f| flags.contains(f))
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Synthetic prompt `seed` of `n` token ids below `vocab` (ids past the first 1000 specials).
fn prompt(seed: usize, n: usize, vocab: usize) -> Vec<LlamaToken> {
    (0..n)
        .map(|i| {
            let x = (seed * 7919 + i * 104_729 + 17) % (vocab - 1000);
            LlamaToken((1000 + x) as i32)
        })
        .collect()
}

fn argmax(logits: &[f32]) -> LlamaToken {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    LlamaToken(best as i32)
}

struct Llama<'m> {
    ctx: LlamaContext<'m>,
    vocab: usize,
}

impl Llama<'_> {
    /// Prefills `tokens` as sequence `seq` from position 0 in chunks of the context's batch.
    fn prefill(&mut self, seq: i32, tokens: &[LlamaToken]) -> anyhow::Result<LlamaToken> {
        let n_batch = self.ctx.n_batch() as usize;
        let mut batch = LlamaBatch::new(n_batch, 1);
        let mut last = LlamaToken(0);
        for (c, chunk) in tokens.chunks(n_batch).enumerate() {
            batch.clear();
            for (j, t) in chunk.iter().enumerate() {
                let pos = c * n_batch + j;
                batch.add(*t, pos as i32, &[seq], pos + 1 == tokens.len())?;
            }
            self.ctx.decode(&mut batch)?;
            if (c + 1) * n_batch >= tokens.len() {
                last = argmax(self.ctx.get_logits_ith(batch.n_tokens() - 1));
            }
        }
        Ok(last)
    }

    /// Decodes `steps` tokens for each of `seqs` sequences together (one batch of one token per
    /// sequence per step), after a prompt each; returns decode tokens/s.
    fn decode(
        &mut self,
        seqs: usize,
        prompt_len: usize,
        steps: usize,
        seed: usize,
    ) -> anyhow::Result<f64> {
        self.ctx.clear_kv_cache();
        let mut next = Vec::with_capacity(seqs);
        for s in 0..seqs {
            let p = prompt(seed * 100 + s, prompt_len, self.vocab);
            next.push(self.prefill(s as i32, &p)?);
        }
        let mut batch = LlamaBatch::new(seqs, seqs as i32);
        let started = Instant::now();
        for step in 0..steps {
            batch.clear();
            for (s, t) in next.iter().enumerate() {
                batch.add(*t, (prompt_len + step) as i32, &[s as i32], true)?;
            }
            self.ctx.decode(&mut batch)?;
            for (s, t) in next.iter_mut().enumerate() {
                *t = argmax(self.ctx.get_logits_ith(s as i32));
            }
        }
        Ok((seqs * steps) as f64 / started.elapsed().as_secs_f64())
    }
}

/// Loads llama.cpp's context for `args`; `one_rep` then measures one repetition.
fn load_llamacpp<'m>(
    args: &Args,
    backend: &LlamaBackend,
    model: &'m LlamaModel,
) -> anyhow::Result<Llama<'m>> {
    let n_ctx = (args
        .prefill_tokens
        .max(args.decode_prompt + args.decode_tokens)
        * args.batch.max(1))
    .max(1024) as u32;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(512)
        .with_n_ubatch(512)
        .with_n_seq_max(args.batch.max(1) as u32)
        .with_n_threads(args.threads as i32)
        .with_n_threads_batch(args.threads as i32);
    let ctx = model.new_context(backend, params)?;
    let mut l = Llama {
        ctx,
        vocab: model.n_vocab() as usize,
    };
    // Warm-up: one short prefill and decode.
    l.ctx.clear_kv_cache();
    l.prefill(0, &prompt(999, 64, l.vocab))?;
    Ok(l)
}

impl Llama<'_> {
    /// One repetition: prefill, decode at batch 1, decode at the batch.
    fn one_rep(&mut self, args: &Args, rep: usize) -> anyhow::Result<Numbers> {
        self.ctx.clear_kv_cache();
        let p = prompt(rep, args.prefill_tokens, self.vocab);
        let started = Instant::now();
        self.prefill(0, &p)?;
        let prefill = args.prefill_tokens as f64 / started.elapsed().as_secs_f64();
        let b1 = self.decode(1, args.decode_prompt, args.decode_tokens, rep + 10)?;
        let bn = self.decode(args.batch, args.decode_prompt, args.decode_tokens, rep + 20)?;
        Ok(Numbers {
            prefill_tok_s: prefill,
            decode_b1_tok_s: b1,
            decode_batch_tok_s: bn,
            batch_gain: bn / b1,
        })
    }
}

/// Medians of each field over `reps`.
fn medians(reps: &[Numbers]) -> Numbers {
    let m = |f: fn(&Numbers) -> f64| median(reps.iter().map(f).collect());
    Numbers {
        prefill_tok_s: m(|n| n.prefill_tok_s),
        decode_b1_tok_s: m(|n| n.decode_b1_tok_s),
        decode_batch_tok_s: m(|n| n.decode_batch_tok_s),
        batch_gain: m(|n| n.batch_gain),
    }
}

/// The numbers of one `engine_candle` result.
fn dolphin_numbers(v: &serde_json::Value) -> anyhow::Result<Numbers> {
    let get = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("engine_candle's result has no {k}"))
    };
    Ok(Numbers {
        prefill_tok_s: get("prefill_tok_s")?,
        decode_b1_tok_s: get("decode_b1_tok_s")?,
        decode_batch_tok_s: get("decode_batch_tok_s")?,
        batch_gain: get("batch_gain")?,
    })
}

/// One `engine_candle` run of one repetition (a fresh process, as a deployment would load it).
fn run_dolphin(args: &Args, model_path: &Path) -> anyhow::Result<serde_json::Value> {
    let bin = match (&args.dolphin_bin, std::env::var_os("CARGO_TARGET_DIR")) {
        (Some(bin), _) => bin.clone(),
        (None, Some(dir)) => PathBuf::from(dir).join("release/engine_candle"),
        (None, None) => repo_root().join("target/release/engine_candle"),
    };
    if !bin.is_file() {
        bail!(
            "{} not found: cargo build --release -p dolphin-bench --bin engine_candle",
            bin.display()
        );
    }
    let out = std::env::temp_dir().join(format!("engine-candle-{}.json", std::process::id()));
    let status = Command::new(&bin)
        .arg("--model")
        .arg(model_path)
        .args(["--threads", &args.threads.to_string()])
        .args(["--prefill-tokens", &args.prefill_tokens.to_string()])
        .args(["--decode-prompt", &args.decode_prompt.to_string()])
        .args(["--decode-tokens", &args.decode_tokens.to_string()])
        .args(["--batch", &args.batch.to_string()])
        .args(["--reps", "1"])
        .args(&args.dolphin_args)
        .arg("--out")
        .arg(&out)
        .status()
        .with_context(|| format!("run {}", bin.display()))?;
    ensure!(status.success(), "engine_candle failed: {status}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let _ = std::fs::remove_file(&out);
    Ok(v)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/dolphin/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    ensure!(
        model_path.is_file(),
        "{} not found (scripts/fetch-model.sh)",
        model_path.display()
    );
    let mut backend = LlamaBackend::init()?;
    backend.void_logs();
    let model =
        LlamaModel::load_from_file(&backend, model_path.as_path(), &LlamaModelParams::default())
            .with_context(|| format!("load {}", model_path.display()))?;
    let mut llama_engine = load_llamacpp(&args, &backend, &model)?;
    // The two engines take turns, repetition by repetition, so both see the same share of
    // whatever else runs on a shared machine (it moved single runs by 40% in a session).
    let (mut dolphin_reps, mut llama_reps, mut dolphin) = (Vec::new(), Vec::new(), None);
    for rep in 0..args.reps.max(1) {
        if !args.no_dolphin {
            let v = run_dolphin(&args, &model_path)?;
            let n = dolphin_numbers(&v)?;
            eprintln!(
                "dolphin rep {rep}: prefill {:.1} tok/s, decode b1 {:.1}, b{} {:.1}",
                n.prefill_tok_s, n.decode_b1_tok_s, args.batch, n.decode_batch_tok_s
            );
            dolphin_reps.push(n);
            dolphin = Some(v);
        }
        let n = llama_engine.one_rep(&args, rep)?;
        eprintln!(
            "llama.cpp rep {rep}: prefill {:.1} tok/s, decode b1 {:.1}, b{} {:.1}",
            n.prefill_tok_s, n.decode_b1_tok_s, args.batch, n.decode_batch_tok_s
        );
        llama_reps.push(n);
    }
    let llama = medians(&llama_reps);
    let dolphin_median = (!dolphin_reps.is_empty()).then(|| medians(&dolphin_reps));
    let ratio = |f: fn(&Numbers) -> f64| dolphin_median.as_ref().map(|d| f(d) / f(&llama));
    let ratio_prefill = ratio(|n| n.prefill_tok_s);
    let ratio_decode_b1 = ratio(|n| n.decode_b1_tok_s);
    let ratio_batch_gain = ratio(|n| n.batch_gain);
    let ahead = match (ratio_prefill, ratio_decode_b1, ratio_batch_gain) {
        (Some(a), Some(b), Some(c)) => Some(a > 1.0 && b > 1.0 && c > 1.0),
        _ => None,
    };
    let report = Report {
        bench: "engine_vs_llamacpp",
        cpu: cpu_name(),
        cpu_flags: cpu_flags(),
        model: model_path.display().to_string(),
        threads: args.threads,
        dolphin_args: args.dolphin_args.clone(),
        prefill_tokens: args.prefill_tokens,
        decode_prompt: args.decode_prompt,
        decode_tokens: args.decode_tokens,
        batch: args.batch,
        reps: args.reps,
        llamacpp: llama,
        llamacpp_reps: llama_reps,
        llamacpp_crate: "llama-cpp-2 0.1.160",
        llamacpp_built_for: built_for(),
        dolphin_median,
        dolphin_reps,
        dolphin,
        ratio_prefill,
        ratio_decode_b1,
        ratio_batch_gain,
        ahead_on_all: ahead,
    };
    println!(
        "llama.cpp: prefill {:.1} tok/s, decode b1 {:.1} tok/s, batch-{} gain {:.2}x",
        llama.prefill_tok_s, llama.decode_b1_tok_s, args.batch, llama.batch_gain
    );
    if let (Some(p), Some(d), Some(g)) = (ratio_prefill, ratio_decode_b1, ratio_batch_gain) {
        println!("Dolphin / llama.cpp: prefill {p:.2}x, decode b1 {d:.2}x, batch gain {g:.2}x");
    }
    // One result per kind of CPU: candle's kernels, ours and llama.cpp's all switch on VNNI.
    let isa = if report.cpu_flags.contains(&"avx512_vnni") {
        "avx512"
    } else {
        "avx2"
    };
    let path = args.out.clone().unwrap_or_else(|| {
        repo_root().join(format!("bench/results/engine_vs_llamacpp_{isa}.json"))
    });
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("wrote {}", path.display());
    Ok(())
}

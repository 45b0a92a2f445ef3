//! Token-level handoffs on a real small/large pair: SmolLM2-135M (30 layers) and an early-exit
//! copy of it (its first `--layers` layers, then the final norm and head), on candle, in one
//! process as a decode worker's model group would run them.
//!
//! For every algorithm at three thresholds, over 32 of the sample prompts (greedy, `--tokens`
//! each, concurrency 8): the share of tokens the large model wrote, and agreement with the large
//! model (the share of generated positions whose token equals the large model's greedy choice
//! given the same prefix, teacher-forced on the large model). A random handoff at the same
//! large-token share and span is the control. Also: the quiz (questions with one right answer)
//! for each algorithm's middle threshold and both models alone; throughput of the entropy gate,
//! always-large and always-small at concurrency 1 and 8; the external dispatcher's throughput;
//! the cost of a handoff against a small-model step; the early-exit depth sweep (agreement of
//! the small model alone at several depths).
//!
//! `cargo run --release -p dolphin-bench --bin handoff_real`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use dolphin_bench::machine;
use dolphin_engine::candle::{CandleConfig, candle_engine};
use dolphin_engine::{Engine, OutputStream, SeqOutput, SeqRequest, SeqUsage};
use dolphin_handoff::dispatcher::Dispatcher;
use dolphin_handoff::probe::agreement;
use dolphin_handoff::samples::{PROMPTS, QUIZ};
use dolphin_handoff::{AlgorithmSpec, GroupOptions, ModelGroup, Subserver};
use dolphin_tokenizer::{ModelTokenizer, SMOLLM2_FILE, find_model};
use serde::Serialize;
use tokio::sync::Semaphore;

#[derive(Debug, Parser)]
#[command(about = "Handoff algorithms on the SmolLM2 pair")]
struct Args {
    /// The GGUF model (default: SmolLM2 where scripts/fetch-model.sh puts it).
    #[arg(long)]
    model_path: Option<PathBuf>,
    /// Early-exit depth of the small model.
    #[arg(long, default_value_t = 20)]
    layers: u32,
    /// Depths for the early-exit sweep.
    #[arg(long, value_delimiter = ',', default_value = "10,15,20,25")]
    depths: Vec<u32>,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 16)]
    tokens: u32,
    /// Sample prompts used (of the 36 shipped; at least 32 for the curve).
    #[arg(long, default_value_t = 32)]
    prompts: usize,
    /// Tokens per quiz answer.
    #[arg(long, default_value_t = 12)]
    quiz_tokens: u32,
    /// Requests per throughput run.
    #[arg(long, default_value_t = 16)]
    throughput_requests: usize,
    /// Only the agreement curve (no quiz, throughput, handoff cost or depth sweep).
    #[arg(long)]
    curve_only: bool,
    /// Only the cost of a handoff, at concurrency 1 on a fresh pair.
    #[arg(long)]
    cost_only: bool,
    /// Write the JSON here instead of `bench/results/handoff_real.json`.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn engine(path: &PathBuf, layers: Option<u32>) -> anyhow::Result<Arc<dyn Engine>> {
    let mut cfg = CandleConfig::new(path);
    cfg.layers = layers;
    cfg.kv_bytes = 256 << 20;
    cfg.threads = Some(1);
    Ok(candle_engine(cfg)?)
}

/// A greedy request; `seed` seeds the request's handoff algorithm (the random control draws a
/// different stream per prompt).
fn request(
    id: String,
    seed: u64,
    prompt: Vec<u32>,
    max_tokens: u32,
    spec: Option<&str>,
) -> SeqRequest {
    let mut req = SeqRequest {
        request_id: id,
        prompt,
        sampling: Default::default(),
    };
    req.sampling.max_tokens = max_tokens;
    req.sampling.ignore_eos = true;
    req.sampling.seed = Some(seed);
    req.sampling.handoff = spec.map(|s| dolphin_engine::HandoffChoice {
        algorithm: s.into(),
        threshold: None,
    });
    req
}

async fn collect(mut rx: OutputStream) -> anyhow::Result<(Vec<u32>, SeqUsage)> {
    let mut tokens = Vec::new();
    while let Some(item) = rx.recv().await {
        match item {
            SeqOutput::Token(t) => tokens.push(t.id),
            SeqOutput::Finished { usage, .. } => return Ok((tokens, usage)),
            SeqOutput::Error(e) => anyhow::bail!(e),
        }
    }
    anyhow::bail!("stream ended early")
}

/// Runs every prompt through `serve` at `concurrency`; returns outputs in prompt order and the
/// wall time.
async fn run_all<F, Fut>(
    prompts: &[Vec<u32>],
    concurrency: usize,
    serve: F,
) -> anyhow::Result<(Vec<(Vec<u32>, SeqUsage)>, f64)>
where
    F: Fn(usize, Vec<u32>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<(Vec<u32>, SeqUsage)>> + Send,
{
    let gate = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let (gate, serve, p) = (gate.clone(), serve.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await;
            serve(i, p).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok((out, started.elapsed().as_secs_f64()))
}

/// Generates every prompt on `group` with handoff algorithm `spec` at `concurrency` (request ids
/// `{tag}-{i}`, seed `i`, `tokens` each); outputs in prompt order and the wall time.
async fn generate_all(
    group: &Arc<ModelGroup>,
    prompts: &[Vec<u32>],
    concurrency: usize,
    tag: String,
    tokens: u32,
    spec: &str,
) -> anyhow::Result<(Vec<(Vec<u32>, SeqUsage)>, f64)> {
    let (group, spec) = (group.clone(), spec.to_owned());
    run_all(prompts, concurrency, move |i, p| {
        let (g, s, tag) = (group.clone(), spec.clone(), tag.clone());
        async move {
            let req = request(format!("{tag}-{i}"), i as u64, p, tokens, Some(&s));
            collect(g.generate(req).await?).await
        }
    })
    .await
}

#[derive(Debug, Serialize)]
struct Point {
    algorithm: String,
    large_share: f64,
    agreement: f64,
    handoffs_per_request: f64,
    /// The random control at this point's large-token share and mean large span.
    random_spec: Option<String>,
    random_large_share: Option<f64>,
    random_agreement: Option<f64>,
}

struct Bench {
    group: Arc<ModelGroup>,
    large: Arc<dyn Engine>,
    prompts: Vec<Vec<u32>>,
    tokens: u32,
    runs: std::sync::atomic::AtomicU64,
}

impl Bench {
    /// Generates every prompt with `spec`; returns (large share, agreement, handoffs/request,
    /// mean large span).
    async fn evaluate(&self, spec: &str) -> anyhow::Result<(f64, f64, f64, f64)> {
        let run = self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (outs, _) = generate_all(
            &self.group,
            &self.prompts,
            8,
            format!("e{run}"),
            self.tokens,
            spec,
        )
        .await?;
        let (mut large, mut total, mut handoffs) = (0u64, 0u64, 0u64);
        for (_, u) in &outs {
            large += u64::from(u.by_model[1].tokens);
            total += u64::from(u.completion_tokens);
            handoffs += u64::from(u.handoffs);
        }
        let large_engine = self.large.clone();
        let conts: Vec<Vec<u32>> = outs.iter().map(|(t, _)| t.clone()).collect();
        let prompts = self.prompts.clone();
        let mut agree = 0usize;
        let mut positions = 0usize;
        let gate = Arc::new(Semaphore::new(8));
        let mut tasks = Vec::new();
        for (i, (p, c)) in prompts.into_iter().zip(conts).enumerate() {
            let (e, gate) = (large_engine.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire().await;
                agreement(&e, &format!("a{run}-{i}"), &p, &c).await
            }));
        }
        for t in tasks {
            let a = t.await??;
            positions += a.len();
            agree += a.iter().filter(|&&x| x).count();
        }
        let share = large as f64 / total.max(1) as f64;
        // Each handoff to the large model and back is one span; spans = handoffs / 2.
        let spans = (handoffs as f64 / 2.0).max(1.0);
        Ok((
            share,
            agree as f64 / positions.max(1) as f64,
            handoffs as f64 / outs.len() as f64,
            large as f64 / spans,
        ))
    }
}

/// The cost of a handoff at concurrency 1 on a fresh pair (nothing else in flight, so no wait
/// for a peer's running step): the time from a handoff to the peer's first token, minus the
/// peer's plain decode step at batch 1, against the small model's batch-1 decode step.
async fn handoff_cost(
    path: &PathBuf,
    args: &Args,
    prompts: &[Vec<u32>],
) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::json!({
        "lazy": handoff_cost_with(path, args, prompts, 0).await?,
        "kv_sync_tokens_1": handoff_cost_with(path, args, prompts, 1).await?,
    }))
}

/// [`handoff_cost`] with paused subservers kept within `sync_tokens` tokens (0: lazy).
async fn handoff_cost_with(
    path: &PathBuf,
    args: &Args,
    prompts: &[Vec<u32>],
    sync_tokens: u32,
) -> anyhow::Result<serde_json::Value> {
    let small = engine(path, Some(args.layers))?;
    let large = engine(path, None)?;
    let group = ModelGroup::with_options(
        "cost",
        Subserver::small_large(small.clone(), large.clone()),
        "random:to_large=0.2,to_small=0.4".parse::<AlgorithmSpec>()?,
        GroupOptions { sync_tokens },
    )?;
    for (i, p) in prompts.iter().take(8).enumerate() {
        collect(
            group
                .generate(request(format!("cost-{i}"), i as u64, p.clone(), 32, None))
                .await?,
        )
        .await?;
    }
    let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    let small_step = ms(small.step_profile().mean(1));
    let large_step = ms(large.step_profile().mean(1));
    let stats = group.stats();
    let to_large = stats.model(1).mean_resume.as_secs_f64() * 1e3;
    let to_small = stats.model(0).mean_resume.as_secs_f64() * 1e3;
    let over_large = large_step.map(|s| to_large - s);
    let over_small = small_step.map(|s| to_small - s);
    Ok(serde_json::json!({
        "handoffs_to_large": stats.model(1).resumes,
        "handoffs_to_small": stats.model(0).resumes,
        "resume_to_large_ms": to_large,
        "resume_to_small_ms": to_small,
        "large_batch1_step_ms": large_step,
        "small_batch1_step_ms": small_step,
        "handoff_overhead_to_large_ms": over_large,
        "handoff_overhead_to_small_ms": over_small,
        "overhead_to_large_in_small_steps": over_large.zip(small_step).map(|(o, s)| o / s),
        "overhead_to_small_in_small_steps": over_small.zip(small_step).map(|(o, s)| o / s),
        "note": "resume = handoff to the peer's first token: the catch-up chunk (the tokens the peer had not seen) plus the inter-model loop and readmission; overhead = resume minus the peer's plain batch-1 decode step",
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let path = args
        .model_path
        .clone()
        .or_else(|| find_model(SMOLLM2_FILE))
        .context("SmolLM2 not found: run scripts/fetch-model.sh or pass --model-path")?;
    let tok = ModelTokenizer::from_file(&path)?;
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .take(args.prompts)
        .map(|p| tok.encode(p))
        .collect::<Result<_, _>>()?;
    let small = engine(&path, Some(args.layers))?;
    let large = engine(&path, None)?;
    let pair = Subserver::small_large(small.clone(), large.clone());
    let group = ModelGroup::new(
        "smollm2-duo",
        pair.clone(),
        "entropy".parse::<AlgorithmSpec>()?,
    )?;
    let bench = Bench {
        group: group.clone(),
        large: large.clone(),
        prompts: prompts.clone(),
        tokens: args.tokens,
        runs: Default::default(),
    };

    if args.cost_only {
        let cost = handoff_cost(&path, &args, &prompts).await?;
        println!("handoff cost at concurrency 1: {cost}");
        let out = serde_json::json!({
            "benchmark": "handoff_real (handoff cost)",
            "command": format!("cargo run --release -p dolphin-bench --bin handoff_real -- --layers {} --cost-only", args.layers),
            "cpu": machine::cpu_name(),
            "cpu_flags": machine::cpu_flags(),
            "small_layers": args.layers,
            "handoff_cost_c1": cost,
        });
        let path = dolphin_bench::results::write_json("handoff_real", args.out.as_deref(), &out)?;
        println!("wrote {}", path.display());
        return Ok(());
    }

    // The curve: every algorithm at three thresholds, each with its random control.
    let grid: Vec<String> = [
        "entropy:threshold=1",
        "entropy:threshold=2",
        "entropy:threshold=3",
        "confidence:threshold=0.7",
        "confidence:threshold=0.5",
        "confidence:threshold=0.3",
        "momentum:level=1,hysteresis=0.3",
        "momentum:level=2,hysteresis=0.3",
        "momentum:level=3,hysteresis=0.3",
        "ensemble:entropy=1,prob=0.6",
        "ensemble:entropy=2,prob=0.6",
        "ensemble:entropy=3,prob=0.6",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut points = Vec::new();
    for spec in ["always-small", "always-large"] {
        let (share, agree, h, _) = bench.evaluate(spec).await?;
        println!("{spec}: large share {share:.3}, agreement {agree:.3}");
        points.push(Point {
            algorithm: spec.into(),
            large_share: share,
            agreement: agree,
            handoffs_per_request: h,
            random_spec: None,
            random_large_share: None,
            random_agreement: None,
        });
    }
    for spec in &grid {
        let (share, agree, h, span) = bench.evaluate(spec).await?;
        let random = format!("random:share={share:.4},span={:.3}", span.max(1.0));
        let (rshare, ragree, _, _) = bench.evaluate(&random).await?;
        println!(
            "{spec}: large share {share:.3}, agreement {agree:.3}; random at {rshare:.3}: {ragree:.3}"
        );
        points.push(Point {
            algorithm: spec.clone(),
            large_share: share,
            agreement: agree,
            handoffs_per_request: h,
            random_spec: Some(random),
            random_large_share: Some(rshare),
            random_agreement: Some(ragree),
        });
    }

    if args.curve_only {
        let out = serde_json::json!({
            "benchmark": "handoff_real",
            "command": format!("cargo run --release -p dolphin-bench --bin handoff_real -- --layers {} --curve-only", args.layers),
            "cpu": machine::cpu_name(),
            "cpu_flags": machine::cpu_flags(),
            "small_layers": args.layers,
            "large_layers": 30,
            "prompts": prompts.len(),
            "tokens_per_prompt": args.tokens,
            "curve": points,
        });
        let path = dolphin_bench::results::write_json("handoff_real", args.out.as_deref(), &out)?;
        println!("wrote {}", path.display());
        return Ok(());
    }

    // The quiz.
    let quiz_prompts: Vec<Vec<u32>> = QUIZ
        .iter()
        .map(|q| tok.encode(q.prompt))
        .collect::<Result<_, _>>()?;
    let mut quiz = Vec::new();
    for spec in [
        "always-small",
        "always-large",
        "entropy:threshold=2",
        "confidence:threshold=0.5",
        "momentum:level=2,hysteresis=0.3",
        "ensemble:entropy=2,prob=0.6",
    ] {
        let (outs, _) = generate_all(
            &group,
            &quiz_prompts,
            8,
            format!("q-{spec}"),
            args.quiz_tokens,
            spec,
        )
        .await?;
        let right = outs
            .iter()
            .zip(QUIZ)
            .filter(|((t, _), q)| tok.decode(t).to_lowercase().contains(q.answer))
            .count();
        println!("quiz {spec}: {right} of {}", QUIZ.len());
        quiz.push(serde_json::json!({"algorithm": spec, "right": right, "of": QUIZ.len()}));
    }

    // Throughput at concurrency 1 and 8.
    let many: Vec<Vec<u32>> = prompts
        .iter()
        .cycle()
        .take(args.throughput_requests)
        .cloned()
        .collect();
    let mut throughput = Vec::new();
    for c in [1usize, 8] {
        for spec in ["always-small", "always-large", "entropy:threshold=2"] {
            let (outs, secs) =
                generate_all(&group, &many, c, format!("t{c}-{spec}"), args.tokens, spec).await?;
            let tokens: u32 = outs.iter().map(|(t, _)| t.len() as u32).sum();
            let tok_s = f64::from(tokens) / secs;
            println!("throughput c={c} {spec}: {tok_s:.1} tok/s");
            throughput
                .push(serde_json::json!({"concurrency": c, "algorithm": spec, "tok_s": tok_s}));
        }
        let dispatcher = Arc::new(Dispatcher::new(
            pair.clone(),
            "entropy:threshold=2".parse()?,
        ));
        let n = args.tokens;
        let (outs, secs) = run_all(&many, c, move |i, p| {
            let d = dispatcher.clone();
            async move {
                collect(
                    d.generate(request(format!("d{c}-{i}"), i as u64, p, n, None))
                        .await?,
                )
                .await
            }
        })
        .await?;
        let tokens: u32 = outs.iter().map(|(t, _)| t.len() as u32).sum();
        let tok_s = f64::from(tokens) / secs;
        println!("throughput c={c} dispatcher entropy:threshold=2: {tok_s:.1} tok/s");
        throughput.push(serde_json::json!({"concurrency": c, "algorithm": "dispatcher entropy:threshold=2", "tok_s": tok_s}));
    }

    // The cost of a handoff: time from a handoff to the peer's first token, against the mean
    // step time of each subserver (all batch sizes) and the small model's batch-1 step.
    let step_ms = |e: &Arc<dyn Engine>| {
        let p = e.step_profile();
        let (n, total) = p
            .by_batch
            .iter()
            .fold((0u64, 0.0), |(n, t), e| (n + e.1, t + e.2));
        (
            1e3 * total / n.max(1) as f64,
            p.mean(1).map(|d| d.as_secs_f64() * 1e3),
        )
    };
    let (small_step, small_step1) = step_ms(&small);
    let (large_step, _) = step_ms(&large);
    let stats = group.stats();
    let to_large = stats.model(1).mean_resume.as_secs_f64() * 1e3;
    let to_small = stats.model(0).mean_resume.as_secs_f64() * 1e3;
    let cost = serde_json::json!({
        "resume_to_large_ms": to_large,
        "resume_to_small_ms": to_small,
        "large_mean_step_ms": large_step,
        "small_mean_step_ms": small_step,
        "small_batch1_step_ms": small_step1,
        "handoff_overhead_to_large_ms": to_large - large_step,
        "handoff_overhead_to_small_ms": to_small - small_step,
        "note": "resume = handoff to the peer's first token (its catch-up step included); overhead = resume minus the peer's mean step",
    });
    println!("handoff cost: {cost}");

    // Early-exit depth sweep: the small model alone against the large one.
    let mut depths = Vec::new();
    for &d in &args.depths {
        let s = engine(&path, Some(d))?;
        let g = ModelGroup::new(
            "sweep",
            Subserver::small_large(s, large.clone()),
            "always-small".parse::<AlgorithmSpec>()?,
        )?;
        let b = Bench {
            group: g,
            large: large.clone(),
            prompts: prompts.clone(),
            tokens: args.tokens,
            runs: std::sync::atomic::AtomicU64::new(1000 * u64::from(d)),
        };
        let (_, agree, _, _) = b.evaluate("always-small").await?;
        println!("depth {d}: always-small agreement {agree:.3}");
        depths.push(serde_json::json!({"layers": d, "always_small_agreement": agree}));
    }

    let out = serde_json::json!({
        "benchmark": "handoff_real",
        "command": "cargo run --release -p dolphin-bench --bin handoff_real",
        "cpu": machine::cpu_name(),
        "cpu_flags": machine::cpu_flags(),
        "model": path.file_name().map(|f| f.to_string_lossy().into_owned()),
        "small_layers": args.layers,
        "large_layers": 30,
        "prompts": prompts.len(),
        "tokens_per_prompt": args.tokens,
        "curve": points,
        "quiz": quiz,
        "throughput": throughput,
        "handoff_cost": cost,
        "depth_sweep": depths,
    });
    let path = dolphin_bench::results::write_json("handoff_real", args.out.as_deref(), &out)?;
    println!("wrote {}", path.display());
    Ok(())
}

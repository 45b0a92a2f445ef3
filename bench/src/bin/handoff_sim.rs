//! Token-level handoff runtimes on the simulated engine, TokenRouter's setup: a small model
//! (profile `qwen3-0.6b-a100`) and a large one (`qwen3-32b-2xa100`), an R2R-like handoff
//! process (geometric gaps: the small model hands off after a token with probability 0.1,
//! discarding it; the large one hands back after a token with probability 0.75: about 12% of
//! tokens by the large model), closed-loop clients at concurrency 1, 4, 8 and 16.
//!
//! Per concurrency, decode throughput (accepted tokens per second, streamed to clients) of:
//! lockstep (both subservers' steps in synchronized rounds, each as slow as the slower model),
//! the external dispatcher (one server per model, every span a fresh request), asynchronous
//! subservers with B = 1, asynchronous with the Markov-chain B (`dolphin_handoff::plan` over the
//! profiles' step times and the handoff rates), and a sweep of the large model's B = 1..8 with
//! its best. All in-process over the real scheduler, in real time.
//!
//! `cargo run --release -p dolphin-bench --bin handoff_sim [-- --seconds 4]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use dolphin_bench::machine;
use dolphin_engine::sim::SimBackend;
use dolphin_engine::{
    BatchWait, Engine, EngineInfo, Lockstep, Scheduler, SchedulerConfig, SeqOutput, SeqRequest,
    SimProfile,
};
use dolphin_handoff::algorithms::RandomHandoff;
use dolphin_handoff::dispatcher::Dispatcher;
use dolphin_handoff::plan::{ChainSpec, StepProfile, plan};
use dolphin_handoff::{AlgorithmSpec, ModelGroup, Subserver};
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(about = "Handoff runtimes on the sim profiles")]
struct Args {
    /// Measured seconds per configuration (after a warm-up of a quarter of it).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Concurrencies.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    concurrency: Vec<u32>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 256)]
    prompt: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 128)]
    output: u32,
    /// Per-token chance that the small model hands off.
    #[arg(long, default_value_t = 0.1)]
    to_large: f64,
    /// Per-token chance that the large model hands back.
    #[arg(long, default_value_t = 0.75)]
    to_small: f64,
    /// Delayed batching's wait bound, ms.
    #[arg(long, default_value_t = 30.0)]
    max_wait_ms: f64,
    /// Only plan B per concurrency (and time the planner); measure nothing.
    #[arg(long)]
    plan_only: bool,
}

const SMALL: &str = "qwen3-0.6b-a100";
const LARGE: &str = "qwen3-32b-2xa100";
const BLOCKS: u32 = 8192;

fn engine(profile: &str, lockstep: Option<Arc<Lockstep>>) -> Arc<dyn Engine> {
    let profile = SimProfile::builtin(profile).expect("shipped profile");
    let info = EngineInfo {
        model: profile.name.clone(),
        engine: "sim",
        block_size: 16,
        total_blocks: BLOCKS,
        kv_bytes_per_token: 1,
        kv_layout: "sim/bytes_per_token=1".into(),
        context_length: 32768,
        vocab_size: 355,
        eos_token_id: None,
        step_limits: None,
    };
    let cfg = SchedulerConfig {
        lockstep,
        ..SchedulerConfig::default()
    };
    Scheduler::spawn(SimBackend::new(info, profile, 1.0), cfg).expect("scheduler")
}

fn pair(lockstep: bool) -> Vec<Subserver> {
    let clock = lockstep.then(|| Arc::new(Lockstep::new()));
    Subserver::small_large(engine(SMALL, clock.clone()), engine(LARGE, clock))
}

/// How a configuration serves a request.
enum Runtime {
    Group(Arc<ModelGroup>),
    Dispatcher(Dispatcher),
}

impl Runtime {
    async fn generate(&self, req: SeqRequest, args: &Args) -> dolphin_engine::OutputStream {
        let seed = req.sampling.seed.unwrap_or(0);
        match self {
            Runtime::Group(g) => {
                let alg = RandomHandoff::new(args.to_large, args.to_small, seed);
                g.generate_with(req, Box::new(alg)).await.expect("generate")
            }
            Runtime::Dispatcher(d) => d.generate(req).await.expect("generate"),
        }
    }
}

/// Closed-loop clients for `seconds`: accepted tokens per second in the measured window.
async fn measure(rt: Arc<Runtime>, args: Arc<Args>, concurrency: u32) -> f64 {
    let tokens = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..concurrency {
        let (rt, args, tokens, counting, stop) = (
            rt.clone(),
            args.clone(),
            tokens.clone(),
            counting.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let id = u64::from(c) << 32 | n;
                let mut req = SeqRequest {
                    request_id: format!("c{c}-{n}"),
                    prompt: (0..args.prompt)
                        .map(|i| 3 + ((id.wrapping_mul(2_654_435_761) >> 7) as u32 + i * 31) % 90)
                        .collect(),
                    sampling: Default::default(),
                };
                req.sampling.max_tokens = args.output;
                req.sampling.ignore_eos = true;
                req.sampling.seed = Some(id);
                let mut rx = rt.generate(req, &args).await;
                while let Some(item) = rx.recv().await {
                    match item {
                        SeqOutput::Token(_) => {
                            if counting.load(Ordering::Relaxed) {
                                tokens.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => break,
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(args.seconds / 4.0)).await;
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    counting.store(false, Ordering::Relaxed);
    let took = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    tokens.load(Ordering::Relaxed) as f64 / took
}

fn group(lockstep: bool, wait: [u32; 2], max_wait: Duration) -> Arc<Runtime> {
    let g = ModelGroup::new(
        "duo",
        pair(lockstep),
        "random".parse::<AlgorithmSpec>().expect("spec"),
    )
    .expect("group");
    for (s, &b) in g.subservers().iter().zip(&wait) {
        s.engine
            .set_batch_wait(BatchWait {
                min_batch: b,
                max_wait,
            })
            .expect("batch wait");
    }
    Arc::new(Runtime::Group(g))
}

/// The Markov chain over the profiles' decode step times at this concurrency.
fn chain(args: &Args, concurrency: u32) -> ChainSpec {
    let occupancy =
        f64::from(concurrency) * f64::from(args.prompt + args.output) / 16.0 / f64::from(BLOCKS);
    let profile = |name: &str| {
        let p = SimProfile::builtin(name).expect("profile");
        StepProfile {
            step_ms: (1..=concurrency.max(2))
                .map(|b| p.decode_ms(b, occupancy))
                .collect(),
        }
    };
    let spec = ChainSpec {
        concurrency,
        profiles: [profile(SMALL), profile(LARGE)],
        handoff: [args.to_large, args.to_small],
        drop_on_handoff: [true, false],
        max_wait_ms: [args.max_wait_ms, args.max_wait_ms],
        max_batch: [None, None],
        tick_ms: 1.0,
    };
    ChainSpec {
        tick_ms: spec.auto_tick(),
        ..spec
    }
}

#[derive(Debug, Serialize)]
struct Row {
    concurrency: u32,
    lockstep_tok_s: f64,
    dispatcher_tok_s: f64,
    async_tok_s: f64,
    delayed_tok_s: f64,
    dtmc_b: [u32; 2],
    dtmc_predicted_tok_s: f64,
    best_b: u32,
    best_b_tok_s: f64,
    sweep_large_b_tok_s: Vec<f64>,
    delayed_over_lockstep: f64,
    delayed_over_dispatcher: f64,
    dtmc_over_best: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    let max_wait = Duration::from_secs_f64(args.max_wait_ms / 1e3);
    let mut rows = Vec::new();
    for &c in &args.concurrency {
        if args.plan_only {
            let spec = chain(&args, c);
            let t = Instant::now();
            let p = plan(&spec, 8)?;
            println!(
                "c={c}: B={:?} predicted {:.1} tok/s, {} states, {} iterations, planned in {:.2} s",
                p.best.batch_wait,
                p.best.tokens_per_s,
                p.best.states,
                p.best.iterations,
                t.elapsed().as_secs_f64()
            );
            continue;
        }
        let lockstep = measure(group(true, [1, 1], max_wait), args.clone(), c).await;
        let dispatcher = measure(
            Arc::new(Runtime::Dispatcher(Dispatcher::new(
                pair(false),
                format!(
                    "random:to_large={},to_small={}",
                    args.to_large, args.to_small
                )
                .parse::<AlgorithmSpec>()?,
            ))),
            args.clone(),
            c,
        )
        .await;
        let asynchronous = measure(group(false, [1, 1], max_wait), args.clone(), c).await;
        let spec = chain(&args, c);
        let planned = tokio::task::spawn_blocking(move || plan(&spec, 8)).await??;
        let dtmc_b = planned.best.batch_wait;
        let delayed = measure(group(false, dtmc_b, max_wait), args.clone(), c).await;
        let mut sweep = Vec::new();
        for b in 1..=8 {
            let t = if b == 1 {
                asynchronous
            } else {
                measure(group(false, [1, b], max_wait), args.clone(), c).await
            };
            sweep.push(t);
        }
        let (best_i, &best) = sweep
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("eight");
        let row = Row {
            concurrency: c,
            lockstep_tok_s: lockstep,
            dispatcher_tok_s: dispatcher,
            async_tok_s: asynchronous,
            delayed_tok_s: delayed,
            dtmc_b,
            dtmc_predicted_tok_s: planned.best.tokens_per_s,
            best_b: best_i as u32 + 1,
            best_b_tok_s: best,
            sweep_large_b_tok_s: sweep,
            delayed_over_lockstep: delayed / lockstep,
            delayed_over_dispatcher: delayed / dispatcher,
            dtmc_over_best: delayed / best.max(delayed),
        };
        println!(
            "c={c}: lockstep {lockstep:.1}, dispatcher {dispatcher:.1}, async {asynchronous:.1}, \
             delayed(B={dtmc_b:?}) {delayed:.1} (predicted {:.1}), best B={} {best:.1} tok/s",
            planned.best.tokens_per_s,
            best_i + 1
        );
        rows.push(row);
    }
    if args.plan_only {
        return Ok(());
    }
    let out = serde_json::json!({
        "benchmark": "handoff_sim",
        "command": "cargo run --release -p dolphin-bench --bin handoff_sim",
        "cpu": machine::cpu_name(),
        "cpu_flags": machine::cpu_flags(),
        "profiles": [SMALL, LARGE],
        "prompt_tokens": args.prompt,
        "output_tokens": args.output,
        "to_large": args.to_large,
        "to_small": args.to_small,
        "max_wait_ms": args.max_wait_ms,
        "seconds_per_config": args.seconds,
        "sweep_note": "sweep_large_b_tok_s[i] is B = (1, i + 1): the small model steps at once",
        "rows": rows,
    });
    let path = dolphin_bench::results::write_json("handoff_sim", None, &out)?;
    println!("wrote {}", path.display());
    Ok(())
}

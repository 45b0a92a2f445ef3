//! Time of one routing decision for a long prompt over two 16-worker pools, with the router's
//! own code: block hashing and prefix-index lookups in both pools (one walk, as the router runs
//! them; also timed apart), worker selection, and the prefill policy (Dynamo 1.6 threshold, and
//! always-remote).
//!
//! The router's registry is filled through its real subscriber path from fake workers (see
//! `dolphin_bench::fake_worker`); "whole" times `Dispatcher::route` on it. The per-stage
//! breakdown runs the same public functions (`PrefixIndex::lookup_pair`, and apart
//! `block_hashes_into` and `PrefixIndex::lookup`; `selection::select`, `Policy::decide`) on a mirror index holding the same blocks in the same
//! slots (checked before timing), since the registry does not expose its stages separately.
//!
//! `cargo run --release -p dolphin-bench --bin routing_decision [-- --iterations 100000]`

use std::time::{Duration, Instant};

// The router's allocator (`router/src/main.rs`): the indexes it times then sit on the memory
// they sit on in the router, huge pages included (mimalloc advises them; the kernel's mode
// here is `madvise`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{Context, ensure};
use clap::Parser;
use dolphin_bench::fake_worker::FakeRouter;
use dolphin_bench::routing_workload::{self, DecisionArgs, WorkerContents, WorkloadConfig};
use dolphin_bench::stats::{self, Summary};
use dolphin_cluster::{BlockHashes, ROOT_SEED, block_hashes_into};
use dolphin_router::dispatch::Dispatcher;
use dolphin_router::policy::{Decision, Features, Policy, PoolState, ThresholdConfig};
use dolphin_router::prefix_index::PrefixIndex;
use dolphin_router::selection::{self, Candidate, Choice};
use serde::Serialize;

const MODEL: &str = "sim-model";
const OVERLAP_WEIGHT: f64 = 1.0;
/// The `max_tokens` of every routed request (the policy's output-length hint).
const MAX_TOKENS: u32 = 256;
/// Issue 11's target for the whole decision (the first brief asked for 20 us).
const TARGET_P99_US: f64 = 10.0;

#[derive(Debug, Parser)]
#[command(about = "Routing decision time: hashing, index lookup, selection and policy")]
struct Args {
    /// Timing and workload size.
    #[command(flatten)]
    run: DecisionArgs,
    /// Where to write the JSON result (default: bench/results/routing_decision.json).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// One pool as the breakdown sees it: the mirror index and each slot's load.
struct MirrorPool {
    index: PrefixIndex,
    loads: Vec<f64>,
    waiting: Vec<u32>,
}

impl MirrorPool {
    fn build(workers: &[WorkerContents], block_size: u32) -> anyhow::Result<MirrorPool> {
        let mut index = PrefixIndex::new();
        let (mut loads, mut waiting) = (Vec::new(), Vec::new());
        for (i, w) in workers.iter().enumerate() {
            let slot = index.allocate_slot().context("pool full")?;
            ensure!(slot == i, "mirror slots must follow pool order");
            for chain in &w.chains {
                index.stored(slot, chain);
            }
            loads.push(selection::load_cost(
                w.load.active_tokens,
                w.load.waiting,
                block_size,
            ));
            waiting.push(w.load.waiting);
        }
        Ok(MirrorPool {
            index,
            loads,
            waiting,
        })
    }

    fn select(&self, counts: &[u32], prompt_blocks: u32) -> Option<Choice> {
        let candidates = self
            .loads
            .iter()
            .enumerate()
            .map(|(slot, &load)| Candidate {
                slot,
                cached_blocks: counts.get(slot).copied().unwrap_or(0),
                load,
                draining: false,
            });
        selection::with_rng(|rng| selection::select(candidates, prompt_blocks, OVERLAP_WEIGHT, rng))
    }
}

#[derive(Debug, Default, Serialize)]
struct PolicyResult {
    policy: &'static str,
    params: String,
    hashing: Summary,
    lookup_both_pools: Summary,
    /// Hashing and both pools' lookups in one walk (`PrefixIndex::lookup_pair`), as the router
    /// runs them: the two stages above overlapped, hashing stopped where no worker matches.
    hashing_and_lookup_fused: Summary,
    /// Per prompt, its fastest hashing plus both lookups, and its fastest walk, over all
    /// iterations, summarized over the prompts: the two ways compared without the host's noise.
    hash_then_lookup_best_per_prompt: Summary,
    fused_best_per_prompt: Summary,
    selection_and_policy: Summary,
    /// The fused walk plus selection and policy.
    stages_sum: Summary,
    whole: Summary,
    /// Per prompt, its fastest whole decision over all iterations (what an undisturbed core
    /// takes for it); summarized over the prompts. Robust to the noise of a shared machine.
    whole_best_per_prompt: Summary,
    whole_remote_decisions: u64,
    whole_local_decisions: u64,
    whole_p99_target_us: f64,
    /// The whole decision for prompts no worker holds any block of: hashed only as far as the
    /// walk reads (a few blocks past the last match), not all 512.
    whole_unseen_prompts: Summary,
    /// Prompts no worker holds: every block hashed, then both lookups.
    unseen_hash_all_then_lookup: Summary,
    /// Prompts no worker holds: the fused walk.
    unseen_fused: Summary,
    whole_p99_within_target: bool,
    /// The host's own tail in the same run: a fixed amount of register-only work sized to take
    /// the whole decision's median, timed the same way the same number of times. Its spread is
    /// the machine's (interrupts, a shared core), not the code's: a decision's p99 cannot be
    /// expected below this floor's p99.
    host_floor: Summary,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    /// `/proc/loadavg` when the run started (the machine may be shared: see the p99s).
    loadavg_at_start: String,
    /// The global allocator (the router's), and the kernel's transparent huge page mode it
    /// advises its memory under.
    allocator: &'static str,
    transparent_hugepage: String,
    workload: WorkloadConfig,
    index_blocks: IndexSize,
    iterations: usize,
    warmup: usize,
    results: Vec<PolicyResult>,
}

#[derive(Debug, Serialize)]
struct IndexSize {
    prefill_distinct: usize,
    decode_distinct: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let loadavg = dolphin_bench::machine::load_average();
    let cfg = args.run.workload();
    ensure!(
        args.run.iterations > 0 && cfg.prompts > 0,
        "need iterations and prompts"
    );
    let bs = cfg.block_size as u32;
    let t = Instant::now();
    let workload = routing_workload::build(&cfg);
    println!("workload built in {:.1?}", t.elapsed());

    let router = FakeRouter::start(
        &workload,
        MODEL,
        bs,
        Policy::AlwaysLocal,
        OVERLAP_WEIGHT,
        Duration::from_secs(120),
    )?;
    let dispatcher = &router.dispatcher;
    let mirror_prefill = MirrorPool::build(&workload.prefill, bs)?;
    let mirror_decode = MirrorPool::build(&workload.decode, bs)?;
    check_mirror(
        dispatcher,
        &workload.prompts,
        &mirror_decode,
        &mirror_prefill,
        bs,
    )?;
    println!(
        "index: {} prefill and {} decode blocks (distinct) over {} workers per pool; {} prompts of {} tokens",
        mirror_prefill.index.distinct_blocks(),
        mirror_decode.index.distinct_blocks(),
        cfg.workers_per_pool,
        cfg.prompts,
        cfg.prompt_tokens,
    );

    let mut results = Vec::new();
    for policy in [
        Policy::Threshold(ThresholdConfig::default()),
        Policy::AlwaysRemote,
    ] {
        dispatcher.set_policy(policy);
        let mut r = PolicyResult {
            policy: policy.name(),
            params: policy.params_json(),
            whole_p99_target_us: TARGET_P99_US,
            ..Default::default()
        };
        breakdown(
            &args,
            &workload.prompts,
            &mirror_decode,
            &mirror_prefill,
            policy,
            bs,
            &mut r,
        );
        whole(&args, &workload, dispatcher, &mut r)?;
        (r.unseen_hash_all_then_lookup, r.unseen_fused) =
            unseen_stages(&args, &workload.unseen, &mirror_decode, &mirror_prefill, bs);
        r.host_floor = host_floor(&args, r.whole.p50_us);
        println!("policy {} {}", r.policy, r.params);
        println!("  hashing             {}", r.hashing.line());
        println!("  lookup (both pools) {}", r.lookup_both_pools.line());
        println!(
            "  hash+lookup fused   {}",
            r.hashing_and_lookup_fused.line()
        );
        println!("  selection + policy  {}", r.selection_and_policy.line());
        println!("  fused + selection   {}", r.stages_sum.line());
        println!("  whole (route)       {}", r.whole.line());
        println!(
            "  unseen: hash, look  {}",
            r.unseen_hash_all_then_lookup.line()
        );
        println!("  unseen: fused       {}", r.unseen_fused.line());
        println!("  unseen: whole       {}", r.whole_unseen_prompts.line());
        println!("  host floor          {}", r.host_floor.line());
        println!(
            "  whole, best run of each prompt: median {:.2} us, worst prompt {:.2} us",
            r.whole_best_per_prompt.p50_us, r.whole_best_per_prompt.max_us
        );
        println!(
            "  best run of each prompt, medians: hash then look up {:.2} us, fused walk {:.2} us",
            r.hash_then_lookup_best_per_prompt.p50_us, r.fused_best_per_prompt.p50_us
        );
        println!(
            "  decisions: {} remote, {} local; whole p99 {:.2} us vs target {TARGET_P99_US} us: {}",
            r.whole_remote_decisions,
            r.whole_local_decisions,
            r.whole.p99_us,
            if r.whole_p99_within_target {
                "met"
            } else {
                "MISSED"
            }
        );
        results.push(r);
    }
    let report = Report {
        bench: "routing_decision",
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        loadavg_at_start: loadavg,
        allocator: "mimalloc",
        transparent_hugepage: std::fs::read_to_string(
            "/sys/kernel/mm/transparent_hugepage/enabled",
        )
        .map(|s| s.trim().to_owned())
        .unwrap_or_default(),
        index_blocks: IndexSize {
            prefill_distinct: mirror_prefill.index.distinct_blocks(),
            decode_distinct: mirror_decode.index.distinct_blocks(),
        },
        workload: cfg,
        iterations: args.run.iterations,
        warmup: args.run.warmup,
        results,
    };
    let path =
        dolphin_bench::results::write_json("routing_decision", args.out.as_deref(), &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// A prompt's hashes and both mirror pools' counts, made either way the breakdown times.
#[derive(Debug, Default)]
struct Lookups {
    hashes: Vec<u64>,
    decode: Vec<u32>,
    prefill: Vec<u32>,
}

impl Lookups {
    /// Every block of `tokens` hashed (the router before the walk, first half).
    fn hash(&mut self, tokens: &[u32], bs: u32) {
        block_hashes_into(tokens, bs as usize, &mut self.hashes);
    }

    /// Both pools looked up over the hashes (second half).
    fn look_up(&mut self, decode: &MirrorPool, prefill: &MirrorPool) {
        decode.index.lookup(&self.hashes, &mut self.decode);
        prefill.index.lookup(&self.hashes, &mut self.prefill);
    }

    /// The router's walk: hashed as it looks up, stopped where nothing matches.
    fn walk(&mut self, tokens: &[u32], bs: u32, decode: &MirrorPool, prefill: &MirrorPool) {
        PrefixIndex::lookup_pair(
            &decode.index,
            &prefill.index,
            &mut BlockHashes::new(ROOT_SEED, tokens, bs as usize),
            &mut self.hashes,
            &mut self.decode,
            &mut self.prefill,
        );
    }
}

/// Before timing: the registry's decisions must see the same cached prefixes as the mirror.
fn check_mirror(
    d: &Dispatcher,
    prompts: &[Vec<u32>],
    decode: &MirrorPool,
    prefill: &MirrorPool,
    bs: u32,
) -> anyhow::Result<()> {
    let (mut hashes, mut counts) = (Vec::new(), Vec::new());
    for p in prompts {
        let route = d.route(p, MAX_TOKENS, None, &[])?;
        block_hashes_into(p, bs as usize, &mut hashes);
        decode.index.lookup(&hashes, &mut counts);
        ensure!(
            counts[route.decode.worker.slot] == route.decode.cached_blocks,
            "decode mirror differs"
        );
        let pf = route.prefill.context("no prefill worker routed")?;
        prefill.index.lookup(&hashes, &mut counts);
        ensure!(
            counts[pf.worker.slot] == pf.cached_blocks,
            "prefill mirror differs"
        );
    }
    Ok(())
}

/// Times each stage separately on the mirror pools.
fn breakdown(
    args: &Args,
    prompts: &[Vec<u32>],
    decode: &MirrorPool,
    prefill: &MirrorPool,
    policy: Policy,
    bs: u32,
    r: &mut PolicyResult,
) {
    let n = args.run.iterations;
    let (mut hash_ns, mut lookup_ns, mut fused_ns, mut select_ns, mut sum_ns) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut l = Lookups::default();
    let mut best_apart = vec![u64::MAX; prompts.len()];
    let mut best_fused = vec![u64::MAX; prompts.len()];
    for i in 0..args.run.warmup + n {
        let (k, o) = (i % prompts.len(), (i + prompts.len() / 2) % prompts.len());
        let tokens = &prompts[k];
        // The two stages the router fuses, timed apart for reference, on another prompt (the
        // walk below must not find this one's lines in cache).
        let other = &prompts[o];
        let t0 = Instant::now();
        l.hash(other, bs);
        let t1 = Instant::now();
        l.look_up(decode, prefill);
        let t2 = Instant::now();
        std::hint::black_box(&l);
        // The router's way: one walk that hashes as it looks up, then selection and policy.
        let blocks = (tokens.len() / bs as usize) as u32;
        let t3 = Instant::now();
        l.walk(tokens, bs, decode, prefill);
        let t4 = Instant::now();
        let d = decode.select(&l.decode, blocks);
        let p = prefill.select(&l.prefill, blocks);
        let isl = tokens.len() as u32;
        let uncached = |c: &Choice| isl.saturating_sub(c.cached_blocks.saturating_mul(bs));
        let features = Features {
            isl,
            eff_isl_prefill: p.as_ref().map_or(isl, uncached),
            eff_isl_decode: d.as_ref().map_or(isl, uncached),
            output_len_hint: MAX_TOKENS,
        };
        let state = PoolState {
            available: p.is_some(),
            queue: p.map_or(0, |c| prefill.waiting[c.slot]),
            ..PoolState::IDLE
        };
        let decision = policy.decide(&features, state);
        let t5 = Instant::now();
        std::hint::black_box((d, decision));
        if i >= args.run.warmup {
            hash_ns.push(stats::ns(t1 - t0));
            lookup_ns.push(stats::ns(t2 - t1));
            fused_ns.push(stats::ns(t4 - t3));
            select_ns.push(stats::ns(t5 - t4));
            sum_ns.push(stats::ns(t5 - t3));
            best_apart[o] = best_apart[o].min(stats::ns(t2 - t0));
            best_fused[k] = best_fused[k].min(stats::ns(t4 - t3));
        }
    }
    r.hashing = Summary::from_nanos(&mut hash_ns);
    r.lookup_both_pools = Summary::from_nanos(&mut lookup_ns);
    r.hashing_and_lookup_fused = Summary::from_nanos(&mut fused_ns);
    r.selection_and_policy = Summary::from_nanos(&mut select_ns);
    r.stages_sum = Summary::from_nanos(&mut sum_ns);
    for (best, summary) in [
        (&mut best_apart, &mut r.hash_then_lookup_best_per_prompt),
        (&mut best_fused, &mut r.fused_best_per_prompt),
    ] {
        best.retain(|&b| b != u64::MAX);
        *summary = Summary::from_nanos(best);
    }
}

/// On prompts no worker holds: hashing every block then looking them up (the router before
/// the fused walk), against the fused walk (which stops hashing where nothing matches).
fn unseen_stages(
    args: &Args,
    unseen: &[Vec<u32>],
    decode: &MirrorPool,
    prefill: &MirrorPool,
    bs: u32,
) -> (Summary, Summary) {
    let n = args.run.iterations;
    let (mut apart_ns, mut fused_ns) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut l = Lookups::default();
    for i in 0..args.run.warmup + n {
        let tokens = &unseen[i % unseen.len()];
        let t0 = Instant::now();
        l.hash(tokens, bs);
        l.look_up(decode, prefill);
        let t1 = Instant::now();
        std::hint::black_box(&l);
        let t2 = Instant::now();
        l.walk(tokens, bs, decode, prefill);
        let t3 = Instant::now();
        std::hint::black_box(&l);
        if i >= args.run.warmup {
            apart_ns.push(stats::ns(t1 - t0));
            fused_ns.push(stats::ns(t3 - t2));
        }
    }
    (
        Summary::from_nanos(&mut apart_ns),
        Summary::from_nanos(&mut fused_ns),
    )
}

/// Fixed work: `rounds` dependent multiply-xorshift steps, registers only.
#[inline(never)]
fn spin(seed: u64, rounds: u64) -> u64 {
    let mut x = seed;
    for _ in 0..rounds {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x ^= x >> 29;
    }
    x
}

/// Times [`spin`] sized to `p50_us` (its fastest of a few calibration runs) as many times as
/// the decisions were timed: the tail this host adds to any work of that length.
fn host_floor(args: &Args, p50_us: f64) -> Summary {
    const CALIBRATION_ROUNDS: u64 = 100_000;
    let fastest = (0..20)
        .map(|i| {
            let t = Instant::now();
            std::hint::black_box(spin(i, CALIBRATION_ROUNDS));
            t.elapsed()
        })
        .min()
        .unwrap_or_default();
    let per_round_ns = stats::ns(fastest).max(1) as f64 / CALIBRATION_ROUNDS as f64;
    let rounds = (p50_us * 1000.0 / per_round_ns).round() as u64;
    let mut samples = Vec::with_capacity(args.run.iterations);
    for i in 0..(args.run.warmup + args.run.iterations) as u64 {
        let t = Instant::now();
        std::hint::black_box(spin(i, rounds));
        let elapsed = t.elapsed();
        if i >= args.run.warmup as u64 {
            samples.push(stats::ns(elapsed));
        }
    }
    Summary::from_nanos(&mut samples)
}

/// Times `Dispatcher::route`, the router's whole decision: on the workload's prompts, and on
/// prompts no worker holds.
fn whole(
    args: &Args,
    workload: &routing_workload::Workload,
    d: &Dispatcher,
    r: &mut PolicyResult,
) -> anyhow::Result<()> {
    let mut best = vec![u64::MAX; workload.prompts.len()];
    let (mut remote, mut local) = (0, 0);
    r.whole = time_routes(args, &workload.prompts, d, |i, elapsed, decision| {
        best[i] = best[i].min(elapsed);
        match decision {
            Decision::Remote => remote += 1,
            Decision::Local => local += 1,
        }
    })?;
    (r.whole_remote_decisions, r.whole_local_decisions) = (remote, local);
    best.retain(|&b| b != u64::MAX);
    r.whole_best_per_prompt = Summary::from_nanos(&mut best);
    r.whole_p99_within_target = r.whole.p99_us <= TARGET_P99_US;
    r.whole_unseen_prompts = time_routes(args, &workload.unseen, d, |_, _, _| {})?;
    Ok(())
}

/// Times `Dispatcher::route` over `prompts` in turn; `each` sees every timed decision (the
/// prompt's index, nanoseconds, the decision).
fn time_routes(
    args: &Args,
    prompts: &[Vec<u32>],
    d: &Dispatcher,
    mut each: impl FnMut(usize, u64, Decision),
) -> anyhow::Result<Summary> {
    let mut samples = Vec::with_capacity(args.run.iterations);
    for i in 0..args.run.warmup + args.run.iterations {
        let tokens = &prompts[i % prompts.len()];
        let t = Instant::now();
        let route = d.route(tokens, MAX_TOKENS, None, &[]);
        let elapsed = t.elapsed();
        let route = route?;
        if i >= args.run.warmup {
            samples.push(stats::ns(elapsed));
            each(i % prompts.len(), stats::ns(elapsed), route.decision);
        }
        // Dropped outside the timed span, like the request path which keeps it for the stream.
        drop(route);
    }
    Ok(Summary::from_nanos(&mut samples))
}

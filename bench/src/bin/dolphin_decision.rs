//! Decision time of the `dolphin` policy beside the threshold policy, in the same run, for an
//! 8k-token prompt over 16 prefill and 16 decode workers.
//!
//! "whole" times `Dispatcher::route`, the router's complete decision: admission sketch and
//! output-length classifier, block hashing, prefix-index lookups in both pools, worker
//! selection, the four features, and the policy (for `dolphin`: the live split's table,
//! standardization, cluster assignment, the bit). The registry is filled through its real
//! subscriber path from fake workers (the routing benchmark's workload). The classifier has a
//! trained model's shape (256 family and 256 token buckets, random weights: its cost does not
//! depend on the values); tables have K = 8 clusters fitted to the features of the workload's
//! own requests (k-means and a diagonal Gaussian mixture). The two dolphin-only stages are also
//! timed alone.
//!
//! `cargo run --release -p dolphin-bench --bin dolphin_decision [-- --iterations 100000]`

use std::time::{Duration, Instant};

// The router's allocator, as in `routing_decision`: the indexes and tables it times sit on the
// memory they sit on in the router.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{bail, ensure};
use clap::Parser;
use dolphin_bench::fake_worker::FakeRouter;
use dolphin_bench::routing_workload::{self, DecisionArgs, WorkloadConfig};
use dolphin_bench::stats::{self, Summary};
use dolphin_router::dispatch::Dispatcher;
use dolphin_router::dolphin::admission::InputShape;
use dolphin_router::dolphin::assign::CompiledTable;
use dolphin_router::dolphin::table::{
    ClusterMethod, ClusterModel, Provenance, RoutingTable, Standardizer, TABLE_SCHEMA_VERSION,
    TableSlo, Transform,
};
use dolphin_router::dolphin::{Admission, OutputClassifier};
use dolphin_router::policy::{
    Decision, DolphinConfig, FallbackKind, Features, Policy, PoolState, ThresholdConfig,
};
use dolphin_router::route;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

const MODEL: &str = "sim-model";
const MAX_TOKENS: u32 = 256;
const K: usize = 8;
const TARGET_P99_US: f64 = 20.0;

#[derive(Debug, Parser)]
#[command(about = "Decision time of the dolphin policy beside the threshold policy")]
struct Args {
    /// Timing and workload size.
    #[command(flatten)]
    run: DecisionArgs,
    /// Where to write the JSON result (default: bench/results/dolphin_decision.json).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Debug, Default, Serialize)]
struct PolicyResult {
    policy: String,
    table: String,
    whole: Summary,
    whole_best_per_prompt: Summary,
    remote_decisions: u64,
    local_decisions: u64,
    clusters_seen: usize,
    p99_target_us: f64,
    p99_within_target: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    cpu: String,
    cpu_flags: Vec<&'static str>,
    /// `/proc/loadavg` when the run started (the machine may be shared: see the p99s).
    loadavg_at_start: String,
    /// The global allocator (the router's).
    allocator: &'static str,
    workload: WorkloadConfig,
    split: String,
    k: usize,
    classifier_shape: [usize; 2],
    iterations: usize,
    warmup: usize,
    /// Admission sketch plus classifier prediction alone.
    stage_classifier: Summary,
    /// Table of the split, standardization, assignment, bit (k-means, then GMM) alone.
    stage_table_kmeans: Summary,
    stage_table_gmm: Summary,
    results: Vec<PolicyResult>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let loadavg = dolphin_bench::machine::load_average();
    let cfg = args.run.workload();
    ensure!(args.run.iterations > 0, "need iterations");
    let bs = cfg.block_size as u32;
    let workload = routing_workload::build(&cfg);
    let router = FakeRouter::start(
        &workload,
        MODEL,
        bs,
        Policy::Threshold(ThresholdConfig::default()),
        1.0,
        Duration::from_secs(180),
    )?;
    let (registry, dispatcher) = (&router.registry, &router.dispatcher);
    ensure!(
        registry.split().to_string() == format!("{0}p{0}d", workload.prefill.len()),
        "unexpected split {}",
        registry.split()
    );
    let split = registry.split();
    let classifier = trained_shape_classifier(256, 256);
    dispatcher
        .dolphin()
        .apply_classifier(Some(&classifier.to_json_pretty()));
    // Tables fitted to this workload's own feature vectors.
    let features: Vec<Features> = workload
        .prompts
        .iter()
        .map(|p| {
            dispatcher
                .route(p, MAX_TOKENS, None, &[])
                .map(|r| r.features)
        })
        .collect::<Result<_, _>>()?;
    let kmeans = table(split, ClusterMethod::Kmeans, &features);
    let gmm = table(split, ClusterMethod::Gmm, &features);

    let stage_classifier = time_stage(&args, |i| {
        let p = &workload.prompts[i % workload.prompts.len()];
        let a = Admission::new(p, MAX_TOKENS);
        std::hint::black_box(dispatcher.dolphin().classify(&a));
    });
    let mut stage_tables = Vec::new();
    for (name, t) in [("kmeans", &kmeans), ("gmm", &gmm)] {
        dispatcher
            .dolphin()
            .install(split, name, &t.to_json_pretty())?;
        let fallback = DolphinConfig {
            fallback: FallbackKind::AlwaysLocal,
            ..DolphinConfig::default()
        };
        let state = PoolState::IDLE;
        let policy = Policy::Dolphin(fallback);
        stage_tables.push(time_stage(&args, |i| {
            let f = features[i % features.len()];
            std::hint::black_box(
                dispatcher
                    .dolphin()
                    .with_table(split, |t| route::decide(f, state, &policy, t, None)),
            )
            .ok();
        }));
    }

    let mut results = Vec::new();
    let runs: [(Policy, Option<(&str, &RoutingTable)>); 3] = [
        (Policy::Threshold(ThresholdConfig::default()), None),
        (
            Policy::Dolphin(DolphinConfig::default()),
            Some(("kmeans", &kmeans)),
        ),
        (
            Policy::Dolphin(DolphinConfig::default()),
            Some(("gmm", &gmm)),
        ),
    ];
    for (policy, t) in runs {
        if let Some((name, t)) = t {
            dispatcher
                .dolphin()
                .install(split, name, &t.to_json_pretty())?;
        }
        dispatcher.set_policy(policy);
        let r = whole(&args, &workload.prompts, dispatcher, policy, t.map(|x| x.0))?;
        println!(
            "{:<10} {:<7} {}  best-per-prompt median {:.2} us; {} remote / {} local; {} clusters; p99 {}",
            r.policy,
            r.table,
            r.whole.line(),
            r.whole_best_per_prompt.p50_us,
            r.remote_decisions,
            r.local_decisions,
            r.clusters_seen,
            if r.p99_within_target {
                "within 20 us"
            } else {
                "OVER 20 us"
            }
        );
        results.push(r);
    }
    println!("stage classifier      {}", stage_classifier.line());
    println!("stage table (kmeans)  {}", stage_tables[0].line());
    println!("stage table (gmm)     {}", stage_tables[1].line());
    let report = Report {
        bench: "dolphin_decision",
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        loadavg_at_start: loadavg,
        allocator: "mimalloc",
        workload: cfg,
        split: split.to_string(),
        k: K,
        classifier_shape: [classifier.n_family, classifier.n_hash],
        iterations: args.run.iterations,
        warmup: args.run.warmup,
        stage_classifier,
        stage_table_kmeans: stage_tables[0],
        stage_table_gmm: stage_tables[1],
        results,
    };
    let path =
        dolphin_bench::results::write_json("dolphin_decision", args.out.as_deref(), &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// A classifier with a trained model's shape and random weights.
fn trained_shape_classifier(n_family: usize, n_hash: usize) -> OutputClassifier {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut c = OutputClassifier::prior();
    c.n_family = n_family;
    c.n_hash = n_hash;
    let dim = InputShape { n_family, n_hash }.dim();
    c.weights = (0..3)
        .map(|_| (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect();
    c.provenance.source = "bench (random weights)".into();
    c
}

/// A K-cluster table over `features`: standardizer fitted to them, centres at K of them.
fn table(
    split: dolphin_router::dolphin::Split,
    method: ClusterMethod,
    features: &[Features],
) -> RoutingTable {
    let raw: Vec<[f64; 4]> = features.iter().map(CompiledTable::raw).collect();
    let (mut mean, mut std) = (vec![0.0; 4], vec![1.0; 4]);
    for d in 0..4 {
        let xs: Vec<f64> = raw.iter().map(|x| x[d].ln_1p()).collect();
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        let s = (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / xs.len() as f64).sqrt();
        mean[d] = m;
        std[d] = if s > 1e-9 { s } else { 1.0 };
    }
    let mut rng = SmallRng::seed_from_u64(11);
    let centres: Vec<Vec<f64>> = (0..K)
        .map(|_| {
            let x = raw[rng.random_range(0..raw.len())];
            (0..4)
                .map(|d| (x[d].ln_1p() - mean[d]) / std[d] + rng.random_range(-0.3..0.3))
                .collect()
        })
        .collect();
    let model = match method {
        ClusterMethod::Kmeans => ClusterModel {
            centroids: Some(centres),
            ..Default::default()
        },
        ClusterMethod::Gmm => {
            let mut weights = vec![1.0 / K as f64; K];
            weights[0] = 1.0 - (K - 1) as f64 / K as f64;
            ClusterModel {
                weights: Some(weights),
                means: Some(centres),
                variances: Some(vec![vec![0.5; 4]; K]),
                ..Default::default()
            }
        }
    };
    RoutingTable {
        schema_version: TABLE_SCHEMA_VERSION,
        split,
        slo: TableSlo {
            ttft_ms: 5000.0,
            tpot_ms: 250.0,
        },
        k: K,
        method,
        standardizer: Standardizer {
            transform: Transform::Log1p,
            mean,
            std,
        },
        model,
        bits: (0..K).map(|i| (i % 2) as u8).collect(),
        evidence: Vec::new(),
        load_rule: None,
        provenance: Provenance {
            workload: "bench".into(),
            date: String::new(),
            rounds: 0,
            rewards: vec![],
            reward: Default::default(),
            notes: "benchmark table: centres at the workload's own requests".into(),
        },
    }
}

fn time_stage(args: &Args, mut f: impl FnMut(usize)) -> Summary {
    let mut samples = Vec::with_capacity(args.run.iterations);
    for i in 0..args.run.warmup + args.run.iterations {
        let t = Instant::now();
        f(i);
        let e = t.elapsed();
        if i >= args.run.warmup {
            samples.push(stats::ns(e));
        }
    }
    Summary::from_nanos(&mut samples)
}

fn whole(
    args: &Args,
    prompts: &[Vec<u32>],
    d: &Dispatcher,
    policy: Policy,
    table: Option<&str>,
) -> anyhow::Result<PolicyResult> {
    let mut r = PolicyResult {
        policy: policy.name().into(),
        table: table.unwrap_or("-").into(),
        p99_target_us: TARGET_P99_US,
        ..Default::default()
    };
    let mut samples = Vec::with_capacity(args.run.iterations);
    let mut best = vec![u64::MAX; prompts.len()];
    let mut clusters = std::collections::HashSet::new();
    for i in 0..args.run.warmup + args.run.iterations {
        let tokens = &prompts[i % prompts.len()];
        let t = Instant::now();
        let route = d.route(tokens, MAX_TOKENS, None, &[]);
        let elapsed = t.elapsed();
        let route = route?;
        if table.is_some() && route.table_version.is_none() {
            bail!("the dolphin policy fell back: no table for the live split");
        }
        if i >= args.run.warmup {
            samples.push(stats::ns(elapsed));
            best[i % prompts.len()] = best[i % prompts.len()].min(stats::ns(elapsed));
            clusters.insert(route.cluster);
            match route.decision {
                Decision::Remote => r.remote_decisions += 1,
                Decision::Local => r.local_decisions += 1,
            }
        }
        drop(route);
    }
    r.whole = Summary::from_nanos(&mut samples);
    best.retain(|&b| b != u64::MAX);
    r.whole_best_per_prompt = Summary::from_nanos(&mut best);
    r.p99_within_target = r.whole.p99_us <= TARGET_P99_US;
    r.clusters_seen = if table.is_some() { clusters.len() } else { 0 };
    Ok(r)
}

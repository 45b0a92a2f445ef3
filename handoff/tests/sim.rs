//! Model groups over the simulated engine: handoff-resume, cancellation, delayed batching.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Recording, Scripted, collect};
use dolphin_engine::{
    BatchWait, Engine, FinishReason, SeqOutput, SeqRequest, SimConfig, SimProfile, sim_engine,
};
use dolphin_handoff::algorithms::{AlwaysLarge, AlwaysSmall, RandomHandoff};
use dolphin_handoff::{AlgorithmSpec, GroupOptions, ModelGroup, Subserver};

fn sim(name: &str, time_scale: f64) -> Arc<dyn Engine> {
    let mut cfg = SimConfig::new(SimProfile::builtin("dynamo-mocker").expect("profile"));
    cfg.time_scale = time_scale;
    cfg.model = name.into();
    cfg.total_blocks = 256;
    sim_engine(cfg).expect("sim engine")
}

fn group(time_scale: f64) -> Arc<ModelGroup> {
    group_with(time_scale, GroupOptions::default())
}

fn group_with(time_scale: f64, options: GroupOptions) -> Arc<ModelGroup> {
    ModelGroup::with_options(
        "duo",
        Subserver::small_large(sim("small", time_scale), sim("large", time_scale)),
        "entropy".parse::<AlgorithmSpec>().expect("spec"),
        options,
    )
    .expect("group")
}

fn request(id: &str, prompt_len: u32, max_tokens: u32) -> SeqRequest {
    let mut req = SeqRequest {
        request_id: id.into(),
        prompt: (0..prompt_len).map(|i| 3 + (i * 7) % 90).collect(),
        sampling: Default::default(),
    };
    req.sampling.max_tokens = max_tokens;
    req
}

#[tokio::test]
async fn fixed_algorithms_write_exactly_one_models_output() {
    let g = group(0.0);
    let alone = collect(
        g.subservers()[1]
            .engine
            .generate(request("ref", 40, 24))
            .await
            .expect("ref"),
    )
    .await
    .expect("ref");
    for (i, alg) in [
        Box::new(AlwaysSmall) as Box<dyn dolphin_handoff::HandoffAlgorithm>,
        Box::new(AlwaysLarge),
    ]
    .into_iter()
    .enumerate()
    {
        let (tokens, usage) = collect(g.generate_with(request("a", 40, 24), alg).await.expect("a"))
            .await
            .expect("a");
        assert_eq!(tokens, alone.0, "the sim's models write the same tokens");
        assert_eq!(usage.handoffs, 0);
        assert_eq!(usage.by_model[i].tokens, 24, "{usage:?}");
        assert_eq!(usage.by_model[1 - i].tokens, 0, "{usage:?}");
    }
}

#[tokio::test]
async fn handoffs_keep_both_caches_in_step() {
    for sync_tokens in [0, 1, 3] {
        caches_in_step(group_with(0.0, GroupOptions { sync_tokens })).await;
    }
}

/// With or without background sync, the same handoffs give the same tokens, and both caches
/// hold what a fresh prefill computes.
async fn caches_in_step(g: Arc<ModelGroup>) {
    let alg = Scripted {
        to_large: vec![3, 9, 12, 20],
        span: 2,
    };
    let (rec, writers) = Recording::new(Box::new(alg));
    let req = request("h", 37, 30);
    let reference = {
        let e = sim("reference", 0.0);
        collect(e.generate(request("ref", 37, 30)).await.expect("ref"))
            .await
            .expect("ref")
            .0
    };
    let prompt = req.prompt.clone();
    let (tokens, usage) = collect(g.generate_with(req, Box::new(rec)).await.expect("h"))
        .await
        .expect("h");
    assert_eq!(tokens, reference, "the sim's models write the same tokens");
    assert_eq!(usage.handoffs, 8, "{usage:?}");
    assert_eq!(usage.by_model[0].tokens + usage.by_model[1].tokens, 30);
    assert_eq!(writers.lock().len(), 30);
    assert_eq!(
        writers.lock().iter().filter(|&&m| m == 1).count() as u32,
        usage.by_model[1].tokens
    );
    // Every full block either model cached while the request ran holds what a fresh prefill of
    // the final sequence computes: the sim's KV bytes are a function of every token before.
    let mut full = prompt.clone();
    full.extend(&tokens);
    let fresh = sim("fresh", 0.0);
    let want = fresh
        .prefill(request_of("fresh", &full), 0)
        .await
        .expect("fresh prefill");
    for s in g.subservers() {
        let got = s
            .engine
            .prefill(request_of("check", &full), 0)
            .await
            .expect("prefill");
        assert!(
            got.cached_tokens >= 48,
            "{}: the request's blocks are cached ({} tokens)",
            s.name,
            got.cached_tokens
        );
        assert_eq!(
            got.blocks, want.blocks,
            "{}: KV equals a fresh prefill",
            s.name
        );
    }
}

fn request_of(id: &str, tokens: &[u32]) -> SeqRequest {
    let mut req = request(id, 1, 1);
    req.prompt = tokens.to_vec();
    req
}

#[tokio::test]
async fn random_handoffs_are_deterministic_for_a_seed() {
    let g = group(0.0);
    let run = |id: &'static str| {
        let g = g.clone();
        async move {
            let alg = RandomHandoff::new(0.3, 0.5, 42);
            let (rec, writers) = Recording::new(Box::new(alg));
            let out = collect(
                g.generate_with(request(id, 20, 40), Box::new(rec))
                    .await
                    .expect(id),
            )
            .await
            .expect(id);
            (out, writers.lock().clone())
        }
    };
    let (a, wa) = run("r1").await;
    let (b, wb) = run("r2").await;
    assert_eq!(a.0, b.0, "same tokens");
    assert_eq!((&a.1.by_model, a.1.handoffs), (&b.1.by_model, b.1.handoffs));
    assert_eq!(wa, wb, "same writers");
    assert!(a.1.handoffs > 4, "{:?}", a.1);
}

#[tokio::test]
async fn cancel_frees_blocks_in_every_subserver() {
    let g = group(1.0);
    let before: Vec<u32> = g
        .subservers()
        .iter()
        .map(|s| s.engine.load().free_blocks)
        .collect();
    let alg = RandomHandoff::new(0.3, 0.5, 7);
    let mut rx = g
        .generate_with(request("c", 64, 2000), Box::new(alg))
        .await
        .expect("c");
    for _ in 0..5 {
        let got = rx.recv().await;
        assert!(matches!(got, Some(SeqOutput::Token(_))), "{got:?}");
    }
    g.cancel("c");
    let last = loop {
        match rx.recv().await {
            Some(SeqOutput::Token(_)) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(
            last,
            Some(SeqOutput::Finished {
                reason: FinishReason::Cancelled,
                ..
            })
        ),
        "{last:?}"
    );
    // The cancels reach every subserver through the inter-model loop.
    for _ in 0..200 {
        let now: Vec<u32> = g
            .subservers()
            .iter()
            .map(|s| s.engine.load().free_blocks)
            .collect();
        if now == before && g.subservers().iter().all(|s| s.engine.load().running == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("blocks not freed in every subserver");
}

#[tokio::test(start_paused = true)]
async fn delayed_batching_never_waits_past_its_bound() {
    let engine = sim("alone", 1.0);
    let bound = Duration::from_millis(40);
    engine
        .set_batch_wait(BatchWait {
            min_batch: 4,
            max_wait: bound,
        })
        .expect("batch wait");
    let profile = SimProfile::builtin("dynamo-mocker").expect("profile");
    let started = tokio::time::Instant::now();
    let mut rx = engine.generate(request("w", 16, 8)).await.expect("w");
    let mut last = started;
    let mut gaps = Vec::new();
    while let Some(item) = rx.recv().await {
        if let SeqOutput::Token(_) = item {
            let now = tokio::time::Instant::now();
            gaps.push(now - last);
            last = now;
        }
    }
    assert_eq!(gaps.len(), 8);
    // Virtual time: each step waits the bound (a lone request never fills a batch of 4), then
    // takes its profile time; never longer.
    let step =
        Duration::from_secs_f64(profile.step_ms(16, 0, 0.0).max(profile.decode_ms(1, 1.0)) / 1e3);
    for (i, g) in gaps.iter().enumerate() {
        assert!(*g >= bound, "token {i} came after {g:?}, before the bound");
        assert!(
            *g <= bound + step + Duration::from_millis(2),
            "token {i} waited {g:?}: past the bound {bound:?} plus a step {step:?}"
        );
    }
}

/// Log probabilities follow every token through handoffs: each comes from the model that
/// wrote it (a sim token's is 0, itself the only alternative).
#[tokio::test]
async fn logprobs_ride_with_every_token_across_handoffs() {
    let g = group(0.0);
    let alg = Scripted {
        to_large: vec![2, 7],
        span: 2,
    };
    let mut req = request("lp", 30, 12);
    req.sampling.logprobs = Some(1);
    let mut rx = g.generate_with(req, Box::new(alg)).await.expect("lp");
    let mut tokens = 0;
    loop {
        match rx.recv().await.expect("stream open") {
            SeqOutput::Token(t) => {
                let lp = t.logprobs.expect("every token has them");
                assert_eq!((lp.logprob, lp.top), (0.0, vec![(t.id, 0.0)]));
                tokens += 1;
            }
            SeqOutput::Finished { usage, .. } => {
                assert_eq!(usage.handoffs, 4, "{usage:?}");
                break;
            }
            SeqOutput::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(tokens, 12);
}

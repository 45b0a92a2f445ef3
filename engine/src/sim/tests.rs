//! Sim engine tests: remote prefill equals local prefill token for token, corrupt KV is caught,
//! prefix hits, timing from the profile (on Tokio's paused clock), zero-delay mode.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::backend::{Backend, Batch, SeqStart};
use crate::types::{
    FinishReason, Generated, KvEvent, OutputStream, PrefillOutput, Reservation, Sampling,
    SeqOutput, SeqRequest, SeqUsage,
};

fn config(profile: &str) -> SimConfig {
    let mut cfg = SimConfig::new(SimProfile::builtin(profile).expect("shipped profile"));
    cfg.time_scale = 0.0;
    cfg.total_blocks = 256;
    cfg.max_batched_tokens = 64;
    cfg
}

fn engine() -> Arc<dyn Engine> {
    sim_engine(config("dynamo-mocker")).expect("valid config")
}

fn request(id: &str, prompt: Vec<u32>, max_tokens: u32) -> SeqRequest {
    SeqRequest {
        request_id: id.into(),
        prompt,
        sampling: Sampling {
            max_tokens,
            ..Sampling::default()
        },
    }
}

/// A deterministic prompt of printable ids.
fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| 3 + (i.wrapping_mul(2_654_435_761) ^ seed) % 96)
        .collect()
}

async fn collect(mut rx: OutputStream) -> (Vec<u32>, FinishReason, SeqUsage) {
    let mut tokens = Vec::new();
    while let Some(out) = rx.recv().await {
        match out {
            SeqOutput::Token(t) => tokens.push(t.id),
            SeqOutput::Finished { reason, usage } => return (tokens, reason, usage),
            SeqOutput::Error(e) => panic!("stream failed: {e}"),
        }
    }
    panic!("stream ended without Finished");
}

/// Reserve on `d`, prefill on `p`, import every block on `d`: ready to resume.
async fn ship(p: &dyn Engine, d: &dyn Engine, req: SeqRequest) -> (Reservation, PrefillOutput) {
    let r = d.reserve(req.clone()).await.expect("reserved");
    let out = p.prefill(req, r.cached_blocks).await.expect("prefilled");
    assert_eq!(out.blocks.len() as u32, r.blocks_expected);
    for (i, block) in out.blocks.iter().enumerate() {
        d.import(r.seq, i as u32, block)
            .expect("intact block imports");
    }
    (r, out)
}

/// Prefill on `p`, ship every block to `d`, decode there.
async fn remote(p: &dyn Engine, d: &dyn Engine, req: SeqRequest) -> (Vec<u32>, u32) {
    let (r, out) = ship(p, d, req).await;
    let (tokens, reason, _) = collect(
        d.resume(r.seq, out.first_token.into())
            .await
            .expect("resumed"),
    )
    .await;
    assert_eq!(reason, FinishReason::Length);
    (tokens, r.cached_blocks)
}

#[tokio::test]
async fn remote_prefill_yields_the_local_tokens() {
    let (local, p, d) = (engine(), engine(), engine());
    // 37 tokens: two full blocks and a partial one of 5, which is exported too.
    let req = request("a", prompt(1, 37), 40);
    let (expected, reason, usage) = collect(local.generate(req.clone()).await.expect("ok")).await;
    assert_eq!(
        (reason, usage.completion_tokens),
        (FinishReason::Length, 40)
    );
    assert!(
        expected.iter().all(|t| (3..=98).contains(t)),
        "printable ids, no EOS: {expected:?}"
    );
    let out = p.prefill(req.clone(), 0).await.expect("prefilled");
    let bpt = p.info().kv_bytes_per_token as usize;
    assert_eq!(bpt, 131, "131072 bytes per token at byte scale 0.001");
    let sizes: Vec<usize> = out.blocks.iter().map(|b| b.len()).collect();
    assert_eq!(sizes, vec![16 * bpt, 16 * bpt, 5 * bpt]);
    assert_eq!(out.first_token, expected[0]);

    let (tokens, cached) = remote(&*p, &*d, request("b", req.prompt.clone(), 40)).await;
    assert_eq!(cached, 0);
    assert_eq!(
        tokens, expected,
        "remote prefill decodes exactly the local tokens"
    );

    // Again through the prefill worker's own prefix cache (2 of 3 blocks cached there): the
    // cached blocks it exports still verify on a fresh decode worker.
    let (tokens, _) = remote(&*p, &*engine(), request("b2", req.prompt.clone(), 40)).await;
    assert_eq!(tokens, expected);

    // A seeded sampler with temperature picks its own stream, the same on both paths.
    let mut seeded = request("s", req.prompt.clone(), 40);
    seeded.sampling.temperature = 0.8;
    seeded.sampling.seed = Some(42);
    let (local_seeded, _, _) = collect(local.generate(seeded.clone()).await.expect("ok")).await;
    assert_ne!(local_seeded, expected);
    seeded.request_id = "s2".into();
    let (remote_seeded, _) = remote(&*p, &*engine(), seeded).await;
    assert_eq!(remote_seeded, local_seeded);

    // Different prompts give different outputs (the digest covers the whole prompt).
    let mut other = req.prompt.clone();
    other[36] = if other[36] == 3 { 4 } else { 3 };
    let (tokens, _, _) = collect(local.generate(request("c", other, 40)).await.expect("ok")).await;
    assert_ne!(tokens, expected);
}

#[tokio::test]
async fn prompts_that_share_a_prefix_in_flight_answer_as_they_would_alone() {
    // Three prompts over one 48-token prefix no step has computed, queued together: the ones
    // after the first take the prefix from the cache as it is scheduled (in the same step or
    // at admission), and their KV and tokens are what each computes alone.
    let prefix = prompt(9, 48);
    let reqs: Vec<SeqRequest> = (0..3)
        .map(|i| {
            let mut p = prefix.clone();
            p.extend(prompt(20 + i, 5));
            request(&format!("r{i}"), p, 12)
        })
        .collect();
    let mut alone = Vec::new();
    for r in &reqs {
        alone.push(
            collect(engine().generate(r.clone()).await.expect("ok"))
                .await
                .0,
        );
    }
    let e = engine();
    let mut streams = Vec::new();
    for r in &reqs {
        streams.push(e.generate(r.clone()).await.expect("ok"));
    }
    let mut cached = Vec::new();
    for (s, expected) in streams.into_iter().zip(&alone) {
        let (tokens, _, usage) = collect(s).await;
        assert_eq!(&tokens, expected);
        cached.push(usage.cached_tokens);
    }
    assert_eq!(cached, [0, 48, 48]);
}

#[tokio::test]
async fn a_replayed_request_ends_at_its_traced_length_under_a_larger_cap() {
    let (local, p, d) = (engine(), engine(), engine());
    let full = request("full", prompt(4, 37), 40);
    let (expected, _, _) = collect(local.generate(full.clone()).await.expect("ok")).await;
    for n in [1, 7] {
        let mut req = request(&format!("local-{n}"), full.prompt.clone(), 40);
        req.sampling.end_after = Some(n);
        req.sampling.ignore_eos = true;
        let (tokens, reason, usage) = collect(local.generate(req.clone()).await.expect("ok")).await;
        assert_eq!((reason, usage.completion_tokens), (FinishReason::Stop, n));
        assert_eq!(tokens, expected[..n as usize]);
        // Remote: the prefill worker writes the first token, the decode worker the rest.
        req.request_id = format!("remote-{n}");
        let (r, out) = ship(&*p, &*d, req).await;
        let (tokens, reason, _) = collect(
            d.resume(r.seq, out.first_token.into())
                .await
                .expect("resumed"),
        )
        .await;
        assert_eq!(
            (reason, tokens.as_slice()),
            (FinishReason::Stop, &expected[..n as usize])
        );
    }
}

#[tokio::test]
async fn remote_prefill_skips_blocks_the_decode_worker_holds() {
    let (local, p, d) = (engine(), engine(), engine());
    let shared = prompt(2, 48);
    // The decode worker served an earlier turn: it holds the first 3 blocks.
    collect(
        d.generate(request("turn1", shared.clone(), 4))
            .await
            .expect("ok"),
    )
    .await;
    let mut turn2 = shared.clone();
    turn2.extend(prompt(3, 20));
    let (expected, _, _) = collect(
        local
            .generate(request("l", turn2.clone(), 12))
            .await
            .expect("ok"),
    )
    .await;
    let (tokens, cached) = remote(&*p, &*d, request("turn2", turn2, 12)).await;
    assert_eq!(cached, 3);
    assert_eq!(tokens, expected);
}

#[tokio::test]
async fn corrupt_or_misplaced_kv_is_rejected_and_local_fallback_works() {
    let (local, p, d) = (engine(), engine(), engine());
    let req = request("a", prompt(4, 40), 10);
    let (expected, _, _) = collect(local.generate(req.clone()).await.expect("ok")).await;
    let out = p.prefill(req.clone(), 0).await.expect("prefilled");
    let r = d.reserve(req).await.expect("reserved");

    let mut bad = out.blocks[1].to_vec();
    bad[100] ^= 0x01;
    assert!(matches!(
        d.import(r.seq, 1, &bad),
        Err(EngineError::CorruptKv { index: 1, .. })
    ));
    assert!(
        matches!(
            d.import(r.seq, 0, &out.blocks[1]),
            Err(EngineError::CorruptKv { index: 0, .. })
        ),
        "misplaced"
    );
    let short = &out.blocks[2][..out.blocks[2].len() - 1];
    assert!(
        matches!(
            d.import(r.seq, 2, short),
            Err(EngineError::CorruptKv { .. })
        ),
        "truncated"
    );
    d.import(r.seq, 0, &out.blocks[0]).expect("intact");
    assert!(
        matches!(
            d.resume(r.seq, out.first_token.into()).await,
            Err(EngineError::InvalidRequest(_))
        ),
        "blocks missing"
    );

    // The prefill worker "failed": prefill locally; same tokens as a local request.
    let (tokens, _, _) = collect(d.resume_local(r.seq).await.expect("fallback")).await;
    assert_eq!(tokens, expected);
}

#[tokio::test]
async fn shared_prefix_hits_the_cache() {
    let e = engine();
    let (snapshot, mut events) = e.subscribe();
    assert!(snapshot.is_empty());
    let base = prompt(5, 64);
    let (_, _, u1) = collect(e.generate(request("a", base.clone(), 4)).await.expect("ok")).await;
    assert_eq!(u1.cached_tokens, 0);
    let mut second = base[..48].to_vec();
    second.extend(prompt(6, 30));
    let (_, _, u2) = collect(e.generate(request("b", second, 4)).await.expect("ok")).await;
    assert_eq!(u2.cached_tokens, 48);
    let hashes = dolphin_cluster::block_hashes(&base, 16);
    let first = events.try_recv().expect("stored event");
    assert_eq!(
        first,
        KvEvent::Stored {
            parent: None,
            hashes: hashes[..4].to_vec()
        }
    );
    // The prefill worker's cache serves repeats too.
    let out = e
        .prefill(request("c", base.clone(), 1), 0)
        .await
        .expect("prefilled");
    assert_eq!(
        out.cached_tokens, 48,
        "the last block is recomputed to sample a token"
    );
}

/// A cache salt names its blocks apart: a salted request shares cached blocks only with
/// requests of the same salt, and its events carry the salted names the router looks up.
#[tokio::test]
async fn a_cache_salt_shares_blocks_only_within_the_salt() {
    let e = engine();
    let (_, mut events) = e.subscribe();
    let base = prompt(7, 64);
    let salted = |id: &str, salt: &str| {
        let mut r = request(id, base.clone(), 4);
        r.sampling.cache_root = Some(dolphin_cluster::salted_root(salt));
        r
    };
    let cached = |r| {
        let e = &e;
        async move {
            collect(e.generate(r).await.expect("ok"))
                .await
                .2
                .cached_tokens
        }
    };
    assert_eq!(cached(request("plain", base.clone(), 4)).await, 0);
    assert_eq!(
        cached(salted("a1", "tenant-a")).await,
        0,
        "not the unsalted blocks"
    );
    assert_eq!(
        cached(salted("b1", "tenant-b")).await,
        0,
        "nor another salt's"
    );
    assert_eq!(cached(salted("a2", "tenant-a")).await, 48, "its own salt's");
    assert_eq!(cached(request("plain2", base.clone(), 4)).await, 48);
    let mut names = Vec::new();
    dolphin_cluster::block_hashes_from(
        dolphin_cluster::salted_root("tenant-a"),
        &base,
        16,
        &mut names,
    );
    let stored: Vec<KvEvent> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert!(
        stored.contains(&KvEvent::Stored {
            parent: None,
            hashes: names[..4].to_vec()
        }),
        "{stored:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn step_time_follows_the_profile() {
    let mut cfg = config("dynamo-mocker");
    cfg.time_scale = 1.0;
    cfg.max_batched_tokens = 2048;
    let profile = cfg.profile.clone();
    let e = sim_engine(cfg).expect("valid");
    let out = e
        .prefill(request("a", prompt(7, 1000), 1), 0)
        .await
        .expect("ok");
    let want = Duration::from_secs_f64(profile.prefill_ms(1000) / 1e3);
    // Tokio's timer has millisecond granularity: the paused clock lands on the next tick.
    assert!(
        out.prefill >= want && out.prefill <= want + Duration::from_millis(1),
        "{:?} vs {want:?}",
        out.prefill
    );
}

#[tokio::test(start_paused = true)]
async fn imported_kv_is_charged_the_profiles_link_whatever_bytes_moved() {
    let mut cfg = config("dynamo-mocker");
    cfg.time_scale = 1.0;
    cfg.max_batched_tokens = 2048;
    let profile = cfg.profile.clone();
    let (p, d) = (
        sim_engine(cfg.clone()).expect("valid"),
        sim_engine(cfg).expect("valid"),
    );
    let (r, out) = ship(p.as_ref(), d.as_ref(), request("a", prompt(9, 1000), 2)).await;
    // 1000 tokens x 131072 B at 100 Gb/s: 10.5 ms, though a thousandth of it was exported.
    let link = profile.transfer_time(1000 * profile.kv_bytes_per_token);
    assert!(out.blocks.iter().map(|b| b.len()).sum::<usize>() < 200_000);
    let start = Instant::now();
    let rx = d
        .resume(r.seq, out.first_token.into())
        .await
        .expect("resumed");
    let waited = start.elapsed();
    assert!(
        waited >= link && waited <= link + Duration::from_millis(1),
        "{waited:?} vs {link:?}"
    );
    collect(rx).await;
}

#[test]
fn a_mixed_step_costs_prefill_plus_decode() {
    let profile = SimProfile::builtin("dynamo-mocker").expect("shipped");
    let info = EngineInfo {
        model: "m".into(),
        engine: "sim",
        block_size: 16,
        total_blocks: 100,
        kv_bytes_per_token: 8,
        kv_layout: "test".into(),
        context_length: 4096,
        vocab_size: 99,
        eos_token_id: Some(content::EOS_TOKEN),
        step_limits: None,
    };
    let mut b = SimBackend::new(info, profile.clone(), 2.0);
    let sampling = Sampling::default();
    let (p1, p2) = (prompt(1, 16), prompt(2, 100));
    b.start(SeqStart {
        seq: 1,
        sampling: &sampling,
        prompt: &p1,
        output: &[],
        table: &[0],
        computed: 0,
        stats: false,
    })
    .expect("start");
    b.start(SeqStart {
        seq: 2,
        sampling: &sampling,
        prompt: &p2,
        output: &[],
        table: &[],
        computed: 0,
        stats: false,
    })
    .expect("start");
    let ms = |ms: f64| Duration::from_secs_f64(2.0 * ms / 1e3);

    let mut batch = Batch::default();
    batch.push(1, 0, 16, &p1, &[0, 1], true);
    batch.kv_blocks_total = 100;
    batch.kv_blocks_read = 2;
    let mut sampled = vec![None];
    let d = b.step(&batch, &mut sampled).expect("step");
    assert_eq!(
        d,
        ms(profile.prefill_ms(16)),
        "prefill only, scaled by time_scale 2"
    );
    let first = sampled[0].as_ref().expect("prompt complete: sampled").token;

    batch.clear();
    batch.push(1, 16, 16, &[first], &[0, 1], true);
    batch.push(2, 0, 100, &p2[..40], &[2, 3, 4], false);
    batch.kv_blocks_total = 100;
    batch.kv_blocks_read = 50;
    let mut sampled = vec![None; 2];
    let d = b.step(&batch, &mut sampled).expect("step");
    assert_eq!(d, ms(profile.prefill_ms(40) + profile.decode_ms(1, 0.5)));
    assert!(
        sampled[0].is_some() && sampled[1].is_none(),
        "only finished prompts and decodes sample"
    );
}

#[tokio::test(start_paused = true)]
async fn zero_time_scale_never_sleeps() {
    // The 72B profile would take seconds per request; at scale 0 the clock must not move at all.
    let e = sim_engine(config("qwen72b-h20")).expect("valid");
    let start = Instant::now();
    let mut streams = Vec::new();
    for i in 0..20 {
        streams.push(
            e.generate(request(&format!("r{i}"), prompt(i, 300), 30))
                .await
                .expect("ok"),
        );
    }
    for rx in streams {
        assert_eq!(collect(rx).await.0.len(), 30);
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[test]
fn runs_without_a_runtime_of_its_own() {
    // Built outside any runtime: the scheduler gets a thread; any runtime can drive requests.
    let e = sim_engine(config("dynamo-mocker")).expect("valid");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let (tokens, reason, _) = rt.block_on(async {
        collect(
            e.generate(request("a", prompt(10, 20), 5))
                .await
                .expect("ok"),
        )
        .await
    });
    assert_eq!((tokens.len(), reason), (5, FinishReason::Length));
}

#[tokio::test]
async fn eos_profile_stops_early_and_config_is_checked() {
    let mut cfg = config("dynamo-mocker");
    cfg.profile.eos_probability = 0.5;
    let e = sim_engine(cfg).expect("valid");
    let (tokens, reason, _) = collect(
        e.generate(request("a", prompt(11, 20), 200))
            .await
            .expect("ok"),
    )
    .await;
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(tokens.last(), Some(&content::EOS_TOKEN));

    let mut bad = config("dynamo-mocker");
    bad.time_scale = -1.0;
    assert!(matches!(sim_engine(bad), Err(EngineError::Config(_))));
    let mut bad = config("dynamo-mocker");
    bad.block_size = 0;
    assert!(matches!(sim_engine(bad), Err(EngineError::Config(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_under_kv_pressure_stay_consistent() {
    // Small pools: requests queue for KV on every engine while others run.
    let make = || {
        let mut cfg = config("dynamo-mocker");
        cfg.total_blocks = 24;
        sim_engine(cfg).expect("valid")
    };
    let (local, p, d) = (make(), make(), make());
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        let (local, p, d) = (local.clone(), p.clone(), d.clone());
        tasks.push(tokio::spawn(async move {
            // Half the prompts share a 32-token prefix.
            let mut tokens = if i % 2 == 0 {
                prompt(100, 32)
            } else {
                Vec::new()
            };
            tokens.extend(prompt(i, 40 + i));
            let req = request(&format!("q{i}"), tokens, 20 + i);
            let rx = local.generate(req.clone()).await.expect("local");
            let (expected, _, _) = collect(rx).await;
            let (got, _) = remote(&*p, &*d, req).await;
            assert_eq!(got, expected, "request {i}");
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    for e in [&local, &p, &d] {
        let load = e.load();
        assert_eq!((load.running, load.waiting, load.free_blocks), (0, 0, 24));
    }
}

#[tokio::test]
async fn a_request_continued_from_its_streamed_tokens_writes_the_same_tokens() {
    // What a migration does: another engine gets the prompt plus the tokens already streamed
    // and writes the rest; greedy and seeded output equal the uninterrupted run.
    let (first, second) = (engine(), engine());
    let p = prompt(11, 37);
    for seed in [None, Some(42)] {
        let mut whole = request("whole", p.clone(), 40);
        whole.sampling.seed = seed;
        whole.sampling.temperature = if seed.is_some() { 0.8 } else { 0.0 };
        let (expected, _, _) = collect(first.generate(whole.clone()).await.expect("ok")).await;
        assert_eq!(expected.len(), 40);
        for cut in [1, 11, 27] {
            let mut rest = whole.clone();
            rest.request_id = format!("rest-{cut}");
            rest.prompt.extend_from_slice(&expected[..cut]);
            rest.sampling.max_tokens = 40 - cut as u32;
            let (tokens, _, _) = collect(second.generate(rest).await.expect("ok")).await;
            assert_eq!(tokens, expected[cut..], "seed {seed:?}, cut after {cut}");
        }
    }
}

#[test]
fn a_step_reads_each_sequences_context_whatever_it_shares() {
    let mut batch = Batch::default();
    // Two sequences decoding at position 2000 over the same cached prefix, and a first chunk.
    batch.push(1, 2000, 1990, &[5], &[], true);
    batch.push(2, 2000, 1990, &[6], &[], true);
    batch.push(3, 0, 100, &[7; 40], &[], false);
    assert_eq!(batch.context_blocks(16), 2 * 126 + 3);
}

/// Log probabilities where asked, locally and through a remote prefill (the prefill engine's
/// first token carries its own): a sim token has probability 1, so logprob 0 and itself as
/// the only alternative.
#[tokio::test]
async fn logprobs_where_asked_on_both_paths() {
    let scored = |id: &str, k: Option<u32>| {
        let mut r = request(id, prompt(9, 40), 4);
        r.sampling.logprobs = k;
        r
    };
    let e = engine();
    let mut rx = e
        .generate(scored("local", Some(3)))
        .await
        .expect("generate");
    let mut seen = 0;
    while let Some(out) = rx.recv().await {
        match out {
            SeqOutput::Token(t) => {
                let lp = t.logprobs.expect("asked for");
                assert_eq!(lp.logprob, 0.0);
                assert_eq!(lp.top, vec![(t.id, 0.0)]);
                seen += 1;
            }
            SeqOutput::Finished { .. } => break,
            SeqOutput::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(seen, 4);
    let mut rx = e.generate(scored("plain", None)).await.expect("generate");
    while let Some(SeqOutput::Token(t)) = rx.recv().await {
        assert!(t.logprobs.is_none());
    }

    let (p, d) = (engine(), engine());
    let (r, out) = ship(&*p, &*d, scored("remote", Some(0))).await;
    let first = out
        .first_logprobs
        .clone()
        .expect("the prefill's first token has them");
    assert!(first.top.is_empty(), "zero alternatives asked: {first:?}");
    let first = Generated {
        id: out.first_token,
        logprobs: out.first_logprobs,
        prompt_logprobs: Vec::new(),
    };
    let mut rx = d.resume(r.seq, first).await.expect("resumed");
    let Some(SeqOutput::Token(t)) = rx.recv().await else {
        panic!("no first token");
    };
    assert_eq!(t.id, out.first_token);
    assert_eq!(t.logprobs.map(|l| l.logprob), Some(0.0));
}

/// A request for the prompt's log probabilities computes its whole prompt: the prefix cache
/// serves it nothing, neither at admission nor when its first chunk is scheduled.
#[tokio::test]
async fn prompt_logprobs_bypass_the_prefix_cache() {
    let e = engine();
    let p = prompt(11, 200);
    let (_, _, first) = collect(e.generate(request("a", p.clone(), 2)).await.expect("a")).await;
    assert_eq!(first.cached_tokens, 0);
    let mut scored = request("b", p.clone(), 2);
    scored.sampling.prompt_logprobs = Some(0);
    let (_, _, usage) = collect(e.generate(scored).await.expect("b")).await;
    assert_eq!(usage.cached_tokens, 0, "{usage:?}");
    let (_, _, again) = collect(e.generate(request("c", p.clone(), 2)).await.expect("c")).await;
    assert!(again.cached_tokens > 0, "{again:?}");
    // Nor where the prompt's KV leaves (a prefill) or comes from elsewhere (a reservation).
    let mut scored = request("d", p, 2);
    scored.sampling.prompt_logprobs = Some(0);
    let refused = |r: Result<_, EngineError>| matches!(r, Err(EngineError::InvalidRequest(_)));
    assert!(refused(e.prefill(scored.clone(), 0).await.map(|_| ())));
    assert!(refused(e.reserve(scored).await.map(|_| ())));
}

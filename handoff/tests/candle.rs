//! Model groups over SmolLM2-135M and an early-exit copy of it (its first layers, then the final
//! norm and head): skipped with a notice when the model file is absent, unless
//! `DOLPHIN_REQUIRE_MODEL` is set.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{Recording, Scripted, collect};
use dolphin_engine::candle::{CandleConfig, candle_scheduler};
use dolphin_engine::{Engine, LogitRules, SeqRequest};
use dolphin_handoff::algorithms::{AlwaysLarge, AlwaysSmall, EntropyGate};
use dolphin_handoff::{AlgorithmSpec, GroupOptions, HandoffAlgorithm, ModelGroup, Subserver};
use dolphin_tokenizer::{SMOLLM2_FILE, model_or_skip};

/// Layers of the small model in these tests.
const SMALL_LAYERS: u32 = 12;

fn model() -> Option<PathBuf> {
    model_or_skip(SMOLLM2_FILE)
}

fn engine(path: &PathBuf, layers: Option<u32>) -> Arc<dyn Engine> {
    let mut cfg = CandleConfig::new(path);
    cfg.layers = layers;
    cfg.kv_bytes = 64 << 20;
    cfg.threads = Some(1);
    candle_scheduler(cfg).expect("candle engine")
}

fn pair(path: &PathBuf) -> Arc<ModelGroup> {
    pair_with(path, GroupOptions::default())
}

fn pair_with(path: &PathBuf, options: GroupOptions) -> Arc<ModelGroup> {
    ModelGroup::with_options(
        "smollm2-duo",
        Subserver::small_large(engine(path, Some(SMALL_LAYERS)), engine(path, None)),
        "entropy".parse::<AlgorithmSpec>().expect("spec"),
        options,
    )
    .expect("group")
}

/// "The capital of France is" and friends, as SmolLM2 token ids (no chat template: raw text).
fn prompt(path: &PathBuf, text: &str) -> Vec<u32> {
    let tok = dolphin_tokenizer::ModelTokenizer::from_file(path).expect("tokenizer");
    tok.encode(text).expect("encodes")
}

fn request(id: &str, prompt: &[u32], max_tokens: u32) -> SeqRequest {
    let mut req = SeqRequest {
        request_id: id.into(),
        prompt: prompt.to_vec(),
        sampling: Default::default(),
    };
    req.sampling.max_tokens = max_tokens;
    req.sampling.ignore_eos = true;
    req
}

async fn alone(engine: &Arc<dyn Engine>, id: &str, prompt: &[u32], n: u32) -> Vec<u32> {
    alone_with(engine, request(id, prompt, n)).await
}

/// The tokens `engine` alone generates for `req`.
async fn alone_with(engine: &Arc<dyn Engine>, req: SeqRequest) -> Vec<u32> {
    let id = req.request_id.clone();
    collect(engine.generate(req).await.expect(&id))
        .await
        .expect(&id)
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_algorithms_equal_each_models_greedy_output() {
    let Some(path) = model() else { return };
    let g = pair(&path);
    let p = prompt(&path, "The capital of France is");
    let small = alone(&g.subservers()[0].engine, "s", &p, 20).await;
    let large = alone(&g.subservers()[1].engine, "l", &p, 20).await;
    assert_ne!(small, large, "the early exit is a different model");
    let run = |alg: Box<dyn HandoffAlgorithm>, id: &'static str| {
        let g = g.clone();
        let p = p.clone();
        async move {
            collect(g.generate_with(request(id, &p, 20), alg).await.expect(id))
                .await
                .expect(id)
        }
    };
    let (tokens, usage) = run(Box::new(AlwaysSmall), "as").await;
    assert_eq!(
        tokens, small,
        "always-small is the small model, token for token"
    );
    assert_eq!((usage.by_model[0].tokens, usage.handoffs), (20, 0));
    let (tokens, usage) = run(Box::new(AlwaysLarge), "al").await;
    assert_eq!(
        tokens, large,
        "always-large is the large model, token for token"
    );
    assert_eq!((usage.by_model[1].tokens, usage.handoffs), (20, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_runs_replay_their_handoff_decisions() {
    let Some(path) = model() else { return };
    let g = pair(&path);
    let p = prompt(&path, "Here is a short story about a dolphin who");
    let run = |id: &'static str| {
        let g = g.clone();
        let p = p.clone();
        async move {
            let (rec, writers) = Recording::new(Box::new(EntropyGate::new(1.0, 3, 0.2)));
            let out = collect(
                g.generate_with(request(id, &p, 24), Box::new(rec))
                    .await
                    .expect(id),
            )
            .await
            .expect(id);
            (out, writers.lock().clone())
        }
    };
    let ((tokens, usage), writers) = run("m1").await;
    let ((tokens2, _), writers2) = run("m2").await;
    assert_eq!(tokens, tokens2, "deterministic");
    assert_eq!(writers, writers2, "same decisions");
    assert!(
        usage.handoffs > 0,
        "the gate fires on this prompt: {usage:?}"
    );
    // The reference: each token recomputed alone by the model that wrote it, from the same
    // prefix (a fresh request per position: prefill, one greedy token).
    let mut seq = p.clone();
    for (i, (&t, &m)) in tokens.iter().zip(&writers).enumerate() {
        let e = &g.subservers()[m].engine;
        let want = alone(e, &format!("ref{i}"), &seq, 1).await;
        assert_eq!(want, vec![t], "position {i}, written by model {m}");
        seq.push(t);
    }
}

/// A repetition penalty reads the whole text so far, whichever model wrote it: a mixed run
/// with one equals each token recomputed alone, by the model that wrote it, over the same text
/// as its prompt (where the penalty reads the same tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_runs_apply_the_repetition_penalty_to_both_models_tokens() {
    let Some(path) = model() else { return };
    let g = pair(&path);
    let p = prompt(&path, "Here is a short story about a dolphin who");
    let rules = LogitRules {
        repetition_penalty: Some(1.5),
        ..LogitRules::default()
    };
    let with_rules = |id: &str, prompt: &[u32], n: u32| {
        let mut req = request(id, prompt, n);
        req.sampling.logits = rules.clone();
        req
    };
    let (rec, writers) = Recording::new(Box::new(EntropyGate::new(1.0, 3, 0.2)));
    let (tokens, usage) = collect(
        g.generate_with(with_rules("pen", &p, 24), Box::new(rec))
            .await
            .expect("pen"),
    )
    .await
    .expect("pen");
    let writers = writers.lock().clone();
    assert!(usage.handoffs > 0, "the gate fires: {usage:?}");
    assert!(writers.contains(&0) && writers.contains(&1), "{writers:?}");
    let plain = alone(&g.subservers()[1].engine, "plain", &p, 24).await;
    assert_ne!(tokens, plain, "the penalty changes the text");
    let mut seq = p.clone();
    for (i, (&t, &m)) in tokens.iter().zip(&writers).enumerate() {
        let e = &g.subservers()[m].engine;
        let want = alone_with(e, with_rules(&format!("r{i}"), &seq, 1)).await;
        assert_eq!(want, vec![t], "position {i}, written by model {m}");
        seq.push(t);
    }
}

/// A format reads the whole output, whichever model wrote it: a mixed run follows it to its
/// end, the models handing the text back and forth inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_runs_follow_a_format_across_handoffs() {
    let Some(path) = model() else { return };
    let g = pair(&path);
    let p = prompt(&path, "Here is a short story about a dolphin who");
    let mut req = request("fmt", &p, 48);
    req.sampling.ignore_eos = false;
    req.sampling.format = Some(dolphin_engine::Format::Regex(
        " [a-z]+( [a-z]+){7,15}\\.".into(),
    ));
    // Small, large from the second token for two, small, large again from the sixth.
    let (rec, writers) = Recording::new(Box::new(Scripted {
        to_large: vec![1, 5],
        span: 2,
    }));
    let (tokens, usage) = collect(g.generate_with(req, Box::new(rec)).await.expect("fmt"))
        .await
        .expect("fmt");
    let writers = writers.lock().clone();
    assert!(usage.handoffs > 0, "the gate fires: {usage:?}");
    assert!(writers.contains(&0) && writers.contains(&1), "{writers:?}");
    let tok = dolphin_tokenizer::ModelTokenizer::from_file(&path).expect("tokenizer");
    let (end, text) = tokens.split_last().expect("tokens");
    assert!(tok.stop_token_ids().contains(end), "ends: {tokens:?}");
    let text = tok.decode(text);
    let words: Vec<&str> = text
        .strip_prefix(' ')
        .and_then(|t| t.strip_suffix('.'))
        .expect("the pattern's ends")
        .split(' ')
        .collect();
    assert!(
        (8..=16).contains(&words.len())
            && words
                .iter()
                .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase())),
        "{text:?}"
    );
}

/// The tokens of `rx`, with their log probabilities.
async fn scored(mut rx: dolphin_engine::OutputStream) -> Vec<dolphin_engine::Generated> {
    let mut out = Vec::new();
    while let Some(item) = rx.recv().await {
        match item {
            dolphin_engine::SeqOutput::Token(t) => out.push(t),
            dolphin_engine::SeqOutput::Finished { .. } => return out,
            dolphin_engine::SeqOutput::Error(e) => panic!("{e}"),
        }
    }
    panic!("stream ended without Finished");
}

/// Each token's log probabilities are its writer's: a mixed run's values equal each token
/// recomputed alone, by the model that wrote it, over the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_runs_report_each_writers_log_probabilities() {
    let Some(path) = model() else { return };
    let g = pair(&path);
    let p = prompt(&path, "Here is a short story about a dolphin who");
    let asking = |id: &str, prompt: &[u32], n: u32| {
        let mut req = request(id, prompt, n);
        req.sampling.logprobs = Some(2);
        req
    };
    let (rec, writers) = Recording::new(Box::new(EntropyGate::new(1.0, 3, 0.2)));
    let out = scored(
        g.generate_with(asking("lp", &p, 16), Box::new(rec))
            .await
            .expect("lp"),
    )
    .await;
    let writers = writers.lock().clone();
    assert!(writers.contains(&0) && writers.contains(&1), "{writers:?}");
    let mut seq = p.clone();
    for (i, (t, &m)) in out.iter().zip(&writers).enumerate() {
        let got = t.logprobs.as_deref().expect("every token has them");
        let e = &g.subservers()[m].engine;
        let rx = e
            .generate(asking(&format!("r{i}"), &seq, 1))
            .await
            .expect("ref");
        let want = scored(rx).await.remove(0);
        let want = want.logprobs.as_deref().expect("asked for");
        assert_eq!(want.top.len(), 2);
        assert!(
            (got.logprob - want.logprob).abs() < 1e-4 && got.top.len() == 2,
            "position {i}, written by model {m}: {got:?} against {want:?}"
        );
        assert_eq!(got.top[0].0, want.top[0].0, "position {i}");
        seq.push(t.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_caches_hold_the_sequence_after_handoffs() {
    let Some(path) = model() else { return };
    // Lazy (the suffix moves at handoffs) and with background sync (paused models kept two
    // tokens behind): the same tokens, and caches equal to a fresh prefill.
    let mut outputs = Vec::new();
    for sync_tokens in [0, 2] {
        outputs.push(caches_hold_the_sequence(&path, GroupOptions { sync_tokens }).await);
    }
    assert_eq!(outputs[0], outputs[1], "background sync changes no token");
}

async fn caches_hold_the_sequence(path: &Path, options: GroupOptions) -> Vec<u32> {
    let path = path.to_path_buf();
    let g = pair_with(&path, options);
    let p = prompt(&path, "List three colors of the rainbow: red, orange,");
    let alg = Scripted {
        to_large: vec![2, 7, 15],
        span: 3,
    };
    let (tokens, usage) = collect(
        g.generate_with(request("k", &p, 40), Box::new(alg))
            .await
            .expect("k"),
    )
    .await
    .expect("k");
    assert_eq!(usage.handoffs, 6, "{usage:?}");
    let mut full = p.clone();
    full.extend(&tokens);
    for (i, s) in g.subservers().iter().enumerate() {
        let fresh = engine(&path, (i == 0).then_some(SMALL_LAYERS));
        let want = fresh
            .prefill(request("f", &full, 1), 0)
            .await
            .expect("fresh");
        let got = s
            .engine
            .prefill(request("c", &full, 1), 0)
            .await
            .expect("cached");
        // The blocks the request filled while it ran are served from the cache; each subserver
        // saw the sequence up to its last span (the large one stops where it handed back).
        assert!(
            got.cached_tokens >= 16,
            "{}: {} cached",
            s.name,
            got.cached_tokens
        );
        assert_eq!(got.blocks.len(), want.blocks.len());
        let cached = (got.cached_tokens / 16) as usize;
        for (b, (x, y)) in got.blocks.iter().zip(&want.blocks).take(cached).enumerate() {
            let close = x.len() == y.len()
                && x.chunks_exact(4).zip(y.chunks_exact(4)).all(|(a, b)| {
                    let a = f32::from_le_bytes(a.try_into().expect("4 bytes"));
                    let b = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                    (a - b).abs() <= 1e-3 * (1.0 + b.abs())
                });
            assert!(close, "{}: block {b} differs from a fresh prefill", s.name);
        }
    }
    tokens
}

//! The candle engine through the scheduler: local and remote (prefill, export, import, resume)
//! paths agree token for token, batching and prefix caching change nothing, stops and errors.

use std::sync::Arc;

use super::tiny::{TinyModel, TinySpec, tokens};
use crate::candle::{CandleBackend, CandleConfig, Padding, candle_scheduler};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::scheduler::Scheduler;
use crate::types::{FinishReason, OutputStream, Sampling, SeqOutput, SeqRequest};

fn config(m: &TinyModel, blocks: u64, max_batched_tokens: u32) -> CandleConfig {
    let mut cfg = CandleConfig::new(&m.path);
    let s = m.spec;
    let per_token = (s.n_layer * 2 * s.n_head_kv * (s.hidden / s.n_head) * 4) as u64;
    cfg.kv_bytes = blocks * per_token * u64::from(cfg.block_size);
    cfg.padding = Padding::On;
    cfg.max_batched_tokens = max_batched_tokens;
    cfg
}

fn engine(m: &TinyModel, max_batched_tokens: u32) -> Arc<Scheduler<CandleBackend>> {
    candle_scheduler(config(m, 64, max_batched_tokens)).expect("engine")
}

fn request(id: &str, prompt: Vec<u32>, sampling: Sampling) -> SeqRequest {
    SeqRequest {
        request_id: id.into(),
        prompt,
        sampling,
    }
}

fn greedy(max_tokens: u32) -> Sampling {
    Sampling {
        max_tokens,
        ignore_eos: true,
        ..Sampling::default()
    }
}

pub(super) async fn collect(mut out: OutputStream) -> (Vec<u32>, FinishReason, u32) {
    let mut toks = Vec::new();
    while let Some(ev) = out.recv().await {
        match ev {
            SeqOutput::Token(t) => toks.push(t.id),
            SeqOutput::Finished { reason, usage } => return (toks, reason, usage.cached_tokens),
            SeqOutput::Error(e) => panic!("stream failed: {e}"),
        }
    }
    panic!("stream ended without Finished");
}

/// Prefill on `pre`, ship the blocks to `dec`, resume there.
pub(super) async fn remote(pre: &dyn Engine, dec: &dyn Engine, req: SeqRequest) -> Vec<u32> {
    let r = dec.reserve(req.clone()).await.expect("reserve");
    let out = pre.prefill(req, r.cached_blocks).await.expect("prefill");
    assert_eq!(out.blocks.len() as u32, r.blocks_expected);
    for (i, b) in out.blocks.iter().enumerate() {
        dec.import(r.seq, i as u32, b).expect("import");
    }
    collect(
        dec.resume(r.seq, out.first_token.into())
            .await
            .expect("resume"),
    )
    .await
    .0
}

#[tokio::test]
async fn remote_prefill_equals_local_generation() {
    let m = TinyModel::new(TinySpec::default());
    let (pre, dec, local) = (engine(&m, 64), engine(&m, 64), engine(&m, 64));
    let info = local.info();
    assert_eq!(info.engine, "candle");
    assert_eq!(info.kv_bytes_per_token, 2 * 2 * 32 * 4);
    assert_eq!(info.vocab_size, 101);
    assert_eq!(info.eos_token_id, Some(1));
    assert_eq!(info.total_blocks, 64);
    let prompt = tokens(37, 101, 21, 1);
    let seeded = Sampling {
        temperature: 0.9,
        top_k: std::num::NonZeroU32::new(20),
        top_p: Some(0.95),
        seed: Some(5),
        ..greedy(12)
    };
    for (i, sampling) in [greedy(12), seeded].into_iter().enumerate() {
        let req = request(&format!("r{i}"), prompt.clone(), sampling);
        let want = collect(local.generate(req.clone()).await.expect("generate")).await;
        assert_eq!(want.0.len(), 12);
        assert_eq!(want.1, FinishReason::Length);
        assert_eq!(remote(&*pre, &*dec, req).await, want.0, "sampling {i}");
    }
}

#[tokio::test]
async fn batched_and_chunked_requests_equal_requests_alone() {
    let m = TinyModel::new(TinySpec::default());
    // 8 tokens per step: prompts are chunked and mixed with other sequences' decodes.
    let busy = engine(&m, 8);
    let alone = engine(&m, 512);
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| tokens(10 + 9 * i, 101, 30 + i as u64, 1))
        .collect();
    let mut streams = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        streams.push(
            busy.generate(request(&format!("b{i}"), p.clone(), greedy(10)))
                .await
                .expect("generate"),
        );
    }
    let mut batched = Vec::new();
    for s in streams {
        batched.push(collect(s).await.0);
    }
    for (i, p) in prompts.iter().enumerate() {
        let want = collect(
            alone
                .generate(request(&format!("a{i}"), p.clone(), greedy(10)))
                .await
                .expect("generate"),
        )
        .await;
        assert_eq!(batched[i], want.0, "prompt {i}");
    }
}

#[tokio::test]
async fn a_prefix_cache_hit_gives_the_same_tokens() {
    let m = TinyModel::new(TinySpec::default());
    let (warm, cold) = (engine(&m, 64), engine(&m, 64));
    let long = tokens(56, 101, 40, 1);
    collect(
        warm.generate(request("p", long[..40].to_vec(), greedy(4)))
            .await
            .expect("generate"),
    )
    .await;
    let hit = collect(
        warm.generate(request("q", long.clone(), greedy(8)))
            .await
            .expect("generate"),
    )
    .await;
    assert_eq!(hit.2, 32, "two full blocks of the first prompt are reused");
    let fresh = collect(
        cold.generate(request("q", long, greedy(8)))
            .await
            .expect("generate"),
    )
    .await;
    assert_eq!(fresh.2, 0);
    assert_eq!(hit.0, fresh.0);
}

#[tokio::test]
async fn prompts_sharing_a_prefix_in_flight_give_the_tokens_they_give_alone() {
    // Three prompts over one 48-token prefix nothing has computed, queued at once: the later
    // ones take the prefix from the cache as the first's step schedules it (vLLM's way; the
    // model writes every row's KV before attention reads), and answer as they do alone.
    let m = TinyModel::new(TinySpec::default());
    let (shared, alone) = (engine(&m, 512), engine(&m, 512));
    let prefix = tokens(48, 101, 60, 1);
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            let mut p = prefix.clone();
            p.extend(tokens(5, 101, 70 + i, 1));
            p
        })
        .collect();
    let mut streams = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let req = request(&format!("s{i}"), p.clone(), greedy(8));
        streams.push(shared.generate(req).await.expect("generate"));
    }
    let mut cached = Vec::new();
    for (i, s) in streams.into_iter().enumerate() {
        let (got, _, hit) = collect(s).await;
        cached.push(hit);
        let req = request(&format!("a{i}"), prompts[i].clone(), greedy(8));
        let want = collect(alone.generate(req).await.expect("generate")).await;
        assert_eq!(got, want.0, "prompt {i}");
    }
    assert_eq!(cached, [0, 48, 48]);
}

#[tokio::test]
async fn stop_tokens_and_corrupt_imports() {
    let m = TinyModel::new(TinySpec::default());
    let e = engine(&m, 64);
    let prompt = tokens(20, 101, 50, 1);
    let (toks, reason, _) = collect(
        e.generate(request("a", prompt.clone(), greedy(10)))
            .await
            .expect("generate"),
    )
    .await;
    assert_eq!((toks.len(), reason), (10, FinishReason::Length));
    let stop = Sampling {
        stop_token_ids: vec![toks[3]],
        ..greedy(10)
    };
    let first = toks.iter().position(|&t| t == toks[3]).unwrap_or(3);
    let (stopped, reason, _) = collect(
        e.generate(request("b", prompt.clone(), stop))
            .await
            .expect("generate"),
    )
    .await;
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(stopped, toks[..=first]);

    let r = e
        .reserve(request("c", prompt, greedy(4)))
        .await
        .expect("reserve");
    let err = e.import(r.seq, 0, &[0u8; 12]).expect_err("wrong size");
    assert!(matches!(err, EngineError::CorruptKv { .. }), "{err}");
    e.cancel("c");
}

#[test]
fn bad_configurations_are_config_errors() {
    let m = TinyModel::new(TinySpec::default());
    let small = config(&m, 0, 64);
    assert!(matches!(
        candle_scheduler(small),
        Err(EngineError::Config(_))
    ));
    let missing = CandleConfig::new("/nonexistent/model.gguf");
    let err = candle_scheduler(missing).expect_err("missing file");
    assert!(
        err.to_string().contains("model.gguf") || matches!(err, EngineError::Config(_)),
        "{err}"
    );
    assert!(matches!(
        crate::candle::configure_threads(Some(0)),
        Err(EngineError::Config(_))
    ));
    let mut q4k = config(&m, 8, 64);
    q4k.weights = crate::candle::WeightFormat::Q4K;
    q4k.padding = Padding::Off;
    assert!(matches!(candle_scheduler(q4k), Err(EngineError::Config(_))));
}

//! SmolLM2-135M-Instruct end to end on the engine (skipped with a notice when the model file is
//! absent, unless `DOLPHIN_REQUIRE_MODEL` is set: then its absence fails).

use std::path::PathBuf;

use dolphin_tokenizer::{ChatMessage, ModelTokenizer, SMOLLM2_FILE, model_or_skip};

use super::engine_tests::{collect, remote};
use crate::candle::{CandleConfig, WeightFormat, candle_scheduler};
use crate::engine::Engine;
use crate::types::{Sampling, SeqRequest};

fn model() -> Option<PathBuf> {
    model_or_skip(SMOLLM2_FILE)
}

fn chat(tok: &ModelTokenizer, user: &str) -> Vec<u32> {
    let text = tok
        .render_chat(&[ChatMessage {
            role: "user".into(),
            content: user.into(),
        }])
        .expect("chat template");
    tok.encode(&text).expect("encodes")
}

fn request(id: &str, prompt: Vec<u32>, max_tokens: u32, stops: &[u32]) -> SeqRequest {
    SeqRequest {
        request_id: id.into(),
        prompt,
        sampling: Sampling {
            max_tokens,
            stop_token_ids: stops.to_vec(),
            ..Sampling::default()
        },
    }
}

#[tokio::test]
async fn smollm2_answers_remote_equals_local_and_long_prompts_work() {
    let Some(path) = model() else { return };
    let tok = ModelTokenizer::from_file(&path).expect("tokenizer");
    let cfg = CandleConfig::new(&path);
    let (pre, dec, local) = (
        candle_scheduler(cfg.clone()).expect("engine"),
        candle_scheduler(cfg.clone()).expect("engine"),
        candle_scheduler(cfg).expect("engine"),
    );
    assert_eq!(local.info().kv_bytes_per_token, 46_080);
    assert_eq!(local.info().eos_token_id, Some(2));
    let stops = tok.stop_token_ids().to_vec();

    let question = chat(&tok, "What is the capital of France?");
    let req = request("capital", question, 24, &stops);
    let (answer, _, _) = collect(local.generate(req.clone()).await.expect("generate")).await;
    let text = tok.decode(&answer);
    eprintln!("answer (Q8_0): {text:?}");
    assert_eq!(
        remote(&*pre, &*dec, req.clone()).await,
        answer,
        "remote: {text:?}"
    );
    // The answer's quality at full precision: re-quantized to Q8_0, the 135M model's greedy
    // answer depends on the CPU's kernels (right on AVX-512 VNNI, a list of Paris landmarks on
    // AVX2), so correctness is checked where it is a property of the model alone.
    let mut f32_cfg = CandleConfig::new(&path);
    f32_cfg.weights = WeightFormat::F32;
    let full = candle_scheduler(f32_cfg).expect("f32 engine");
    let (answer, _, _) = collect(full.generate(req).await.expect("generate")).await;
    let text = tok.decode(&answer);
    assert!(text.contains("Paris"), "answer (f32): {text:?}");

    let facts: String = (1..=40)
        .map(|i| format!("Fact {i}: the number {i} squared is {}. ", i * i))
        .collect();
    let long = chat(&tok, &format!("{facts}\nWhat is the number 7 squared?"));
    assert!(long.len() > 512, "{} tokens", long.len());
    let req = request("long", long, 16, &stops);
    let (local_long, _, _) = collect(local.generate(req.clone()).await.expect("generate")).await;
    assert!(!local_long.is_empty());
    assert_eq!(remote(&*pre, &*dec, req).await, local_long);
    eprintln!("long prompt answer: {:?}", tok.decode(&local_long));
}

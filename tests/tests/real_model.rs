//! SmolLM2-135M-Instruct through the real processes: a prefill worker, a decode worker and the
//! router, all on the candle engine with the model's own tokenizer.
//!
//! - Disaggregation is lossless: for several prompts (a chat question, a raw code completion,
//!   one over 512 tokens, and one whose long prefix the decode worker already holds), greedy
//!   output with remote prefill equals output with local prefill equals a single-process
//!   reference (`candle_engine` in this test process), token for token.
//! - So are the logit rules (a logit bias, repetition, presence and frequency penalties and a
//!   minimum length), which read the prompt on the prefill worker and the output so far on the
//!   decode worker.
//! - So are log probabilities: the first token's computed on the prefill worker (carried in
//!   the KV transfer's end frame), the rest on the decode worker, each equal to the
//!   reference's; over HTTP in chat's shape, with each token's text; and with `echo` the
//!   prompt's, computed whole on the decode worker although its prefix cache holds most of it.
//! - `/v1/chat/completions` answers a simple question sensibly.
//!
//! Skipped with a notice when the model file is absent (run `scripts/fetch-model.sh`), unless
//! `DOLPHIN_REQUIRE_MODEL` is set: then its absence fails. Every process runs one compute
//! thread (the machine has two shared cores) and outputs stay short.

use std::path::{Path, PathBuf};

use anyhow::Context;
use dolphin_engine::candle::{CandleConfig, candle_engine};
use dolphin_engine::{Engine, LogitRules, Sampling, SeqOutput, SeqRequest};
use dolphin_proto::v1::generate_request::Input;
use dolphin_proto::v1::{
    self as v1, FinishReason, GenerateRequest, PrefillMode, SamplingParams, TokenIds,
};
use dolphin_tests::{ClusterConfig, TestCluster, grpc, http};
use dolphin_tokenizer::{ChatMessage, ModelTokenizer, SMOLLM2_FILE, model_or_skip};

/// The served model name every process is given.
const MODEL: &str = "smollm2";
/// The chat request's question.
const QUESTION: &str = "What is the capital of France?";
/// Greedy tokens generated per request: enough to compare paths, cheap on two cores.
const MAX_TOKENS: u32 = 12;
/// KV memory per process: room for every prompt here and their cached prefixes.
const KV_BYTES: &str = "128MiB";
/// Tokens per engine step in the workers. Small, so a debug build's steps stay short, and it
/// makes the workers chunk prompts differently from the reference, which must not change a
/// token.
const STEP_TOKENS: &str = "64";
/// Alternatives asked for with log probabilities.
const LOGPROBS: u32 = 3;

/// The model file, or `None` (test skipped) when it is absent and not required.
fn model_path() -> Option<PathBuf> {
    model_or_skip(SMOLLM2_FILE)
}

fn chat_tokens(tok: &ModelTokenizer, user: &str) -> anyhow::Result<Vec<u32>> {
    let text = tok.render_chat(&[ChatMessage::new("user", user)])?;
    Ok(tok.encode(&text)?)
}

/// Forty numbered facts: a prompt body of several hundred tokens.
fn facts() -> String {
    (1..=40)
        .map(|i| format!("Fact {i}: the number {i} squared is {}. ", i * i))
        .collect()
}

/// The prompts compared, in the order they are sent (the order sets up the cache reuse).
fn prompts(tok: &ModelTokenizer) -> anyhow::Result<Vec<(&'static str, Vec<u32>)>> {
    let long = chat_tokens(tok, &format!("{}\nWhat is the number 7 squared?", facts()))?;
    anyhow::ensure!(
        long.len() > 512,
        "long prompt has only {} tokens",
        long.len()
    );
    // Same long prefix, another question: sent after `long`, so the decode worker holds most
    // of its KV already and only the tail crosses the wire.
    let shared = chat_tokens(tok, &format!("{}\nWhat is the number 12 squared?", facts()))?;
    Ok(vec![
        (
            "capital",
            chat_tokens(tok, "What is the capital of France?")?,
        ),
        ("code", tok.encode("def fibonacci(n):\n    ")?),
        ("long", long),
        ("shared-prefix", shared),
    ])
}

/// Greedy tokens from the in-process reference engine.
async fn reference(engine: &dyn Engine, id: &str, prompt: &[u32], stops: &[u32]) -> Vec<u32> {
    let sampling = Sampling {
        max_tokens: MAX_TOKENS,
        stop_token_ids: stops.to_vec(),
        ..Sampling::default()
    };
    reference_with(engine, id, prompt, sampling).await
}

/// The logit rules of the penalized request, with `banned` biased out of reach: the engine's
/// form, then the wire's.
fn penalized(banned: u32, stops: &[u32]) -> (Sampling, SamplingParams) {
    let engine = Sampling {
        max_tokens: MAX_TOKENS,
        stop_token_ids: stops.to_vec(),
        min_tokens: 4,
        logits: LogitRules {
            bias: vec![(banned, -100.0)],
            repetition_penalty: Some(1.3),
            presence_penalty: 0.4,
            frequency_penalty: 0.6,
            ..LogitRules::default()
        },
        ..Sampling::default()
    };
    let wire = SamplingParams {
        max_tokens: MAX_TOKENS,
        logits: Some(Box::new(v1::LogitRules {
            min_tokens: 4,
            logit_bias: [(banned, -100.0)].into_iter().collect(),
            repetition_penalty: 1.3,
            presence_penalty: 0.4,
            frequency_penalty: 0.6,
            ..v1::LogitRules::default()
        })),
        ..SamplingParams::default()
    };
    (engine, wire)
}

/// vLLM's allowed tokens and bad words on the greedy output `greedy`: its first two tokens
/// banned as a pair (the first is still drawn; the second cannot follow it), and only the
/// tokens of `allowed` (with the stops) drawable. The engine's form, then the wire's.
fn masked(greedy: &[u32], allowed: &[u32], stops: &[u32]) -> (Sampling, SamplingParams) {
    let pair = greedy[..2].to_vec();
    let mut ids: Vec<u32> = allowed.iter().chain(stops).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    let engine = Sampling {
        max_tokens: MAX_TOKENS,
        stop_token_ids: stops.to_vec(),
        logits: LogitRules {
            allowed: ids.clone(),
            bad_words: vec![pair.clone()],
            ..LogitRules::default()
        },
        ..Sampling::default()
    };
    let wire = SamplingParams {
        max_tokens: MAX_TOKENS,
        logits: Some(Box::new(v1::LogitRules {
            allowed_token_ids: ids,
            bad_words: vec![v1::TokenIds { ids: pair }],
            ..v1::LogitRules::default()
        })),
        ..SamplingParams::default()
    };
    (engine, wire)
}

/// Tokens from the in-process reference engine.
async fn reference_with(
    engine: &dyn Engine,
    id: &str,
    prompt: &[u32],
    sampling: Sampling,
) -> Vec<u32> {
    reference_scored(engine, id, prompt, sampling)
        .await
        .into_iter()
        .map(|t| t.id)
        .collect()
}

/// Tokens, with their log probabilities where `sampling` asks for them, from the in-process
/// reference engine.
async fn reference_scored(
    engine: &dyn Engine,
    id: &str,
    prompt: &[u32],
    sampling: Sampling,
) -> Vec<dolphin_engine::Generated> {
    let req = SeqRequest {
        request_id: id.to_owned(),
        prompt: prompt.to_vec(),
        sampling,
    };
    let mut out = engine.generate(req).await.expect("reference generate");
    let mut tokens = Vec::new();
    while let Some(ev) = out.recv().await {
        match ev {
            SeqOutput::Token(t) => tokens.push(t),
            SeqOutput::Finished { .. } => break,
            SeqOutput::Error(e) => panic!("reference engine failed: {e}"),
        }
    }
    tokens
}

fn token_request(prompt: &[u32], mode: PrefillMode) -> GenerateRequest {
    GenerateRequest {
        model: MODEL.to_owned(),
        input: Some(Input::TokenIds(TokenIds {
            ids: prompt.to_vec(),
        })),
        sampling: Some(SamplingParams {
            max_tokens: MAX_TOKENS,
            ..SamplingParams::default()
        }),
        force_mode: mode as i32,
        ..GenerateRequest::default()
    }
}

/// The JSON answer of a POST to the router's HTTP API, which must be 200.
async fn post_ok(
    cluster: &TestCluster,
    path: &str,
    body: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let response = http::post_json(cluster.http_addr(), path, &body.to_string()).await?;
    anyhow::ensure!(response.status == 200, "{path}: {}", response.text());
    response.json()
}

async fn start_cluster(path: &Path) -> anyhow::Result<TestCluster> {
    let path = path.display().to_string();
    TestCluster::start(ClusterConfig {
        engine_args: Some(ClusterConfig::candle_engine(
            &path,
            KV_BYTES,
            &["--max-batched-tokens", STEP_TOKENS],
        )),
        model: MODEL.to_owned(),
        // Remote prefills must not fall back because a debug build is slow: the test checks
        // that the remote path itself is lossless.
        decode_args: vec!["--prefill-timeout-ms".to_owned(), "600000".to_owned()],
        router_args: ["--tokenizer", "gguf", "--model-path", &path]
            .map(str::to_owned)
            .to_vec(),
        ..ClusterConfig::default()
    })
    .await
}

#[tokio::test]
async fn smollm2_remote_equals_local_equals_single_process_and_chat_answers() -> anyhow::Result<()>
{
    let Some(path) = model_path() else {
        return Ok(());
    };
    let tok = ModelTokenizer::from_file(&path)?;
    let stops = tok.stop_token_ids().to_vec();
    let prompts = prompts(&tok)?;

    // The single-process reference first, then dropped: the cluster gets the cores.
    let mut expected = Vec::new();
    let chat_expected;
    let penalized_expected;
    let masked_expected;
    let scored_expected;
    let prompt_expected;
    {
        let mut cfg = CandleConfig::new(&path);
        cfg.threads = Some(1);
        cfg.kv_bytes = 128 << 20;
        let engine = candle_engine(cfg).context("reference engine")?;
        for (name, prompt) in &prompts {
            let tokens = reference(&*engine, name, prompt, &stops).await;
            assert!(!tokens.is_empty(), "{name}: no reference output");
            eprintln!("reference {name}: {:?}", tok.decode(&tokens));
            expected.push(tokens);
        }
        chat_expected = reference(&*engine, "chat", &chat_tokens(&tok, QUESTION)?, &stops).await;
        // The code prompt with the logit rules, its greedy first token banned.
        let (sampling, _) = penalized(expected[1][0], &stops);
        penalized_expected = reference_with(&*engine, "rules", &prompts[1].1, sampling).await;
        let allowed: Vec<u32> = expected.iter().flatten().copied().collect();
        let (sampling, _) = masked(&expected[1], &allowed, &stops);
        masked_expected = reference_with(&*engine, "masked", &prompts[1].1, sampling).await;
        let sampling = Sampling {
            max_tokens: 8,
            logprobs: Some(LOGPROBS),
            ..Sampling::default()
        };
        scored_expected = reference_scored(&*engine, "scored", &prompts[0].1, sampling).await;
        // The prompt's log probabilities come with the first token.
        let sampling = Sampling {
            max_tokens: 1,
            logprobs: Some(1),
            prompt_logprobs: Some(1),
            ..Sampling::default()
        };
        let first = reference_scored(&*engine, "prompt", &prompts[3].1, sampling).await;
        prompt_expected = first
            .into_iter()
            .next()
            .context("no first token")?
            .prompt_logprobs;
        anyhow::ensure!(prompt_expected.len() + 1 == prompts[3].1.len());
    }
    assert_ne!(penalized_expected, expected[1], "the rules change nothing");
    assert_eq!(
        masked_expected[0], expected[1][0],
        "the first token is free"
    );
    assert_ne!(masked_expected[1], expected[1][1], "the pair is banned");

    let cluster = start_cluster(&path).await?;
    let mut client = cluster.inference().await?;
    for ((name, prompt), expected) in prompts.iter().zip(&expected) {
        // Remote first: the decode worker has not computed this prompt itself.
        let remote = grpc::generate(&mut client, token_request(prompt, PrefillMode::Remote))
            .await
            .with_context(|| format!("{name}: remote request"))?;
        let routing = remote.last_routing.clone().context("routing info")?;
        assert_eq!(
            routing.mode,
            PrefillMode::Remote as i32,
            "{name}: {routing:?}"
        );
        assert!(!routing.fell_back, "{name} fell back to local: {routing:?}");
        assert_eq!(
            &remote.tokens, expected,
            "{name}: remote prefill != reference"
        );
        let local = grpc::generate(&mut client, token_request(prompt, PrefillMode::Local))
            .await
            .with_context(|| format!("{name}: local request"))?;
        assert_eq!(
            &local.tokens, expected,
            "{name}: local prefill != reference"
        );
        let usage = remote.usage.clone().context("usage")?;
        assert_eq!(usage.prompt_tokens as usize, prompt.len(), "{name}");
        if *name == "shared-prefix" {
            // `long` left its blocks on the decode worker: at least the shared facts were
            // reused there, so only the differing tail was imported.
            assert!(
                usage.cached_tokens >= 400,
                "{name}: the decode worker reused only {} cached tokens",
                usage.cached_tokens
            );
        }
        if remote.tokens.len() < MAX_TOKENS as usize {
            assert_eq!(remote.finish_reason, Some(FinishReason::Stop), "{name}");
        }
    }

    // A cache salt (vLLM's `cache_salt`): the workers hold `long`'s blocks by now, but not
    // under this salt; a second salted request finds the first's, on both paths; the tokens
    // are the reference's throughout.
    let salted = |mode| {
        let mut req = token_request(&prompts[2].1, mode);
        if let Some(s) = req.sampling.as_mut() {
            s.cache_salt = "tenant-a".into();
        }
        req
    };
    for (mode, reused) in [(PrefillMode::Remote, false), (PrefillMode::Local, true)] {
        let out = grpc::generate(&mut client, salted(mode))
            .await
            .context("salted")?;
        let routing = out.last_routing.clone().context("routing info")?;
        assert!(!routing.fell_back, "fell back: {routing:?}");
        assert_eq!(out.tokens, expected[2], "{mode:?} salted != reference");
        let cached = out.usage.clone().context("usage")?.cached_tokens;
        if reused {
            assert!(
                cached >= 400,
                "{mode:?}: the salt's own blocks: {cached} cached"
            );
        } else {
            assert_eq!(cached, 0, "{mode:?}: no salted blocks yet");
        }
    }

    // The logit rules give the same tokens on both paths: the prefill worker draws the first
    // token (bias, repetition penalty over the prompt), the decode worker the rest (penalties
    // over the output, including the token it received).
    let (_, wire) = penalized(expected[1][0], &stops);
    for mode in [PrefillMode::Remote, PrefillMode::Local] {
        let mut req = token_request(&prompts[1].1, mode);
        req.sampling = Some(wire.clone());
        let out = grpc::generate(&mut client, req).await.context("rules")?;
        let routing = out.last_routing.clone().context("routing info")?;
        assert_eq!(routing.mode, mode as i32, "{routing:?}");
        assert!(!routing.fell_back, "fell back: {routing:?}");
        assert_eq!(
            out.tokens, penalized_expected,
            "{mode:?} prefill with the logit rules != reference"
        );
    }
    // Allowed tokens and bad words likewise: the decode worker bans the pair's second token
    // after the first, which the prefill worker drew on the remote path.
    let allowed: Vec<u32> = expected.iter().flatten().copied().collect();
    let (_, wire) = masked(&expected[1], &allowed, &stops);
    for mode in [PrefillMode::Remote, PrefillMode::Local] {
        let mut req = token_request(&prompts[1].1, mode);
        req.sampling = Some(wire.clone());
        let out = grpc::generate(&mut client, req).await.context("masked")?;
        let routing = out.last_routing.clone().context("routing info")?;
        assert!(!routing.fell_back, "fell back: {routing:?}");
        assert_eq!(
            out.tokens, masked_expected,
            "{mode:?} prefill with allowed tokens and bad words != reference"
        );
    }

    // Log probabilities: the prefill worker's for the first token (carried in the KV
    // transfer's end frame), the decode worker's for the rest, equal to the reference's.
    for mode in [PrefillMode::Remote, PrefillMode::Local] {
        let mut req = token_request(&prompts[0].1, mode);
        req.sampling = Some(SamplingParams {
            max_tokens: 8,
            logprobs: Some(LOGPROBS),
            ..SamplingParams::default()
        });
        let out = grpc::generate(&mut client, req).await.context("logprobs")?;
        let routing = out.last_routing.clone().context("routing info")?;
        assert!(!routing.fell_back, "fell back: {routing:?}");
        let ids: Vec<u32> = scored_expected.iter().map(|t| t.id).collect();
        assert_eq!(
            out.tokens, ids,
            "{mode:?}: tokens with logprobs != reference"
        );
        assert_eq!(out.logprobs.len(), ids.len(), "{mode:?}: one entry a token");
        for (i, (got, want)) in out.logprobs.iter().zip(&scored_expected).enumerate() {
            let want = want.logprobs.as_deref().context("reference logprobs")?;
            let close = |a: f32, b: f32| (a - b).abs() < 1e-3;
            assert!(
                close(got.logprob, want.logprob) && got.logprob <= 0.0,
                "{mode:?} token {i}: {got:?} against {want:?}"
            );
            assert_eq!(got.top_ids.len(), LOGPROBS as usize, "{mode:?} token {i}");
            // Greedy: the drawn token is the most likely one.
            assert_eq!(got.top_ids[0], ids[i], "{mode:?} token {i}");
            for (id, lp) in got.top_ids.iter().zip(&got.top_logprobs) {
                if let Some((_, w)) = want.top.iter().find(|(t, _)| t == id) {
                    assert!(
                        close(*lp, *w),
                        "{mode:?} token {i}: {got:?} against {want:?}"
                    );
                }
            }
        }
    }
    // With echo, the prompt's too (an evaluation harness's loglikelihood request): the decode
    // worker computes its whole prompt in 64-token chunks, although `long` left most of its
    // blocks in its prefix cache, and each value equals the reference's.
    let body = serde_json::json!({
        "model": MODEL,
        "prompt": prompts[3].1,
        "max_tokens": 1,
        "temperature": 0,
        "echo": true,
        "logprobs": 1,
    });
    let v = post_ok(&cluster, "/v1/completions", &body).await?;
    let scored = v["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .context("no token_logprobs")?;
    assert_eq!(
        scored.len(),
        prompts[3].1.len() + 1,
        "one a prompt token, one generated"
    );
    assert!(scored[0].is_null(), "the first prompt token has none");
    for (i, (got, want)) in scored[1..].iter().zip(&prompt_expected).enumerate() {
        let got = got.as_f64().context("a number")? as f32;
        assert!(
            (got - want.logprob).abs() < 1e-3,
            "prompt token {}: {got} against {}",
            i + 1,
            want.logprob
        );
    }
    // vLLM's `prompt_logprobs`: the same values, keyed by each prompt token's id, ranked.
    let body = serde_json::json!({
        "model": MODEL,
        "prompt": prompts[3].1,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": 1,
    });
    let v = post_ok(&cluster, "/v1/completions", &body).await?;
    let scored = v["choices"][0]["prompt_logprobs"]
        .as_array()
        .context("no prompt_logprobs")?;
    assert_eq!(scored.len(), prompts[3].1.len());
    assert!(scored[0].is_null(), "the first prompt token has none");
    for (i, (got, want)) in scored[1..].iter().zip(&prompt_expected).enumerate() {
        let id = prompts[3].1[i + 1];
        let own = &got[id.to_string()];
        let logprob = own["logprob"].as_f64().context("a number")? as f32;
        assert!(
            (logprob - want.logprob).abs() < 1e-3,
            "prompt token {}: {got} against {want:?}",
            i + 1
        );
        // Ranked 1 exactly where it is the likeliest alternative.
        let rank = own["rank"].as_u64().context("a rank")?;
        assert_eq!(
            rank == 1,
            want.top[0].0 == id,
            "prompt token {}: {got}",
            i + 1
        );
        assert_eq!(own["decoded_token"], tok.decode(&[id]));
    }

    // The same over HTTP in chat's shape: each token's text, as the tokenizer decodes it alone.
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 2,
    });
    let v = post_ok(&cluster, "/v1/chat/completions", &body).await?;
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .context("no logprobs content")?;
    let texts: Vec<String> = chat_expected
        .iter()
        .take(4)
        .map(|&t| tok.decode(&[t]))
        .collect();
    let got: Vec<&str> = content.iter().filter_map(|e| e["token"].as_str()).collect();
    assert_eq!(got, texts, "{v}");
    assert!(
        content
            .iter()
            .all(|e| e["top_logprobs"].as_array().map(Vec::len) == Some(2)),
        "{v}"
    );

    // The chat endpoint renders the GGUF's template and detokenizes exactly what the engine
    // generates. (Whether the answer is right is a property of the weights: the engine's own
    // test asks the same question at full precision, where it does not depend on the CPU's
    // SIMD kernels; re-quantized to Q8_0 the 135M model's greedy answer differs between AVX2
    // and AVX-512 machines.)
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    });
    let v = post_ok(&cluster, "/v1/chat/completions", &body).await?;
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .context("no message content")?;
    assert_eq!(
        answer,
        tok.decode(&chat_expected),
        "chat answer != reference"
    );
    assert!(
        answer
            .split_whitespace()
            .filter(|w| w.chars().any(char::is_alphabetic))
            .count()
            >= 2,
        "answer: {answer:?}"
    );
    let finish = if chat_expected.len() < MAX_TOKENS as usize {
        "stop"
    } else {
        "length"
    };
    assert_eq!(v["choices"][0]["finish_reason"], finish, "{v}");
    assert_eq!(v["model"], MODEL, "{v}");

    // Structured output through the real processes, on both paths: remote first (the prefill
    // worker draws the first token under the same mask; the decode worker does not hold this
    // prompt yet), then local, which must give the same text.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "country": {"type": "string", "maxLength": 12},
        },
        "required": ["city", "country"],
        "additionalProperties": false,
    });
    let mut answers = Vec::new();
    for mode in ["remote", "local"] {
        let body = serde_json::json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "Name the capital of France and its country as JSON."}],
            "max_tokens": 48,
            "temperature": 0,
            "prefill_mode": mode,
            "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
        });
        let v = post_ok(&cluster, "/v1/chat/completions", &body).await?;
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .context("no message content")?
            .to_owned();
        let place: serde_json::Value = serde_json::from_str(&content)
            .with_context(|| format!("{mode}: not JSON: {content:?}"))?;
        assert!(
            place["city"].is_string() && place["country"].is_string(),
            "{mode}: {place}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{mode}: {v}");
        answers.push(content);
    }
    assert_eq!(
        answers[0], answers[1],
        "remote and local structured answers differ"
    );
    // A choice over completions, streamed: the text is one of the options, then it stops.
    let body = serde_json::json!({
        "model": MODEL,
        "prompt": "Is Paris in France? Answer:",
        "max_tokens": 8,
        "temperature": 0,
        "stream": true,
        "structured_outputs": {"choice": [" yes", " no"]},
    });
    let response =
        http::post_json(cluster.http_addr(), "/v1/completions", &body.to_string()).await?;
    anyhow::ensure!(response.status == 200, "{}", response.text());
    let streamed: String = response
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|e| e["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert!(streamed == " yes" || streamed == " no", "{streamed:?}");

    // Tool calling: "required" makes SmolLM2 call the tool with arguments that fit its
    // parameters; the call and its result then go back in the conversation.
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city today",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"], "additionalProperties": false},
    }}]);
    let question = serde_json::json!({"role": "user", "content": "What is the weather in Paris?"});
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [question],
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": 48,
        "temperature": 0,
    });
    let v = post_ok(&cluster, "/v1/chat/completions", &body).await?;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let arguments: serde_json::Value = serde_json::from_str(
        call["function"]["arguments"]
            .as_str()
            .context("no arguments")?,
    )?;
    assert!(arguments["city"].is_string(), "{arguments}");
    // Streamed, the call goes out as soon as its name is drawn and its arguments as they
    // are: the same call (greedy), in more than one piece.
    let streamed = serde_json::json!({
        "model": MODEL,
        "messages": [question],
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": 48,
        "temperature": 0,
        "stream": true,
    });
    let response = http::post_json(
        cluster.http_addr(),
        "/v1/chat/completions",
        &streamed.to_string(),
    )
    .await?;
    anyhow::ensure!(response.status == 200, "{}", response.text());
    let deltas: Vec<serde_json::Value> = response
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .collect();
    assert_eq!(deltas[0]["function"]["name"], "get_weather", "{deltas:?}");
    let pieces: Vec<&str> = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .filter(|a| !a.is_empty())
        .collect();
    assert!(pieces.len() > 1, "{deltas:?}");
    let joined: serde_json::Value = serde_json::from_str(&pieces.concat())?;
    assert_eq!(joined, arguments, "{deltas:?}");
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [
            question,
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 21 C"},
        ],
        "tools": tools,
        "tool_choice": "none",
        "max_tokens": 16,
        "temperature": 0,
    });
    let v = post_ok(&cluster, "/v1/chat/completions", &body).await?;
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{v}"
    );

    cluster.passed();
    Ok(())
}

//! Bad input gets a clear gRPC status or OpenAI error JSON with the right code, and the cluster
//! keeps serving good requests afterwards.

use dolphin_proto::v1::generate_request::Input;
use dolphin_proto::v1::{
    ChatMessages, GenerateRequest, ListModelsRequest, PrefillMode, SamplingParams, TokenIds,
};
use dolphin_tests::grpc::{self, MODEL};
use dolphin_tests::{ClusterConfig, TestCluster, http};
use serde_json::json;
use tonic::Code;

/// Prompts above this many tokens are rejected (router flag).
const MAX_PROMPT_TOKENS: usize = 1024;

fn cluster_config() -> ClusterConfig {
    ClusterConfig {
        router_args: vec![
            "--max-prompt-tokens".to_owned(),
            MAX_PROMPT_TOKENS.to_string(),
        ],
        ..ClusterConfig::default()
    }
}

fn oversized_prompt() -> String {
    "x".repeat(MAX_PROMPT_TOKENS * 5)
}

#[tokio::test]
async fn grpc_rejects_bad_requests_and_keeps_serving() -> anyhow::Result<()> {
    let cluster = TestCluster::start(cluster_config()).await?;
    let mut client = cluster.inference().await?;
    let ok = || grpc::text_request("a perfectly fine prompt", 8, PrefillMode::Unspecified);
    let with_max_tokens = |n: u32| {
        let mut r = ok();
        if let Some(s) = r.sampling.as_mut() {
            s.max_tokens = n;
        }
        r
    };
    let cases: Vec<(&str, GenerateRequest, Code)> = vec![
        (
            "empty prompt",
            grpc::text_request("", 8, PrefillMode::Unspecified),
            Code::InvalidArgument,
        ),
        (
            "no input",
            GenerateRequest {
                input: None,
                ..ok()
            },
            Code::InvalidArgument,
        ),
        (
            "empty chat",
            GenerateRequest {
                input: Some(Input::Chat(ChatMessages {
                    messages: vec![],
                    ..Default::default()
                })),
                ..ok()
            },
            Code::InvalidArgument,
        ),
        ("max_tokens 0", with_max_tokens(0), Code::InvalidArgument),
        (
            "absurd max_tokens",
            with_max_tokens(u32::MAX),
            Code::InvalidArgument,
        ),
        (
            "unknown model",
            GenerateRequest {
                model: "no-such-model".to_owned(),
                ..ok()
            },
            Code::NotFound,
        ),
        (
            "oversized prompt",
            grpc::text_request(&oversized_prompt(), 8, PrefillMode::Unspecified),
            Code::InvalidArgument,
        ),
    ];
    for (name, req, code) in cases {
        match grpc::generate(&mut client, req).await {
            Ok(g) => panic!("{name}: accepted: {g:?}"),
            Err(status) => {
                assert_eq!(status.code(), code, "{name}: {status:?}");
                assert!(!status.message().is_empty(), "{name}: empty message");
            }
        }
    }
    let g = grpc::generate(&mut client, ok()).await?;
    assert!(!g.tokens.is_empty(), "good request after bad ones: {g:?}");
    cluster.passed();
    Ok(())
}

#[tokio::test]
async fn http_rejects_bad_requests_with_openai_errors_and_keeps_serving() -> anyhow::Result<()> {
    let cluster = TestCluster::start(cluster_config()).await?;
    let completion = |prompt: &str, max_tokens: serde_json::Value| {
        json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}).to_string()
    };
    let cases: Vec<(&str, &str, String, u16)> = vec![
        (
            "malformed JSON",
            "/v1/completions",
            "{\"model\": \"sim-model\", \"prompt\": ".to_owned(),
            400,
        ),
        (
            "wrong type",
            "/v1/completions",
            completion("hi", json!("lots")),
            400,
        ),
        (
            "empty prompt",
            "/v1/completions",
            completion("", json!(8)),
            400,
        ),
        (
            "max_tokens 0",
            "/v1/completions",
            completion("hi", json!(0)),
            400,
        ),
        (
            "absurd max_tokens",
            "/v1/completions",
            completion("hi", json!(u32::MAX)),
            400,
        ),
        (
            "unknown model",
            "/v1/completions",
            json!({"model": "no-such-model", "prompt": "hi", "max_tokens": 8}).to_string(),
            404,
        ),
        (
            "oversized prompt",
            "/v1/completions",
            completion(&oversized_prompt(), json!(8)),
            400,
        ),
        (
            "empty chat",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [], "max_tokens": 8}).to_string(),
            400,
        ),
        // The workers serve in arrival order: they refuse a priority, the router passes that on.
        (
            "a priority on workers in arrival order",
            "/v1/completions",
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 8, "priority": 2}).to_string(),
            400,
        ),
    ];
    for (name, path, body, status) in cases {
        let resp = http::post_json(cluster.http_addr(), path, &body).await?;
        assert_eq!(resp.status, status, "{name}: {}", resp.text());
        let v = resp
            .json()
            .unwrap_or_else(|e| panic!("{name}: error body is not JSON: {e}"));
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{name}: no error.message: {v}");
        assert!(v["error"]["type"].is_string(), "{name}: no error.type: {v}");
    }
    let resp = http::post_json(
        cluster.http_addr(),
        "/v1/completions",
        &completion("a perfectly fine prompt", json!(8)),
    )
    .await?;
    assert_eq!(
        resp.status,
        200,
        "good request after bad ones: {}",
        resp.text()
    );
    let v = resp.json()?;
    assert!(
        !v["choices"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{v}"
    );
    cluster.passed();
    Ok(())
}

/// The workers' context (`--max-context`, here on the sim engine) reaches the router through
/// `Worker.Info`: listed by `/v1/models` and `ListModels`, a request past it refused before
/// any worker runs it (`context_length_exceeded`), a default `max_tokens` shrunk to fit.
#[tokio::test]
async fn the_workers_context_bounds_requests_at_the_router() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        worker_args: vec!["--max-context=64".to_owned()],
        ..ClusterConfig::default()
    })
    .await?;
    let models = http::get(cluster.http_addr(), "/v1/models").await?.json()?;
    assert_eq!(models["data"][0]["max_model_len"], 64, "{models}");
    let mut client = cluster.inference().await?;
    let listed = client.list_models(ListModelsRequest {}).await?.into_inner();
    assert_eq!(listed.models[0].context_length, 64, "{listed:?}");

    // 60 prompt tokens and 5 to generate: one past the context.
    let prompt: Vec<u32> = (100..160).collect();
    let over = GenerateRequest {
        model: MODEL.to_owned(),
        input: Some(Input::TokenIds(TokenIds {
            ids: prompt.clone(),
        })),
        sampling: Some(SamplingParams {
            max_tokens: 5,
            ..SamplingParams::default()
        }),
        ..GenerateRequest::default()
    };
    let status = client.generate(over).await.expect_err("past the context");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("context is 64 tokens"),
        "{status:?}"
    );
    let resp = http::post_json(
        cluster.http_addr(),
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": 5}).to_string(),
    )
    .await?;
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(resp.json()?["error"]["code"], "context_length_exceeded");

    // Without max_tokens the default (16) shrinks to the 4 left.
    let resp = http::post_json(
        cluster.http_addr(),
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "ignore_eos": true}).to_string(),
    )
    .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json()?;
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    cluster.passed();
    Ok(())
}

/// Workers started with `--scheduling-policy priority` take a request's `priority` (vLLM's),
/// on both prefill paths, over HTTP and gRPC.
#[tokio::test]
async fn a_priority_is_served_by_workers_that_schedule_by_it() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        worker_args: vec!["--scheduling-policy".to_owned(), "priority".to_owned()],
        ..ClusterConfig::default()
    })
    .await?;
    for mode in ["local", "remote"] {
        let body = json!({"model": MODEL, "prompt": "hi there", "max_tokens": 4,
                          "priority": -3, "prefill_mode": mode});
        let resp =
            http::post_json(cluster.http_addr(), "/v1/completions", &body.to_string()).await?;
        assert_eq!(resp.status, 200, "{mode}: {}", resp.text());
    }
    let mut client = cluster.inference().await?;
    let mut req = grpc::text_request("hi there", 4, PrefillMode::Remote);
    if let Some(s) = req.sampling.as_mut() {
        s.priority = 7;
    }
    let out = grpc::generate(&mut client, req).await?;
    assert_eq!(out.tokens.len(), 4);
    Ok(())
}

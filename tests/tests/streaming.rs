//! A request streams through both prefill paths with identical tokens, and through the
//! OpenAI-compatible HTTP API (completions with SSE, chat completions).

use dolphin_proto::v1::{FinishReason, PrefillMode};
use dolphin_tests::grpc::{self, Generated, MODEL};
use dolphin_tests::{ClusterConfig, TestCluster, http};
use serde_json::{Value, json};

/// Long enough for several 16-token blocks, so the remote path moves real KV blocks.
const PROMPT: &str = "Dolphins are highly social marine mammals that live in pods, hunt \
    cooperatively and talk to each other with clicks and whistles; some populations even use \
    sea sponges as tools while foraging on the ocean floor.";

fn check_complete(name: &str, g: &Generated, max_tokens: u32) {
    assert!(!g.tokens.is_empty(), "{name}: no tokens: {g:?}");
    assert!(
        g.tokens.len() <= max_tokens as usize,
        "{name}: too many tokens: {g:?}"
    );
    match g.finish_reason {
        Some(FinishReason::Length) => assert_eq!(g.tokens.len(), max_tokens as usize, "{name}"),
        Some(FinishReason::Stop) => {}
        other => panic!("{name}: bad finish reason {other:?}: {g:?}"),
    }
    let usage = g.usage.clone().expect("usage on the last message");
    assert_eq!(
        usage.completion_tokens as usize,
        g.tokens.len(),
        "{name}: {usage:?}"
    );
    assert!(usage.prompt_tokens > 0, "{name}: {usage:?}");
    assert!(!g.text.is_empty(), "{name}: no text");
}

#[tokio::test]
async fn local_and_remote_paths_stream_identical_tokens() -> anyhow::Result<()> {
    // Steps of a few milliseconds: the router merges tokens that reach it together into one
    // message, so near-zero step times would make "streamed" (more than one message) a race.
    let cluster = TestCluster::start(ClusterConfig {
        time_scale: 0.5,
        ..ClusterConfig::default()
    })
    .await?;
    let mut client = cluster.inference().await?;
    // Remote first: the decode worker holds nothing yet, so every block crosses the wire.
    let remote = grpc::generate(
        &mut client,
        grpc::text_request(PROMPT, 32, PrefillMode::Remote),
    )
    .await?;
    let local = grpc::generate(
        &mut client,
        grpc::text_request(PROMPT, 32, PrefillMode::Local),
    )
    .await?;
    check_complete("remote", &remote, 32);
    check_complete("local", &local, 32);
    assert!(remote.messages > 1, "not streamed: {remote:?}");
    assert!(local.messages > 1, "not streamed: {local:?}");

    let r = remote
        .last_routing
        .clone()
        .expect("routing on the last message");
    assert_eq!(r.mode, PrefillMode::Remote as i32, "{r:?}");
    assert_eq!(r.prefill_worker, cluster.prefill[0].id(), "{r:?}");
    assert_eq!(r.decode_worker, cluster.decode[0].id(), "{r:?}");
    assert!(!r.fell_back, "remote prefill fell back: {r:?}");
    let l = local
        .last_routing
        .clone()
        .expect("routing on the last message");
    assert_eq!(l.mode, PrefillMode::Local as i32, "{l:?}");
    assert!(remote.first_routing.is_some() && local.first_routing.is_some());

    assert_eq!(remote.tokens, local.tokens, "paths disagree");
    assert_eq!(remote.text, local.text);
    cluster.passed();
    Ok(())
}

fn sse_json(resp: &http::Response) -> Vec<Value> {
    assert_eq!(resp.status, 200, "{}", resp.text());
    let ct = resp.content_type.as_deref().unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct:?}");
    let data = resp.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d:?}: {e}")))
        .collect()
}

fn finish_reasons(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn openai_completions_stream_over_sse() -> anyhow::Result<()> {
    // Millisecond steps, so tokens reach the router one by one (see above).
    let cluster = TestCluster::start(ClusterConfig {
        time_scale: 0.5,
        ..ClusterConfig::default()
    })
    .await?;
    let mut client = cluster.inference().await?;
    let reference = grpc::generate(
        &mut client,
        grpc::text_request(PROMPT, 24, PrefillMode::Unspecified),
    )
    .await?;

    let body = json!({
        "model": MODEL, "prompt": PROMPT, "max_tokens": 24, "stream": true, "temperature": 0,
    });
    let resp = http::post_json(cluster.http_addr(), "/v1/completions", &body.to_string()).await?;
    let chunks = sse_json(&resp);
    assert!(chunks.len() > 1, "not streamed: {chunks:?}");
    let mut text = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "text_completion", "{c}");
        text.push_str(c["choices"][0]["text"].as_str().unwrap_or_default());
    }
    assert_eq!(text, reference.text, "HTTP and gRPC disagree");
    let reasons = finish_reasons(&chunks);
    assert_eq!(reasons.len(), 1, "one final chunk expected: {chunks:?}");
    assert!(
        ["length", "stop"].contains(&reasons[0].as_str()),
        "{reasons:?}"
    );

    // Non-streamed, the same text in one JSON body.
    let body = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0});
    let resp = http::post_json(cluster.http_addr(), "/v1/completions", &body.to_string()).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json()?;
    assert_eq!(v["choices"][0]["text"], reference.text.as_str(), "{v}");
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64(),
        Some(reference.tokens.len() as u64),
        "{v}"
    );
    cluster.passed();
    Ok(())
}

#[tokio::test]
async fn openai_chat_completions_and_models() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig::default()).await?;
    let messages = json!([
        {"role": "system", "content": "You are a marine biologist."},
        {"role": "user", "content": "How do dolphins sleep?"},
    ]);
    let body = json!({"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0});
    let resp = http::post_json(
        cluster.http_addr(),
        "/v1/chat/completions",
        &body.to_string(),
    )
    .await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json()?;
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant", "{v}");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content string")
        .to_owned();
    assert!(!content.is_empty(), "{v}");
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=16).contains(&completion), "{v}");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 0, "{v}");

    let body = json!({
        "model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, "stream": true,
    });
    let resp = http::post_json(
        cluster.http_addr(),
        "/v1/chat/completions",
        &body.to_string(),
    )
    .await?;
    let chunks = sse_json(&resp);
    let mut streamed = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        streamed.push_str(
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default(),
        );
    }
    assert_eq!(streamed, content, "streamed and whole answers differ");
    assert_eq!(finish_reasons(&chunks).len(), 1, "{chunks:?}");

    let resp = http::get(cluster.http_addr(), "/v1/models").await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json()?;
    let ids: Vec<&str> = v["data"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, [MODEL], "{v}");
    cluster.passed();
    Ok(())
}

//! A decode worker process serving a model group (two sim subservers with token-level
//! handoffs) behind the real router: both prefill paths, usage by model and handoff counts on
//! gRPC and in the OpenAI response, a per-request algorithm, and a bad one refused clearly.

use dolphin_proto::v1::{HandoffParams, PrefillMode};
use dolphin_tests::grpc::{self, MODEL};
use dolphin_tests::{ClusterConfig, TestCluster, http};
use serde_json::json;

const PROMPT: &str = "Dolphins are highly social marine mammals that live in pods, hunt \
    cooperatively and talk to each other with clicks and whistles.";

fn group_cluster() -> ClusterConfig {
    ClusterConfig {
        // The home (small) subserver runs the prefill worker's profile: the same KV layout.
        decode_args: [
            "--subserver",
            "small=dynamo-mocker",
            "--subserver",
            "large=qwen72b-h20",
            "--group-name",
            MODEL,
            "--handoff",
            "random:to_large=0.3,to_small=0.5",
            "--batch-wait",
            "2",
            "--batch-max-wait-ms",
            "5",
        ]
        .map(str::to_owned)
        .to_vec(),
        ..ClusterConfig::default()
    }
}

#[tokio::test]
async fn a_model_group_serves_both_paths_and_reports_usage_by_model() -> anyhow::Result<()> {
    let cluster = TestCluster::start(group_cluster()).await?;
    let mut client = cluster.inference().await?;
    for mode in [PrefillMode::Local, PrefillMode::Remote] {
        let g = grpc::generate(&mut client, grpc::text_request(PROMPT, 48, mode)).await?;
        assert_eq!(g.tokens.len(), 48, "{mode:?}: {g:?}");
        let usage = g.usage.clone().expect("usage");
        let names: Vec<&str> = usage.by_model.iter().map(|m| m.model.as_str()).collect();
        assert_eq!(names, ["small", "large"], "{mode:?}: {usage:?}");
        let sum: u32 = usage.by_model.iter().map(|m| m.completion_tokens).sum();
        assert_eq!(sum, usage.completion_tokens, "{mode:?}: {usage:?}");
        assert!(
            usage.handoffs > 0,
            "{mode:?}: 48 tokens at 0.3 hand off: {usage:?}"
        );
        assert!(
            usage.handoff_algorithm.starts_with("random"),
            "{mode:?}: {usage:?}"
        );
        let r = g.last_routing.clone().expect("routing");
        assert_eq!(r.mode, mode as i32, "{r:?}");
        assert!(!r.fell_back, "{mode:?}: {r:?}");
    }

    // A request's own algorithm, over gRPC.
    let mut req = grpc::text_request(PROMPT, 24, PrefillMode::Local);
    if let Some(s) = req.sampling.as_mut() {
        s.handoff = Some(HandoffParams {
            algorithm: "always-large".into(),
            threshold: None,
        });
    }
    let g = grpc::generate(&mut client, req).await?;
    let usage = g.usage.clone().expect("usage");
    assert_eq!(usage.by_model[1].completion_tokens, 24, "{usage:?}");
    assert_eq!(usage.handoffs, 0, "{usage:?}");

    // And over HTTP, with the extension field; usage carries the split.
    let body = json!({
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 16,
        "handoff": {"algorithm": "always-small"},
    });
    let resp = http::post_json(cluster.http_addr(), "/v1/completions", &body.to_string()).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json()?;
    let split = &v["usage"]["handoff"];
    assert_eq!(split["completion_tokens_by_model"]["small"], 16, "{v}");
    assert_eq!(split["completion_tokens_by_model"]["large"], 0, "{v}");
    assert_eq!(split["algorithm"], "always-small", "{v}");

    // A bad algorithm is a clear error, and the worker serves on.
    let bad = json!({
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 8,
        "handoff": {"algorithm": "telepathy"},
    });
    let resp = http::post_json(cluster.http_addr(), "/v1/completions", &bad.to_string()).await?;
    assert_eq!(resp.status, 400, "{}", resp.text());
    let v = resp.json()?;
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("telepathy"), "{v}");
    let g = grpc::generate(
        &mut client,
        grpc::text_request(PROMPT, 8, PrefillMode::Local),
    )
    .await?;
    assert_eq!(g.tokens.len(), 8, "{g:?}");
    cluster.passed();
    Ok(())
}

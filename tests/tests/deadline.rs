//! Deadlines on the real binaries: a gRPC client's `grpc-timeout` and the router's
//! `--request-timeout-secs` end a request that runs past them with DEADLINE_EXCEEDED / 504,
//! after the tokens that were streamed, and the router keeps serving.

use std::time::{Duration, Instant};

use dolphin_proto::v1::{FinishReason, PrefillMode};
use dolphin_tests::{ClusterConfig, TestCluster, grpc, http};
use serde_json::json;

#[tokio::test]
async fn requests_end_at_their_deadline() -> anyhow::Result<()> {
    // Steps of the profile's real length: 200 tokens take seconds.
    let cluster = TestCluster::start(ClusterConfig {
        time_scale: 1.0,
        router_args: vec!["--request-timeout-secs=1".into()],
        ..ClusterConfig::default()
    })
    .await?;
    let mut client = cluster.inference().await?;
    let long = |max_tokens| {
        let mut r = grpc::text_request("Tell me about dolphins.", max_tokens, PrefillMode::Local);
        r.sampling.as_mut().expect("sampling").ignore_eos = true;
        r
    };

    // The client's own, shorter deadline.
    let mut req = tonic::Request::new(long(200));
    req.set_timeout(Duration::from_millis(400));
    let started = Instant::now();
    let mut stream = client.generate(req).await?.into_inner();
    let mut tokens = 0;
    let status = loop {
        match stream.message().await {
            Ok(Some(m)) => tokens += m.token_ids.len(),
            Ok(None) => anyhow::bail!("finished before its deadline"),
            Err(s) => break s,
        }
    };
    let took = started.elapsed();
    // The router's answer (not the client library's own timer).
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("ran past its deadline"),
        "{status:?}"
    );
    assert!(tokens > 0 && tokens < 200, "{tokens} tokens");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "{took:?}"
    );

    // The router's default (1 s) over HTTP: 504 in OpenAI's shape.
    let r = http::post_json(
        cluster.http_addr(),
        "/v1/completions",
        &json!({"prompt": "Tell me about dolphins.", "max_tokens": 200, "ignore_eos": true})
            .to_string(),
    )
    .await?;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()?["error"]["type"], "timeout_error", "{}", r.text());

    // Short requests are untouched.
    let g = grpc::generate(&mut client, long(4)).await?;
    assert_eq!(g.finish_reason, Some(FinishReason::Length), "{g:?}");
    cluster.passed();
    Ok(())
}

//! Request migration on the real binaries: a decode worker SIGKILLed while it streams a request;
//! the router moves the request to the other decode worker and the client's stream goes on
//! without a gap (greedy and seeded output equal an uninterrupted run). With no worker left,
//! the stream ends with an error that says so.

use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::{FinishReason, GenerateRequest, PrefillMode};
use dolphin_tests::grpc::{self, Generated};
use dolphin_tests::{ClusterConfig, TestCluster};
use tonic::transport::Channel;

const PROMPT: &str = "Pods of dolphins hand their young from one adult to the next.";
const MAX_TOKENS: u32 = 48;

fn request(seed: Option<u64>) -> GenerateRequest {
    let mut r = grpc::text_request(PROMPT, MAX_TOKENS, PrefillMode::Local);
    let s = r.sampling.as_mut().expect("sampling");
    // Always the full length, so the stream is still running when its worker is killed.
    s.ignore_eos = true;
    if let Some(seed) = seed {
        s.seed = Some(seed);
        s.temperature = 0.8;
    }
    r
}

/// Streams `req`, SIGKILLs the decode worker serving it once `kill_after` tokens arrived, and
/// drains the rest. Returns what arrived and the killed worker's index, or the status that
/// ended the stream with the tokens before it.
async fn stream_and_kill(
    client: &mut InferenceClient<Channel>,
    cluster: &TestCluster,
    req: GenerateRequest,
    kill_after: usize,
) -> anyhow::Result<(Result<Generated, tonic::Status>, usize, Generated)> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut out = Generated::default();
    let mut killed = None;
    loop {
        let msg = match stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(status) => {
                let victim = killed.ok_or_else(|| anyhow::anyhow!("failed early: {status}"))?;
                return Ok((Err(status), victim, out));
            }
        };
        out.push(msg);
        if killed.is_none() && out.tokens.len() >= kill_after {
            let serving = out
                .first_routing
                .as_ref()
                .map(|r| r.decode_worker.clone())
                .unwrap_or_default();
            let i = cluster
                .decode
                .iter()
                .position(|d| d.id() == serving)
                .ok_or_else(|| anyhow::anyhow!("unknown decode worker {serving:?}"))?;
            cluster.decode[i].kill()?;
            killed = Some(i);
        }
    }
    let victim = killed.ok_or_else(|| anyhow::anyhow!("finished before the kill: {out:?}"))?;
    Ok((Ok(out.clone()), victim, out))
}

#[tokio::test]
async fn a_request_survives_its_decode_worker_dying() -> anyhow::Result<()> {
    // Steps of the profile's real length (tens of milliseconds), so 48 tokens take long
    // enough to kill the worker in the middle.
    let cluster = TestCluster::start(ClusterConfig {
        prefill: 0,
        decode: 3,
        time_scale: 1.0,
        ..ClusterConfig::default()
    })
    .await?;
    let mut client = cluster.inference().await?;
    let mut alive = 3;
    for seed in [None, Some(7)] {
        let reference = grpc::generate(&mut client, request(seed)).await?;
        assert_eq!(reference.tokens.len(), MAX_TOKENS as usize, "{reference:?}");
        let (result, victim, _) = stream_and_kill(&mut client, &cluster, request(seed), 5).await?;
        alive -= 1;
        let moved = result.map_err(|s| anyhow::anyhow!("the client saw an error: {s}"))?;
        assert_eq!(moved.tokens, reference.tokens, "seed {seed:?}");
        assert_eq!(moved.text, reference.text, "seed {seed:?}");
        assert_eq!(moved.finish_reason, Some(FinishReason::Length));
        let usage = moved.usage.clone().expect("usage");
        assert_eq!(usage.completion_tokens, MAX_TOKENS, "{usage:?}");
        assert_eq!(
            usage.prompt_tokens,
            reference.usage.expect("usage").prompt_tokens
        );
        let last = moved.last_routing.clone().expect("routing");
        assert_ne!(last.decode_worker, cluster.decode[victim].id(), "{last:?}");
    }
    assert_eq!(alive, 1);
    // The last worker dies too: the stream ends with an error that says no worker took over,
    // after the tokens that were streamed.
    let (result, _, partial) = stream_and_kill(&mut client, &cluster, request(None), 5).await?;
    let status = result.expect_err("no worker is left");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("could not move to another decode worker"),
        "{status:?}"
    );
    assert!(partial.tokens.len() >= 5, "{partial:?}");
    cluster.passed();
    Ok(())
}

//! A prefill worker that dies in the middle of a remote prefill: the decode worker falls back to
//! local prefill and the client still gets its whole answer, the same tokens a local request
//! gives.

use dolphin_proto::v1::worker_client::WorkerClient;
use dolphin_proto::v1::{FinishReason, PrefillMode, SubscribeRequest, worker_event};
use dolphin_tests::wait::GENEROUS;
use dolphin_tests::{ClusterConfig, TestCluster, grpc};

#[tokio::test]
async fn prefill_worker_death_mid_request_falls_back_to_local() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        // The prefill worker is very slow, so the request is surely inside its prefill when the
        // worker is killed; the decode worker stays fast.
        prefill_time_scale: Some(300.0),
        ..ClusterConfig::default()
    })
    .await?;
    let prompt: String = "the quick brown dolphin jumps over the lazy whale. "
        .repeat(24)
        .chars()
        .take(1200)
        .collect();

    // Watch the prefill worker's load to know when the request has reached it.
    let prefill = &cluster.prefill[0];
    let mut worker = WorkerClient::new(grpc::channel(prefill.grpc_addr()).await?);
    let mut events = worker
        .subscribe(SubscribeRequest {
            load_interval_ms: 20,
        })
        .await?
        .into_inner();

    let mut client = cluster.inference().await?;
    let request = grpc::text_request(&prompt, 16, PrefillMode::Remote);
    let in_flight = tokio::spawn(async move { grpc::generate(&mut client, request).await });

    let busy = tokio::time::timeout(GENEROUS, async {
        while let Some(event) = events.message().await? {
            if let Some(worker_event::Event::Load(load)) = event.event
                && (load.running + load.waiting > 0 || load.queued_prefill_tokens > 0)
            {
                return Ok::<_, tonic::Status>(true);
            }
        }
        Ok(false)
    })
    .await;
    assert!(
        matches!(busy, Ok(Ok(true))),
        "the prefill worker never reported the request: {busy:?}"
    );
    prefill.kill()?;

    let generated = tokio::time::timeout(GENEROUS, in_flight)
        .await
        .map_err(|_| anyhow::anyhow!("the request never finished after the prefill worker died"))?
        .map_err(|e| anyhow::anyhow!("request task panicked: {e}"))?
        .map_err(|s| anyhow::anyhow!("the request failed instead of falling back: {s}"))?;
    assert!(
        matches!(
            generated.finish_reason,
            Some(FinishReason::Length | FinishReason::Stop)
        ),
        "{generated:?}"
    );
    let routing = generated
        .last_routing
        .clone()
        .expect("routing on the last message");
    assert!(routing.fell_back, "fell_back not reported: {routing:?}");
    assert_eq!(routing.decode_worker, cluster.decode[0].id(), "{routing:?}");

    let mut client = cluster.inference().await?;
    let local = grpc::generate(
        &mut client,
        grpc::text_request(&prompt, 16, PrefillMode::Local),
    )
    .await?;
    assert_eq!(
        generated.tokens, local.tokens,
        "fallback output differs from local output"
    );
    cluster.passed();
    Ok(())
}

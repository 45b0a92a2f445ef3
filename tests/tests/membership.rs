//! etcd membership: a decode worker killed with SIGKILL (no drain, no lease revoke) leaves the
//! router's view when its lease expires, and every later request is served by the survivor.

use dolphin_proto::v1::PrefillMode;
use dolphin_tests::wait::{self, GENEROUS};
use dolphin_tests::{ClusterConfig, TestCluster, grpc};

#[tokio::test]
async fn killed_decode_worker_leaves_and_the_survivor_serves() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        etcd: true,
        decode: 2,
        lease_ttl_secs: Some(3),
        ..ClusterConfig::default()
    })
    .await?;
    let victim = &cluster.decode[0];
    let survivor = cluster.decode[1].id().to_owned();
    let victim_id = victim.id().to_owned();
    victim.kill()?;

    // Expected within about one lease TTL (3 s); the bound is generous on purpose.
    let admin = cluster.admin().await?;
    wait::until("the killed worker to leave ListWorkers", GENEROUS, || {
        let mut admin = admin.clone();
        let victim_id = victim_id.clone();
        async move {
            let workers = grpc::list_workers(&mut admin)
                .await
                .map_err(|e| e.to_string())?;
            if workers.iter().any(|w| w.worker_id == victim_id) {
                Err(format!("{workers:?}"))
            } else {
                Ok(())
            }
        }
    })
    .await?;
    let workers = grpc::list_workers(&mut cluster.admin().await?).await?;
    assert!(
        workers.iter().any(|w| w.worker_id == survivor),
        "survivor missing: {workers:?}"
    );

    let mut client = cluster.inference().await?;
    for i in 0..6 {
        let prompt = format!("request {i} after the failure: tell me about pods of dolphins");
        let g = grpc::generate(
            &mut client,
            grpc::text_request(&prompt, 8, PrefillMode::Unspecified),
        )
        .await
        .map_err(|s| anyhow::anyhow!("request {i} failed: {s}"))?;
        assert!(!g.tokens.is_empty(), "request {i}: {g:?}");
        let routing = g.last_routing.expect("routing on the last message");
        assert_eq!(routing.decode_worker, survivor, "request {i}: {routing:?}");
    }
    cluster.passed();
    Ok(())
}

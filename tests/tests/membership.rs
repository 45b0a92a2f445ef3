//! etcd membership: a decode worker killed with SIGKILL (no drain, no lease revoke) leaves the
//! router's view when its lease expires, and every later request is served by the survivor; one
//! restarted under the same id (a container restart in its pod) registers once the old lease
//! expires instead of failing.

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

#[tokio::test]
async fn a_worker_restarted_under_its_id_registers_once_the_old_lease_expires() -> anyhow::Result<()>
{
    // As a Kubernetes container restart does: same pod name (worker id), the old process
    // SIGKILLed, its lease still alive for up to one TTL.
    let cluster = TestCluster::start(ClusterConfig {
        etcd: true,
        decode: 2,
        lease_ttl_secs: Some(3),
        ..ClusterConfig::default()
    })
    .await?;
    let id = cluster.decode[0].id().to_owned();
    cluster.decode[0].kill()?;
    let etcd = cluster.etcd_url().expect("etcd");
    let bin = dolphin_tests::binaries::binary(dolphin_tests::binaries::DECODE_WORKER)?;
    let mut again = dolphin_tests::cluster::spawn(
        "decode-0-again",
        &bin,
        [
            "--grpc-addr=127.0.0.1:0",
            "--kv-addr=127.0.0.1:0",
            "--sim-time-scale=0.01",
            "--model=sim-model",
            "--lease-ttl-secs=3",
            &format!("--etcd={etcd}"),
            &format!("--worker-id={id}"),
        ]
        .map(str::to_owned)
        .to_vec(),
    )?;
    // READY comes once registered: after the predecessor's lease expired, not an exit.
    let ready = again
        .wait_ready(GENEROUS)
        .await
        .map_err(|e| anyhow::anyhow!("{e}: {}", again.output().join("\n")))?;
    assert_eq!(ready.id.as_deref(), Some(id.as_str()));
    let admin = cluster.admin().await?;
    let addr = ready.grpc_addr.clone().unwrap_or_default();
    wait::until(
        "the router to list the restarted worker live",
        GENEROUS,
        || {
            let (mut admin, id, addr) = (admin.clone(), id.clone(), addr.clone());
            async move {
                let ws = grpc::list_workers(&mut admin)
                    .await
                    .map_err(|e| e.to_string())?;
                match ws.iter().find(|w| w.worker_id == id) {
                    Some(w) if w.events_live && w.grpc_addr == addr => Ok(()),
                    _ => Err(format!("{ws:?}")),
                }
            }
        },
    )
    .await?;
    cluster.passed();
    Ok(())
}

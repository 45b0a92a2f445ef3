//! Compatible pairs only: a prefill worker whose KV layout differs from the decode worker's
//! (here: another `--sim-byte-scale`, so another number of KV bytes per token) is never paired
//! with it, each refusal is counted in `dolphin_router_pairs_refused_total` and logged, and
//! forced remote requests go to the compatible prefill worker. A rolling upgrade that changes
//! the build version takes the same path (`KvCompat::check` compares version first).

use dolphin_proto::v1::PrefillMode;
use dolphin_tests::{ClusterConfig, TestCluster, grpc, http};

#[tokio::test]
async fn incompatible_prefill_workers_are_never_paired() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        etcd: true,
        prefill: 2,
        decode: 1,
        prefill_args_each: vec![vec!["--sim-byte-scale=0.002".to_owned()]],
        ..ClusterConfig::default()
    })
    .await?;
    let odd = cluster.prefill[0].id().to_owned();
    let good = cluster.prefill[1].id().to_owned();

    // The router publishes what each worker announced.
    let workers = grpc::list_workers(&mut cluster.admin().await?).await?;
    let layout = |id: &str| {
        workers
            .iter()
            .find(|w| w.worker_id == id)
            .map(|w| w.kv_layout.clone())
            .unwrap_or_default()
    };
    let decode_layout = layout(cluster.decode[0].id());
    assert_ne!(layout(&odd), decode_layout, "{workers:?}");
    assert_eq!(layout(&good), decode_layout, "{workers:?}");

    let mut client = cluster.inference().await?;
    for i in 0..12 {
        let prompt = format!("request {i}: which prefill worker may ship my KV?");
        let g = grpc::generate(
            &mut client,
            grpc::text_request(&prompt, 4, PrefillMode::Remote),
        )
        .await
        .map_err(|s| anyhow::anyhow!("request {i} failed: {s}"))?;
        let routing = g.last_routing.clone().expect("routing");
        assert_eq!(routing.prefill_worker, good, "request {i}: {routing:?}");
        assert!(!routing.fell_back, "{routing:?}");
    }

    let resp = http::get(cluster.metrics_addr(), "/metrics").await?;
    assert_eq!(resp.status, 200);
    let metrics = resp.text();
    let refused: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("dolphin_router_pairs_refused_total") && l.contains("kv_layout"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(refused >= 12.0, "refusals not counted: {metrics}");
    let log = cluster.router.process.output().join("\n");
    assert!(
        log.contains("prefill workers refused as partners") && log.contains(&odd),
        "no refusal logged: {log}"
    );
    cluster.passed();
    Ok(())
}

//! Metrics that operators can use: every query of the shipped Grafana board names a metric the
//! binaries declare, every `dolphin_*` metric the real router and workers export is declared in
//! its crate's metric module, and every histogram exports buckets (never a summary).

use std::collections::{BTreeMap, BTreeSet};

use dolphin_proto::v1::PrefillMode;
use dolphin_tests::{ClusterConfig, TestCluster, grpc, http};

const BOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/helm/dolphin/dashboards/dolphin.json"
);

/// Every metric name the crates declare, one list per crate's metric module.
fn declared() -> BTreeSet<&'static str> {
    [
        dolphin_router::metrics::ALL,
        dolphin_worker_common::metrics::ALL,
        dolphin_engine::metrics::ALL,
        dolphin_kv_transfer::metrics::ALL,
        dolphin_handoff::metrics::ALL,
        dolphin_cluster::telemetry::ALL,
    ]
    .into_iter()
    .flatten()
    .copied()
    .collect()
}

/// The metric names in a PromQL expression; a histogram's `_bucket`, `_sum` and `_count` series
/// count as the histogram.
fn names_in(expr: &str, declared: &BTreeSet<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("dolphin_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..len];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| declared.contains(b)))
            .unwrap_or(name);
        out.push(base.to_owned());
        rest = &tail[len..];
    }
    out
}

fn board_queries() -> anyhow::Result<Vec<(String, String)>> {
    fn walk(panel: &serde_json::Value, out: &mut Vec<(String, String)>) {
        let title = panel["title"].as_str().unwrap_or_default();
        for t in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((title.to_owned(), expr.to_owned()));
            }
        }
        for p in panel["panels"].as_array().into_iter().flatten() {
            walk(p, out);
        }
    }
    let board: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(BOARD)?)?;
    let mut out = Vec::new();
    for p in board["panels"].as_array().into_iter().flatten() {
        walk(p, &mut out);
    }
    Ok(out)
}

#[test]
fn every_board_query_names_a_declared_metric() -> anyhow::Result<()> {
    let declared = declared();
    let queries = board_queries()?;
    assert!(queries.len() > 30, "{} queries", queries.len());
    let mut used = BTreeSet::new();
    for (title, expr) in &queries {
        let names = names_in(expr, &declared);
        assert!(!names.is_empty(), "{title}: no dolphin metric in {expr}");
        for name in names {
            assert!(
                declared.contains(name.as_str()),
                "panel {title:?} queries {name}, which no crate declares: {expr}"
            );
            used.insert(name);
        }
        // Histograms are buckets now: a quantile label would select nothing.
        assert!(
            !expr.contains("quantile=\""),
            "{title}: summary query {expr}"
        );
    }
    // The board covers the engine, the KV transport and migration, not only the router.
    for must in [
        dolphin_engine::metrics::STEP_SECONDS,
        dolphin_engine::metrics::KV_BLOCKS_USED,
        dolphin_engine::metrics::PREFIX_CACHE_HIT_TOKENS_TOTAL,
        dolphin_kv_transfer::metrics::TRANSFER_SECONDS,
        dolphin_kv_transfer::metrics::TRANSFER_FAILURES_TOTAL,
        dolphin_router::metrics::MIGRATIONS_TOTAL,
    ] {
        assert!(used.contains(must), "the board does not show {must}");
    }
    Ok(())
}

/// `# TYPE` of every `dolphin_*` family in a Prometheus exposition.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            name.starts_with("dolphin_")
                .then(|| (name.to_owned(), kind.to_owned()))
        })
        .collect()
}

/// A free loopback port for a worker's `--metrics-addr` (workers do not print theirs).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::test]
async fn the_binaries_export_declared_metrics_with_histogram_buckets() -> anyhow::Result<()> {
    let (prefill_port, decode_port) = (free_port()?, free_port()?);
    let cluster = TestCluster::start(ClusterConfig {
        time_scale: 0.05,
        decode_args: vec![format!("--metrics-addr=127.0.0.1:{decode_port}")],
        prefill_args_each: vec![vec![format!("--metrics-addr=127.0.0.1:{prefill_port}")]],
        ..ClusterConfig::default()
    })
    .await?;
    let mut client = cluster.inference().await?;
    let prompt = "Metrics that operators can use: histograms with buckets, engine state, \
                  KV transfer bytes and failures, routing decisions by path and cluster.";
    for mode in [PrefillMode::Remote, PrefillMode::Local, PrefillMode::Local] {
        let g = grpc::generate(&mut client, grpc::text_request(prompt, 8, mode)).await?;
        assert_eq!(g.tokens.len(), 8, "{g:?}");
    }
    // Engine gauges are refreshed once a second.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let declared = declared();
    let mut exported = BTreeMap::new();
    for addr in [
        cluster.metrics_addr().to_owned(),
        format!("127.0.0.1:{prefill_port}"),
        format!("127.0.0.1:{decode_port}"),
    ] {
        let r = http::get(&addr, "/metrics").await?;
        assert_eq!(r.status, 200, "{addr}");
        exported.extend(families(&r.text()));
    }
    for (name, kind) in &exported {
        assert!(
            declared.contains(name.as_str()),
            "{name} is exported but declared in no crate's metric module"
        );
        assert_ne!(kind, "summary", "{name} is a summary, not a histogram");
    }
    for (name, kind) in [
        (dolphin_router::metrics::TTFT_SECONDS, "histogram"),
        (dolphin_router::metrics::ROUTE_SECONDS, "histogram"),
        (
            dolphin_worker_common::metrics::DECODE_TTFT_SECONDS,
            "histogram",
        ),
        (dolphin_engine::metrics::STEP_SECONDS, "histogram"),
        (dolphin_engine::metrics::BATCH_SIZE, "histogram"),
        (dolphin_engine::metrics::QUEUE_SECONDS, "histogram"),
        (dolphin_engine::metrics::RUNNING_REQUESTS, "gauge"),
        (dolphin_engine::metrics::KV_BLOCKS_USED, "gauge"),
        (
            dolphin_engine::metrics::PREFIX_CACHE_QUERIED_TOKENS_TOTAL,
            "counter",
        ),
        (dolphin_kv_transfer::metrics::SENT_BYTES_TOTAL, "counter"),
        (
            dolphin_kv_transfer::metrics::RECEIVED_BLOCKS_TOTAL,
            "counter",
        ),
        (dolphin_kv_transfer::metrics::TRANSFER_SECONDS, "histogram"),
        (dolphin_kv_transfer::metrics::TRANSFER_BYTES, "histogram"),
    ] {
        assert_eq!(
            exported.get(name).map(String::as_str),
            Some(kind),
            "{name}: {exported:?}"
        );
    }
    // The routing decision has microsecond buckets, request latencies millisecond ones.
    let router = http::get(cluster.metrics_addr(), "/metrics").await?.text();
    assert!(
        router.contains("dolphin_router_route_seconds_bucket{le=\"0.000001\"}"),
        "{router}"
    );
    assert!(
        router.contains("dolphin_router_ttft_seconds_bucket{mode=\"local\",le=\"0.001\"}"),
        "{router}"
    );
    cluster.passed();
    Ok(())
}

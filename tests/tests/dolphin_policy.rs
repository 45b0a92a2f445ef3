//! `--policy dolphin` end to end, with real etcd and the real binaries: with no table the
//! fallback decides (and the request log and `/metrics` say so); tables fitted from the router's
//! own request log with `dolphinctl tables fit`, stored and activated with `dolphinctl tables`,
//! decide every request (all-remote, then all-local, then rolled back); a bad table is refused
//! and the active one stays; a second decode worker changes the live split to one without a
//! table, and the fallback decides again.

use std::path::{Path, PathBuf};

use anyhow::Context;
use dolphin_proto::v1::{PrefillMode, PutTableRequest};
use dolphin_tests::binaries::dolphinctl;
use dolphin_tests::cluster::{READY_TIMEOUT, spawn};
use dolphin_tests::wait::{self, GENEROUS};
use dolphin_tests::{ClusterConfig, TestCluster, binaries, grpc, http};
use serde_json::Value;

/// What the fallback (`--fallback-policy threshold`) reports as its policy name.
const FALLBACK: &str = "dolphin-fallback/threshold";
/// Requests sent to fill the request log the tables are fitted from (5 per cluster at least).
const FIT_REQUESTS: usize = 12;
/// Requests sent per checked phase.
const PHASE_REQUESTS: usize = 4;

/// Runs a `dolphinctl tables` command against the cluster's router; it must succeed. Returns
/// its stdout.
async fn tables(url: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["tables", "--router-admin", url];
    all.extend_from_slice(args);
    let out = dolphinctl(&all).await?;
    anyhow::ensure!(
        out.status.success(),
        "dolphinctl {all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `dolphinctl tables list --json`.
async fn list(url: &str) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(
        &tables(url, &["list", "--json"]).await?,
    )?)
}

/// Waits until the router reports `split` as live, with table `version` loaded ("" for none).
async fn wait_live(url: &str, split: &str, version: &str) -> anyhow::Result<Value> {
    let what = format!("live split {split} with table {version:?}");
    wait::until(&what, GENEROUS, || async {
        let l = list(url).await.map_err(|e| format!("{e:#}"))?;
        if l["live_split"] == split && l["live_version"] == version {
            Ok(l)
        } else {
            Err(l.to_string())
        }
    })
    .await
}

/// Sends `n` requests with ids `{tag}-{i}` and prompts of varied lengths (so a fitted table
/// sees distinct points); each must succeed. Returns the ids and the routing of each.
async fn send(
    cluster: &TestCluster,
    tag: &str,
    n: usize,
) -> anyhow::Result<Vec<(String, dolphin_proto::v1::RoutingInfo)>> {
    let mut client = cluster.inference().await?;
    let mut out = Vec::new();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let prompt = format!("{tag} {i}: {}", "dolphins swim in pods ".repeat(1 + 3 * i));
        let mut req = grpc::text_request(&prompt, 4 + i as u32, PrefillMode::Unspecified);
        req.request_id = id.clone();
        let g = grpc::generate(&mut client, req)
            .await
            .map_err(|s| anyhow::anyhow!("request {id} failed: {s}"))?;
        anyhow::ensure!(!g.tokens.is_empty(), "request {id} produced nothing: {g:?}");
        let routing = g
            .last_routing
            .with_context(|| format!("{id}: no routing"))?;
        out.push((id, routing));
    }
    Ok(out)
}

/// The request log's records of `ids`, waiting until all are written (the log is written
/// asynchronously after each request ends).
async fn records(log: &Path, ids: &[String]) -> anyhow::Result<Vec<Value>> {
    wait::until(
        "the request log to hold every request",
        GENEROUS,
        || async {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let all: Vec<Value> = text
                .lines()
                .map(serde_json::from_str)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("bad log line ({e}): {text}"))?;
            let found: Vec<Value> = ids
                .iter()
                .filter_map(|id| all.iter().find(|r| r["request_id"] == id.as_str()).cloned())
                .collect();
            if found.len() == ids.len() {
                Ok(found)
            } else {
                Err(format!("{} of {} records written", found.len(), ids.len()))
            }
        },
    )
    .await
}

/// Sends a phase's requests and checks that each was decided by the table `version` (or the
/// fallback when `None`), taking `mode` when a table decided. Returns the log records.
async fn phase(
    cluster: &TestCluster,
    log: &Path,
    tag: &str,
    version: Option<&str>,
    mode: PrefillMode,
) -> anyhow::Result<Vec<Value>> {
    let sent = send(cluster, tag, PHASE_REQUESTS).await?;
    for (id, r) in &sent {
        match version {
            Some(_) => {
                assert_eq!(r.policy, "dolphin", "{id}: {r:?}");
                assert!((0..2).contains(&r.cluster), "{id}: {r:?}");
                assert_eq!(r.mode, mode as i32, "{id}: {r:?}");
            }
            None => {
                assert_eq!(r.policy, FALLBACK, "{id}: {r:?}");
                assert_eq!(r.cluster, -1, "{id}: {r:?}");
            }
        }
    }
    let ids: Vec<String> = sent.into_iter().map(|(id, _)| id).collect();
    let recs = records(log, &ids).await?;
    let prefill = cluster.prefill[0].id();
    for rec in &recs {
        assert_eq!(rec["outcome"], "ok", "{rec}");
        match version {
            Some(v) => {
                assert_eq!(rec["policy"], "dolphin", "{rec}");
                assert_eq!(rec["table_version"], v, "{rec}");
                assert!(rec["cluster"].as_i64().is_some_and(|c| c >= 0), "{rec}");
                if mode == PrefillMode::Remote {
                    assert_eq!(rec["decision"], "remote", "{rec}");
                    assert_eq!(rec["prefill_worker"], prefill, "{rec}");
                } else {
                    assert_eq!(rec["decision"], "local", "{rec}");
                    assert_eq!(rec["prefill_worker"], Value::Null, "{rec}");
                }
            }
            None => {
                assert_eq!(rec["policy"], FALLBACK, "{rec}");
                assert_eq!(rec["table_version"], Value::Null, "{rec}");
                assert_eq!(rec["cluster"], -1, "{rec}");
            }
        }
    }
    Ok(recs)
}

/// The value of metric line `series` (name and labels exactly as rendered) on `/metrics`.
async fn metric(cluster: &TestCluster, series: &str) -> anyhow::Result<Option<f64>> {
    let resp = http::get(cluster.metrics_addr(), "/metrics").await?;
    anyhow::ensure!(resp.status == 200, "/metrics: {}", resp.text());
    Ok(resp.text().lines().find_map(|l| {
        let value = l.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    }))
}

/// Fits a two-cluster table for 1p1d from the request log, with every bit set to `bits`.
async fn fit(log: &Path, bits: &str, out: &Path) -> anyhow::Result<Value> {
    let out_s = out.display().to_string();
    let log_s = log.display().to_string();
    let args = [
        "tables",
        "fit",
        "--log",
        &log_s,
        "--split",
        "1p1d",
        "--k",
        "2",
        "--bits",
        bits,
        "--workload",
        "e2e",
        "--out",
        &out_s,
    ];
    let o = dolphinctl(&args).await?;
    anyhow::ensure!(o.status.success(), "fit failed: {o:?}");
    let table: Value = serde_json::from_str(&std::fs::read_to_string(out)?)?;
    let want = u64::from(bits == "remote");
    assert_eq!(table["split"], "1p1d", "{table}");
    assert_eq!(table["bits"], serde_json::json!([want, want]), "{table}");
    Ok(table)
}

#[tokio::test]
async fn dolphin_policy_follows_the_active_table_of_the_live_split() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log: PathBuf = dir.path().join("requests.jsonl");
    let cluster = TestCluster::start(ClusterConfig {
        etcd: true,
        router_args: [
            "--policy",
            "dolphin",
            "--fallback-policy",
            "threshold",
            "--request-log",
        ]
        .map(str::to_owned)
        .into_iter()
        .chain([log.display().to_string()])
        .collect(),
        ..ClusterConfig::default()
    })
    .await?;
    let url = format!("http://{}", cluster.admin_addr());

    // No table yet: the fallback decides, and says so in routing info, log and metrics.
    let l = wait_live(&url, "1p1d", "").await?;
    assert_eq!(l["store"], "etcd", "{l}");
    let sent = send(&cluster, "fit", FIT_REQUESTS).await?;
    for (id, r) in &sent {
        assert_eq!(
            (r.policy.as_str(), r.cluster),
            (FALLBACK, -1),
            "{id}: {r:?}"
        );
    }
    let ids: Vec<String> = sent.into_iter().map(|(id, _)| id).collect();
    for rec in records(&log, &ids).await? {
        assert_eq!(rec["policy"], FALLBACK, "{rec}");
        assert_eq!(rec["table_version"], Value::Null, "{rec}");
        assert_eq!(rec["cluster"], -1, "{rec}");
    }
    let fallback_series = "dolphin_router_dolphin_fallback_decisions_total{fallback=\"threshold\"}";
    let fallbacks = metric(&cluster, fallback_series).await?.unwrap_or(0.0);
    assert!(
        fallbacks >= FIT_REQUESTS as f64,
        "fallback decisions: {fallbacks}"
    );
    assert_eq!(
        metric(&cluster, "dolphin_router_table_active").await?,
        Some(0.0)
    );

    // Two tables fitted from that log: all remote (v1) and all local (v2).
    let remote = dir.path().join("remote.json");
    let local = dir.path().join("local.json");
    let local_table = fit(&log, "local", &local).await?;
    fit(&log, "remote", &remote).await?;
    let remote_s = remote.display().to_string();
    let out = tables(&url, &["put", &remote_s]).await?;
    assert_eq!(out.trim(), "stored 1p1d/v1", "{out}");
    // Stored is not active: the fallback still decides.
    phase(&cluster, &log, "stored", None, PrefillMode::Unspecified).await?;
    let out = tables(&url, &["activate", "1p1d", "v1"]).await?;
    assert_eq!(out.trim(), "1p1d: active v1", "{out}");
    wait_live(&url, "1p1d", "v1").await?;
    phase(&cluster, &log, "v1", Some("v1"), PrefillMode::Remote).await?;
    assert_eq!(
        metric(&cluster, "dolphin_router_table_active").await?,
        Some(1.0)
    );

    let local_s = local.display().to_string();
    let out = tables(&url, &["put", &local_s]).await?;
    assert_eq!(out.trim(), "stored 1p1d/v2", "{out}");
    tables(&url, &["activate", "1p1d", "v2"]).await?;
    wait_live(&url, "1p1d", "v2").await?;
    phase(&cluster, &log, "v2", Some("v2"), PrefillMode::Local).await?;

    // A bad table is refused with a clear error, by dolphinctl and by the router; v2 stays.
    let mut bad = local_table.clone();
    bad["bits"] = serde_json::json!([0, 2]);
    let bad_path = dir.path().join("bad.json");
    std::fs::write(&bad_path, bad.to_string())?;
    let out = dolphinctl(&[
        "tables",
        "--router-admin",
        &url,
        "put",
        &bad_path.display().to_string(),
    ])
    .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        err.contains("not a valid table") && err.contains("bits[1] is 2"),
        "{err}"
    );
    let mut other = local_table.clone();
    other["split"] = "2p1d".into();
    let refused = cluster
        .admin()
        .await?
        .put_table(PutTableRequest {
            split: "1p1d".into(),
            version: String::new(),
            json: other.to_string(),
            activate: true,
        })
        .await
        .expect_err("a 2p1d table stored under 1p1d must be refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("for split 2p1d, not 1p1d"),
        "{refused:?}"
    );
    let l = wait_live(&url, "1p1d", "v2").await?;
    let split = l["splits"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["split"] == "1p1d"))
        .with_context(|| format!("no 1p1d in {l}"))?;
    assert_eq!(split["versions"], serde_json::json!(["v1", "v2"]), "{l}");
    assert_eq!(split["active"], "v2", "{l}");
    phase(&cluster, &log, "after-bad", Some("v2"), PrefillMode::Local).await?;

    // Rollback returns to v1.
    let out = tables(&url, &["rollback", "1p1d"]).await?;
    assert_eq!(out.trim(), "1p1d: rolled back to v1", "{out}");
    wait_live(&url, "1p1d", "v1").await?;
    phase(&cluster, &log, "rollback", Some("v1"), PrefillMode::Remote).await?;

    // A second decode worker: the live split is 1p2d, which has no table.
    let etcd = cluster.etcd_url().context("the cluster runs etcd")?;
    let args: Vec<String> = [
        "--grpc-addr",
        "127.0.0.1:0",
        "--engine",
        "sim",
        "--kv-addr",
        "127.0.0.1:0",
        "--sim-time-scale",
        "0.01",
        "--model",
        grpc::MODEL,
        "--etcd",
        &etcd,
    ]
    .map(str::to_owned)
    .to_vec();
    let mut extra = spawn(
        "decode-extra",
        &binaries::binary(binaries::DECODE_WORKER)?,
        args,
    )?;
    let ready = extra
        .wait_ready(READY_TIMEOUT)
        .await
        .with_context(|| extra.output().join("\n"))?;
    let prefill_ids = vec![cluster.prefill[0].id().to_owned()];
    let decode_ids = vec![
        cluster.decode[0].id().to_owned(),
        ready.id.clone().unwrap_or_default(),
    ];
    cluster.wait_for_workers(&prefill_ids, &decode_ids).await?;
    wait_live(&url, "1p2d", "").await?;
    phase(&cluster, &log, "1p2d", None, PrefillMode::Unspecified).await?;
    let now = metric(&cluster, fallback_series).await?.unwrap_or(0.0);
    assert!(
        now >= fallbacks + 2.0 * PHASE_REQUESTS as f64,
        "fallback decisions: {now}, was {fallbacks}"
    );
    assert_eq!(
        metric(&cluster, "dolphin_router_table_active").await?,
        Some(0.0)
    );
    drop(extra);
    cluster.passed();
    Ok(())
}

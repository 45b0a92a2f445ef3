//! The `dolphin` policy end to end inside the router: dispatcher, fake workers, table store.

use std::collections::BTreeSet;
use std::sync::Arc;

use dolphin_cluster::{Role, WorkerId};
use dolphin_proto::v1;

use super::split::Split;
use super::table::tests::kmeans_table;
use crate::dispatch::Dispatcher;
use crate::policy::{Decision, DolphinConfig, FallbackKind, Policy};
use crate::request_log::RequestLog;
use crate::testutil::{Behavior, FakeWorker, dispatcher, first_log_record, params};

fn dolphin_policy() -> Policy {
    Policy::Dolphin(DolphinConfig {
        fallback: FallbackKind::AlwaysLocal,
        ..Default::default()
    })
}

/// A table for `split` sending every request the same way.
fn uniform(split: Split, d: Decision) -> String {
    let bit = u8::from(d == Decision::Remote);
    kmeans_table(split, [bit, bit]).to_json_pretty()
}

async fn put_active(d: &Dispatcher, split: Split, version: &str, json: &str) {
    let store = d.table_store();
    store.put(split, Some(version), json).await.expect("put");
    store.activate(split, version).await.expect("activate");
}

/// Runs a request to its end; returns (decision, table version).
async fn run(d: &Arc<Dispatcher>, prompt: &str) -> (Decision, Option<String>) {
    let mut s = d.generate(params(prompt, 3)).await.expect("generate");
    let route = (
        s.route().decision,
        s.route().table_version.as_deref().map(str::to_owned),
    );
    loop {
        let delta = s.next().await.expect("not ended early").expect("no error");
        if delta.finish.is_some() {
            return route;
        }
    }
}

async fn cluster_with(prefill: usize) -> (Arc<Dispatcher>, Vec<FakeWorker>) {
    let d = dispatcher(dolphin_policy(), RequestLog::disabled());
    let mut fakes = vec![FakeWorker::start("d1", Role::Decode, Behavior::Text("ok".into())).await];
    for i in 0..prefill {
        let id = format!("p{i}");
        fakes.push(FakeWorker::start(&id, Role::Prefill, Behavior::Text("ok".into())).await);
    }
    for f in &fakes {
        d.registry().add(f.record()).expect("add");
    }
    (d, fakes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_swap_under_load_loses_no_request() {
    let (d, _fakes) = cluster_with(1).await;
    let s = Split::new(1, 1);
    put_active(&d, s, "v1", &uniform(s, Decision::Remote)).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (d, stop) = (d.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 1;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                // Odd versions remote, even ones local.
                let dec = if n % 2 == 1 {
                    Decision::Remote
                } else {
                    Decision::Local
                };
                put_active(&d, s, &format!("v{n}"), &uniform(s, dec)).await;
                tokio::task::yield_now().await;
            }
            n
        })
    };
    let mut clients = Vec::new();
    for c in 0..6 {
        let d = d.clone();
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..40 {
                seen.push(run(&d, &format!("client {c} request {i}")).await);
            }
            seen
        }));
    }
    let mut versions = BTreeSet::new();
    let mut total = 0;
    for c in clients {
        for (decision, version) in c.await.expect("client task") {
            let version = version.expect("every request decided by a table");
            let n: u32 = version[1..].parse().expect("vN");
            // Each request saw one whole table: its decision matches its version's bits.
            let expect = if n % 2 == 1 {
                Decision::Remote
            } else {
                Decision::Local
            };
            assert_eq!(decision, expect, "request decided by {version}");
            versions.insert(version);
            total += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.await.expect("swapper");
    assert_eq!(total, 240, "every request finished");
    assert!(swaps > 2, "tables were swapped during the load");
    assert!(
        versions.len() >= 2,
        "requests saw several versions: {versions:?}"
    );
}

#[tokio::test]
async fn adding_a_worker_that_changes_the_split_switches_tables() {
    let (d, _fakes) = cluster_with(1).await;
    let (s11, s21) = (Split::new(1, 1), Split::new(2, 1));
    put_active(&d, s11, "remote-all", &uniform(s11, Decision::Remote)).await;
    put_active(&d, s21, "local-all", &uniform(s21, Decision::Local)).await;
    assert_eq!(
        run(&d, "before").await,
        (Decision::Remote, Some("remote-all".into()))
    );
    let extra = FakeWorker::start("p-extra", Role::Prefill, Behavior::Text("ok".into())).await;
    d.registry().add(extra.record()).expect("add");
    assert_eq!(d.registry().split(), s21);
    assert_eq!(
        run(&d, "after").await,
        (Decision::Local, Some("local-all".into()))
    );
    d.registry().remove(&WorkerId::from("p-extra"));
    assert_eq!(run(&d, "again").await.1.as_deref(), Some("remote-all"));
    // A split without a table: the fallback (always-local here) decides.
    d.registry().remove(&WorkerId::from("p0"));
    let r = d.route(&[5; 40], 4, None, &[]).expect("route");
    assert_eq!(
        (r.decided_by.label(), r.cluster, r.decision),
        ("dolphin-fallback/always-local", None, Decision::Local)
    );
}

#[tokio::test]
async fn bad_tables_are_refused_through_the_admin_api() {
    let (d, _fakes) = cluster_with(1).await;
    let s = Split::new(1, 1);
    put_active(&d, s, "v1", &uniform(s, Decision::Remote)).await;
    let bad =
        uniform(s, Decision::Remote).replace("\"schema_version\": 1", "\"schema_version\": 99");
    let err = super::admin::put_table(
        &d,
        v1::PutTableRequest {
            split: "1p1d".into(),
            version: String::new(),
            json: bad,
            activate: true,
        },
    )
    .await
    .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("schema_version"),
        "{}",
        err.message()
    );
    let wrong = super::admin::put_table(
        &d,
        v1::PutTableRequest {
            split: "1p1d".into(),
            json: uniform(Split::new(3, 1), Decision::Local),
            ..Default::default()
        },
    )
    .await
    .expect_err("split mismatch");
    assert!(wrong.message().contains("3p1d"), "{}", wrong.message());
    assert_eq!(run(&d, "still v1").await.1.as_deref(), Some("v1"));
    let listed = super::admin::list_tables(&d).await.expect("list");
    assert_eq!(listed.live_split, "1p1d");
    assert_eq!(listed.live_version, "v1");
    assert_eq!(listed.store, "memory");
    assert_eq!(listed.splits[0].versions, vec!["v1"]);
    // Versions are immutable; rollback needs history.
    let dup = d
        .table_store()
        .put(s, Some("v1"), &uniform(s, Decision::Local))
        .await;
    assert!(matches!(dup, Err(super::StoreError::VersionExists { .. })));
    let none = super::admin::rollback_table(
        &d,
        v1::RollbackTableRequest {
            split: "1p1d".into(),
        },
    )
    .await
    .expect_err("nothing to roll back");
    assert_eq!(none.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test]
async fn request_log_and_routing_info_carry_cluster_and_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("log.jsonl");
    let d = dispatcher(
        dolphin_policy(),
        RequestLog::open(&path).await.expect("log"),
    );
    let dw = FakeWorker::start("d1", Role::Decode, Behavior::Text("ok".into())).await;
    d.registry().add(dw.record()).expect("add");
    let s = Split::new(0, 1);
    put_active(&d, s, "v7", &uniform(s, Decision::Local)).await;
    let mut stream = d.generate(params("a prompt", 2)).await.expect("generate");
    let routing = stream.routing();
    assert_eq!((routing.cluster, routing.policy.as_str()), (0, "dolphin"));
    while let Some(delta) = stream.next().await {
        if delta.expect("ok").finish.is_some() {
            break;
        }
    }
    drop(stream);
    let v = first_log_record(&path).await;
    assert_eq!(v["cluster"], 0);
    assert_eq!(v["table_version"], "v7");
    assert_eq!(v["policy"], "dolphin");
    assert_eq!(v["output_class"], "short");
    assert_eq!(v["admission"]["max_tokens"], 2);
    assert_eq!(v["features"]["output_len_hint"], 2, "capped by max_tokens");
}

#[tokio::test]
async fn stale_workers_are_estimated_from_what_was_routed_to_them() {
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    // Nothing listens there: the worker's event stream never comes up, so it stays stale.
    let rec = dolphin_cluster::WorkerRecord {
        id: WorkerId::from("d-stale"),
        role: Role::Decode,
        grpc_addr: "127.0.0.1:9".into(),
        kv_addr: None,
        model: "sim-model".into(),
        block_size: crate::testutil::BS,
        version: dolphin_cluster::BUILD_VERSION.into(),
        kv_layout: String::new(),
        context_length: 0,
    };
    d.registry().add(rec).expect("add");
    let prompt: Vec<u32> = (3..43).collect(); // 40 tokens: 10 blocks of 4
    let first = d.route(&prompt, 4, None, &[]).expect("route");
    assert_eq!(first.decode.cached_blocks, 0);
    let again = d.route(&prompt, 4, None, &[]).expect("route");
    assert_eq!(
        again.decode.cached_blocks, 10,
        "estimated from the first routing"
    );
    assert_eq!(again.features.eff_isl_decode, 0);
    // A cache salt names the same prompt's blocks apart: none cached under it yet, then its
    // own.
    let root = dolphin_cluster::salted_root("tenant-a");
    let salted = d.route_from(root, &prompt, 4, None, &[]).expect("route");
    assert_eq!(salted.decode.cached_blocks, 0, "not the unsalted blocks");
    let salted = d.route_from(root, &prompt, 4, None, &[]).expect("route");
    assert_eq!(salted.decode.cached_blocks, 10);
}

#[tokio::test]
async fn online_learning_explores_live_requests_and_publishes_the_better_path() {
    use crate::dolphin::online::OnlineConfig;
    use crate::dolphin::table::TableSlo;
    let policy = Policy::Dolphin(DolphinConfig {
        fallback: FallbackKind::AlwaysLocal,
        online: OnlineConfig {
            enabled: true,
            explore_share: 0.5,
            min_samples: 5,
            half_life: 20,
            ..OnlineConfig::default()
        },
        ..Default::default()
    });
    let d = dispatcher(policy, RequestLog::disabled());
    let dw = FakeWorker::start("d1", Role::Decode, Behavior::Text("ok".into())).await;
    let pw = FakeWorker::start("p1", Role::Prefill, Behavior::Text("ok".into())).await;
    d.registry().add(dw.record()).expect("add");
    d.registry().add(pw.record()).expect("add");
    // Remote prefill is slow here: its requests miss a 100 ms budget that local ones meet.
    *dw.state.remote_delay.lock() = std::time::Duration::from_millis(400);
    let s = Split::new(1, 1);
    let mut t = kmeans_table(s, [1, 1]);
    t.slo = TableSlo {
        ttft_ms: 100.0,
        tpot_ms: 1.0,
    };
    put_active(&d, s, "v1", &t.to_json_pretty()).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    d.spawn_online(shutdown.clone());
    let mut seen = BTreeSet::new();
    let mut published = None;
    for i in 0..80 {
        let mut stream = d
            .generate(params(&format!("prompt {i}"), 3))
            .await
            .expect("generate");
        let r = stream.routing();
        seen.insert((r.policy.clone(), stream.route().decision.as_str()));
        while let Some(delta) = stream.next().await {
            if delta.expect("ok").finish.is_some() {
                break;
            }
        }
        drop(stream);
        let active = d.dolphin().table(s).expect("table");
        if &*active.version != "v1" {
            published = Some(active);
            break;
        }
    }
    shutdown.cancel();
    assert!(
        seen.contains(&("dolphin-explore".to_owned(), "local")),
        "{seen:?}"
    );
    assert!(seen.contains(&("dolphin".to_owned(), "remote")));
    let t = published.expect("the learner published a table");
    assert_eq!(t.table.table().bits[0], 0, "cluster 0 now prefills locally");
    assert!(
        t.table
            .table()
            .provenance
            .notes
            .contains("cluster 0 to local")
    );
    // Requests the table decides now take the new bit (explored ones go remote).
    let mut by_table = Vec::new();
    for i in 0..6 {
        let stream = d
            .generate(params(&format!("after the flip {i}"), 3))
            .await
            .expect("generate");
        let r = stream.route();
        assert_eq!(r.table_version.as_deref(), Some(&*t.version));
        if r.decided_by == crate::policy::DecidedBy::Table {
            by_table.push(r.decision);
        }
    }
    assert!(!by_table.is_empty() && by_table.iter().all(|d| *d == Decision::Local));
}

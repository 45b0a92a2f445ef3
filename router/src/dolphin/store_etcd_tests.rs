//! The etcd table store against a real etcd: two routers, one writing, both following.

use dolphin_cluster::testing::EtcdServer;

use super::*;
use crate::dolphin::table::tests::kmeans_table;
use crate::policy::{Decision, Features, PoolState};
use crate::testutil::eventually;

fn table(split: Split, bit: u8) -> String {
    kmeans_table(split, [bit, bit]).to_json_pretty()
}

const IDLE: PoolState = PoolState::IDLE;

fn version(r: &DolphinRouting, split: Split) -> Option<String> {
    r.table(split).map(|t| t.version.to_string())
}

fn decide(r: &DolphinRouting, split: Split) -> Decision {
    let f = Features {
        isl: 100,
        eff_isl_prefill: 100,
        eff_isl_decode: 100,
        output_len_hint: 10,
    };
    let fallback = crate::policy::DolphinConfig {
        fallback: crate::policy::FallbackKind::AlwaysLocal,
        ..Default::default()
    };
    let policy = crate::policy::Policy::Dolphin(fallback);
    r.with_table(split, |t| crate::route::decide(f, IDLE, &policy, t, None))
        .expect("not forced")
        .decision
}

#[tokio::test]
async fn tables_are_stored_activated_rolled_back_and_followed() {
    let etcd = EtcdServer::start().await;
    let endpoints = vec![etcd.endpoint()];
    let s = Split::new(3, 1);
    let writer_routing = Arc::new(DolphinRouting::new());
    let writer = EtcdStore::connect(
        &dolphin_cluster::EtcdConfig::new(endpoints.clone(), "c1"),
        writer_routing.clone(),
    )
    .await
    .expect("connect");
    // A second router only follows.
    let follower_routing = Arc::new(DolphinRouting::new());
    let follower = EtcdStore::connect(
        &dolphin_cluster::EtcdConfig::new(endpoints.clone(), "c1"),
        follower_routing.clone(),
    )
    .await
    .expect("connect");
    let shutdown = CancellationToken::new();
    follower.spawn_watcher(shutdown.clone());

    let v1 = writer.put(s, None, &table(s, 1)).await.expect("put");
    assert_eq!(v1, "v1");
    let v2 = writer.put(s, None, &table(s, 0)).await.expect("put");
    assert_eq!(v2, "v2");
    assert!(matches!(
        writer.put(s, Some("v1"), &table(s, 0)).await,
        Err(StoreError::VersionExists { .. })
    ));
    assert!(matches!(
        writer.put(s, Some("x"), &table(Split::new(1, 1), 0)).await,
        Err(StoreError::Table(_))
    ));
    assert!(matches!(
        writer.activate(s, "v9").await,
        Err(StoreError::NotFound(_))
    ));
    writer.activate(s, "v1").await.expect("activate");
    // The writer applies at once; the follower through its watch.
    assert_eq!(version(&writer_routing, s).as_deref(), Some("v1"));
    eventually("follower loads v1", || {
        version(&follower_routing, s).as_deref() == Some("v1")
    })
    .await;
    assert_eq!(decide(&follower_routing, s), Decision::Remote);

    let p = writer.activate(s, "v2").await.expect("activate");
    assert_eq!(p.history, vec!["v1"]);
    eventually("follower loads v2", || {
        version(&follower_routing, s).as_deref() == Some("v2")
    })
    .await;
    assert_eq!(decide(&follower_routing, s), Decision::Local);

    // Someone writes a broken table straight into etcd and points the split at it: both
    // routers refuse it and keep v2.
    let mut raw = writer.client.clone();
    raw.put(table_key("c1", s, "v3"), "{\"schema_version\": 1}", None)
        .await
        .expect("raw put");
    let pointer = ActivePointer::activate(Some(&p), "v3");
    raw.put(
        active_key("c1", s),
        serde_json::to_string(&pointer).expect("json"),
        None,
    )
    .await
    .expect("raw put");
    eventually("follower refuses v3", || {
        follower_routing
            .status()
            .get(&s)
            .is_some_and(|st| st.refused.contains("v3"))
    })
    .await;
    assert_eq!(version(&follower_routing, s).as_deref(), Some("v2"));
    assert!(matches!(
        writer.activate(s, "v3").await,
        Err(StoreError::Table(_))
    ));

    // Rolling back from the broken pointer returns to v2, then to v1.
    let back = writer.rollback(s).await.expect("rollback");
    assert_eq!(back.version, "v2");
    let back = writer.rollback(s).await.expect("rollback");
    assert_eq!((back.version.as_str(), back.history.len()), ("v1", 0));
    eventually("follower back on v1", || {
        version(&follower_routing, s).as_deref() == Some("v1")
    })
    .await;
    assert!(matches!(
        writer.rollback(s).await,
        Err(StoreError::NothingToRollBack(_))
    ));

    // The classifier travels the same way; a bad one is refused before it is stored.
    assert!(writer.put_classifier("{}").await.is_err());
    let mut c = crate::dolphin::OutputClassifier::prior();
    c.provenance.source = "trained.jsonl".into();
    writer
        .put_classifier(&c.to_json_pretty())
        .await
        .expect("put classifier");
    eventually("follower loads the classifier", || {
        follower_routing.classifier().provenance.source == "trained.jsonl"
    })
    .await;

    // Another cluster name sees none of it.
    let other = EtcdStore::connect(
        &dolphin_cluster::EtcdConfig::new(endpoints.clone(), "c2"),
        Arc::new(DolphinRouting::new()),
    )
    .await
    .expect("connect");
    assert!(other.snapshot().await.expect("snapshot").splits.is_empty());
    let snap = writer.snapshot().await.expect("snapshot");
    assert_eq!(
        snap.splits[&s].versions.keys().collect::<Vec<_>>(),
        ["v1", "v2", "v3"]
    );
    shutdown.cancel();
}

#[tokio::test]
async fn the_watcher_resyncs_after_etcd_restarts() {
    let mut etcd = EtcdServer::start().await;
    let endpoints = vec![etcd.endpoint()];
    let s = Split::new(1, 1);
    let routing = Arc::new(DolphinRouting::new());
    let store = EtcdStore::connect(
        &dolphin_cluster::EtcdConfig::new(endpoints.clone(), "c"),
        routing.clone(),
    )
    .await
    .expect("connect");
    let shutdown = CancellationToken::new();
    store.spawn_watcher(shutdown.clone());
    store.put(s, Some("a"), &table(s, 1)).await.expect("put");
    store.activate(s, "a").await.expect("activate");
    etcd.restart().await;
    // Written by another client after the restart: the watcher must resync to see it.
    let writer = EtcdStore::connect(
        &dolphin_cluster::EtcdConfig::new(endpoints.clone(), "c"),
        Arc::new(DolphinRouting::new()),
    )
    .await
    .expect("connect");
    // etcd may still be electing itself leader: retry until the write lands (a retry after a
    // lost answer finds the version already there, which is as good).
    for attempt in 0.. {
        match writer.put(s, Some("b"), &table(s, 0)).await {
            Ok(_) | Err(StoreError::VersionExists { .. }) => break,
            Err(e) if attempt < 100 => {
                tracing::debug!(error = %e, "etcd not ready yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("put after restart: {e}"),
        }
    }
    writer.activate(s, "b").await.expect("activate");
    eventually("watcher loads b", || {
        version(&routing, s).as_deref() == Some("b")
    })
    .await;
    shutdown.cancel();
}

use super::*;
use crate::dolphin::online::OnlineConfig;
use crate::dolphin::store::MemoryStore;
use crate::dolphin::table::RoutingTable;
use crate::dolphin::table::tests::kmeans_table;
use crate::policy::{DolphinConfig, FallbackKind};

fn online(enabled: bool) -> Policy {
    Policy::Dolphin(DolphinConfig {
        online: OnlineConfig {
            enabled,
            explore_share: 0.5,
            min_samples: 10,
            half_life: 100,
            ..OnlineConfig::default()
        },
        ..DolphinConfig::default()
    })
}

fn service(policy: Policy) -> (OnlineService, Arc<DolphinRouting>, Arc<MemoryStore>) {
    let routing = Arc::new(DolphinRouting::new());
    let store = Arc::new(MemoryStore::new(routing.clone()));
    let s = store.clone();
    let svc = OnlineService::new(OnlineHost {
        routing: routing.clone(),
        policy: Box::new(move || policy),
        store: Box::new(move || s.clone() as Arc<dyn TableStore>),
    });
    (svc, routing, store)
}

async fn install(store: &MemoryStore, t: &RoutingTable) -> String {
    let v = store
        .put(t.split, None, &t.to_json_pretty())
        .await
        .expect("put");
    store.activate(t.split, &v).await.expect("activate");
    v
}

/// Request `i` of `cluster`: alone on its worker (the previous one finished before it came).
fn finished(i: u32, split: Split, version: Option<&str>, path: Decision, met: bool) -> Finished {
    let arrived_ms = f64::from(i) * 1000.0;
    Finished {
        ticket: LearnTicket {
            split,
            version: version.map(Arc::from),
        },
        cluster: Some(0),
        decision: path,
        decided_by: DecidedBy::Table,
        decode_worker: Arc::from("d0"),
        arrived_ms,
        done_ms: arrived_ms + 500.0,
        ttft_ms: 100.0,
        tpot_ms: 10.0,
        tokens: 10,
        ok: met,
    }
}

#[tokio::test]
async fn a_significantly_better_path_is_published_as_a_new_active_version() {
    let split = Split::new(1, 1);
    let (mut svc, routing, store) = service(online(true));
    let v1 = install(&store, &kmeans_table(split, [0, 0])).await;
    let mut i = 0;
    // Local (the bit) always misses, remote always meets.
    while routing.table(split).expect("table").version.as_ref() == v1.as_str() && i < 200 {
        let path = if i % 2 == 0 {
            Decision::Local
        } else {
            Decision::Remote
        };
        svc.handle(finished(
            i,
            split,
            Some(&v1),
            path,
            path == Decision::Remote,
        ))
        .await;
        i += 1;
    }
    let t = routing.table(split).expect("table");
    assert_eq!(&*t.version, "v2", "published after {i} outcomes");
    assert_eq!(t.table.table().bits, vec![1, 0]);
    assert!(
        t.table
            .table()
            .provenance
            .notes
            .contains("cluster 0 to remote")
    );
    let snap = store.snapshot().await.expect("snapshot");
    let active = snap.splits[&split].active.as_ref().expect("active");
    assert_eq!(
        (active.version.as_str(), active.history.clone()),
        ("v2", vec![v1.clone()])
    );
    // The explorer follows the new version, and outcomes of the old one are not credited.
    assert!(routing.explorer(split, "v2").is_some());
    assert!(routing.explorer(split, &v1).is_none());
    for j in 0..50 {
        svc.handle(finished(i + j, split, Some(&v1), Decision::Local, true))
            .await;
    }
    assert_eq!(&*routing.table(split).expect("table").version, "v2");

    // An operator's rollback to the version before: the learner starts over on it.
    store.rollback(split).await.expect("rollback");
    svc.handle(finished(i + 55, split, Some(&v1), Decision::Local, true))
        .await;
    assert!(routing.explorer(split, &v1).is_some());
    assert!(routing.explorer(split, "v2").is_none());

    // An operator's new version: the learner starts over on it.
    let v3 = install(&store, &kmeans_table(split, [0, 1])).await;
    svc.handle(finished(i + 60, split, Some(&v3), Decision::Local, true))
        .await;
    assert!(routing.explorer(split, &v3).is_some());
}

#[tokio::test]
async fn a_split_without_a_table_is_seeded_from_the_nearest_one_once() {
    let (mut svc, routing, store) = service(online(true));
    install(&store, &kmeans_table(Split::new(2, 2), [1, 0])).await;
    install(&store, &kmeans_table(Split::new(8, 8), [0, 0])).await;
    let new = Split::new(3, 1);
    let fallback = Finished {
        cluster: None,
        decided_by: DecidedBy::Fallback(FallbackKind::Threshold),
        ..finished(0, new, None, Decision::Remote, true)
    };
    svc.handle(fallback.clone()).await;
    let t = routing.table(new).expect("seeded");
    assert_eq!(t.table.table().bits, vec![1, 0], "2p2d's bits, as priors");
    assert!(t.table.table().evidence.iter().all(|e| e.requests == 0));
    assert!(
        t.table
            .table()
            .provenance
            .notes
            .contains("seeded from 2p2d/v1")
    );
    // Not again while the retry interval runs, even if the table went away.
    svc.handle(fallback).await;
    let snap = store.snapshot().await.expect("snapshot");
    assert_eq!(snap.splits[&new].versions.len(), 1);
}

#[tokio::test]
async fn nothing_is_learned_or_published_with_online_learning_off() {
    let split = Split::new(1, 1);
    let (mut svc, routing, store) = service(online(false));
    let v1 = install(&store, &kmeans_table(split, [0, 0])).await;
    for i in 0..200 {
        let path = if i % 2 == 0 {
            Decision::Local
        } else {
            Decision::Remote
        };
        svc.handle(finished(
            i,
            split,
            Some(&v1),
            path,
            path == Decision::Remote,
        ))
        .await;
    }
    svc.handle(finished(300, Split::new(3, 1), None, Decision::Local, true))
        .await;
    let snap = store.snapshot().await.expect("snapshot");
    assert_eq!(snap.splits.len(), 1);
    assert_eq!(snap.splits[&split].versions.len(), 1);
    assert!(routing.explorer(split, &v1).is_none());
}

#[tokio::test]
async fn a_full_inbox_drops_outcomes_not_requests() {
    let (sink, mut rx) = OnlineSink::channel();
    let f = finished(0, Split::new(1, 1), None, Decision::Local, true);
    for _ in 0..QUEUE + 10 {
        sink.send(f.clone());
    }
    let mut n = 0;
    while rx.try_recv().is_ok() {
        n += 1;
    }
    assert_eq!(n, QUEUE);
}

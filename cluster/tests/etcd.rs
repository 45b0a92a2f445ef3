//! etcd discovery against a real etcd (`/usr/bin/etcd`) on loopback ports.
//!
//! Waits are bounded by a generous deadline only so a broken build fails instead of hanging;
//! no test asserts how long anything took.

use std::collections::BTreeMap;
use std::time::Duration;

use dolphin_cluster::testing::EtcdServer;
use dolphin_cluster::{
    DiscoveryError, EtcdConfig, MembershipEvent, Registration, Role, WorkerId, WorkerRecord,
    watch_workers, worker_key,
};
use tokio::sync::mpsc::Receiver;

/// Guards every wait against a hang; far above anything a healthy run needs.
const PATIENCE: Duration = Duration::from_secs(45);

fn config(etcd: &EtcdServer, cluster: &str, ttl: i64) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        cluster: cluster.into(),
        lease_ttl_secs: ttl,
        tls: None,
    }
}

fn record(id: &str, role: Role) -> WorkerRecord {
    WorkerRecord {
        id: WorkerId::from(id),
        role,
        grpc_addr: "127.0.0.1:7000".into(),
        kv_addr: (role == Role::Decode).then(|| "127.0.0.1:7001".into()),
        model: "sim-model".into(),
        block_size: 16,
        version: dolphin_cluster::BUILD_VERSION.into(),
        kv_layout: String::new(),
        context_length: 0,
    }
}

async fn next_event(rx: &mut Receiver<MembershipEvent>) -> MembershipEvent {
    match tokio::time::timeout(PATIENCE, rx.recv()).await {
        Ok(Some(event)) => event,
        Ok(None) => panic!("membership stream ended"),
        Err(_) => panic!("no membership event within {PATIENCE:?}"),
    }
}

/// Applies events to `view` until it equals `expected`.
async fn converge(
    rx: &mut Receiver<MembershipEvent>,
    view: &mut BTreeMap<WorkerId, WorkerRecord>,
    expected: &[&WorkerRecord],
) {
    let expected: BTreeMap<WorkerId, WorkerRecord> = expected
        .iter()
        .map(|r| (r.id.clone(), (*r).clone()))
        .collect();
    while *view != expected {
        match next_event(rx).await {
            MembershipEvent::Up(r) => view.insert(r.id.clone(), r),
            MembershipEvent::Down(id) => view.remove(&id),
        };
    }
}

/// The lease attached to `key`, if the key exists.
async fn lease_of(etcd: &EtcdServer, key: &str) -> Option<i64> {
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("connect");
    let response = client.get(key, None).await.expect("get");
    response.kvs().first().map(|kv| kv.lease())
}

#[tokio::test]
async fn register_is_seen_up_and_shutdown_down() {
    let etcd = EtcdServer::start().await;
    let cfg = config(&etcd, "c1", 10);
    let mut watcher = watch_workers(&cfg).await.expect("watch");

    let decode = record("decode-00000001", Role::Decode);
    let registration = Registration::register(&cfg, decode.clone())
        .await
        .expect("register");
    assert_eq!(
        registration.key(),
        worker_key("c1", Role::Decode, &decode.id)
    );
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Up(decode.clone())
    );

    // A worker in another cluster is invisible here; a late watcher gets the snapshot.
    let other = Registration::register(&config(&etcd, "c10", 10), record("decode-x", Role::Decode))
        .await
        .expect("register elsewhere");
    let mut late = watch_workers(&cfg).await.expect("late watch");
    assert_eq!(
        next_event(&mut late).await,
        MembershipEvent::Up(decode.clone())
    );

    registration.shutdown().await.expect("shutdown");
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Down(decode.id.clone())
    );
    assert_eq!(
        next_event(&mut late).await,
        MembershipEvent::Down(decode.id.clone())
    );
    assert_eq!(
        lease_of(&etcd, &worker_key("c1", Role::Decode, &decode.id)).await,
        None
    );
    other.shutdown().await.expect("shutdown other");
}

#[tokio::test]
async fn duplicate_id_is_refused_until_the_holder_leaves() {
    let etcd = EtcdServer::start().await;
    let cfg = config(&etcd, "dup", 10);
    let prefill = record("prefill-00000001", Role::Prefill);
    let first = Registration::register(&cfg, prefill.clone())
        .await
        .expect("register");
    match Registration::register(&cfg, prefill.clone()).await {
        Err(DiscoveryError::AlreadyRegistered { key }) => assert_eq!(key, first.key()),
        other => panic!("expected AlreadyRegistered, got {other:?}"),
    }
    first.shutdown().await.expect("shutdown");
    let second = Registration::register(&cfg, prefill)
        .await
        .expect("register after leave");
    second.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn revoked_lease_is_replaced_and_the_worker_comes_back() {
    let etcd = EtcdServer::start().await;
    let cfg = config(&etcd, "revoke", 10);
    let mut watcher = watch_workers(&cfg).await.expect("watch");
    let decode = record("decode-0000beef", Role::Decode);
    let registration = Registration::register(&cfg, decode.clone())
        .await
        .expect("register");
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Up(decode.clone())
    );

    let old_lease = lease_of(&etcd, registration.key())
        .await
        .expect("key present");
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("connect");
    client
        .lease_revoke(old_lease)
        .await
        .expect("revoke from outside");

    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Down(decode.id.clone())
    );
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Up(decode.clone())
    );
    let new_lease = lease_of(&etcd, registration.key())
        .await
        .expect("key restored");
    assert_ne!(new_lease, old_lease);

    // A key deleted by hand while the lease lives is written back too.
    client
        .delete(registration.key(), None)
        .await
        .expect("delete by hand");
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Down(decode.id.clone())
    );
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Up(decode.clone())
    );

    registration.shutdown().await.expect("shutdown");
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Down(decode.id)
    );
}

#[tokio::test]
async fn lease_expiry_removes_a_worker_whose_keep_alive_stopped() {
    let etcd = EtcdServer::start().await;
    let cfg = config(&etcd, "expiry", 2);
    let mut watcher = watch_workers(&cfg).await.expect("watch");
    let prefill = record("prefill-0000dead", Role::Prefill);
    let registration = Registration::register(&cfg, prefill.clone())
        .await
        .expect("register");
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Up(prefill.clone())
    );
    let key = registration.key().to_owned();

    // Dropping stops the keep-alive without revoking, like a crashed worker.
    drop(registration);
    assert_eq!(
        next_event(&mut watcher).await,
        MembershipEvent::Down(prefill.id)
    );
    assert_eq!(lease_of(&etcd, &key).await, None);
}

#[tokio::test]
async fn watcher_and_registration_survive_an_etcd_restart() {
    let mut etcd = EtcdServer::start().await;
    let cfg = config(&etcd, "restart", 5);
    let mut watcher = watch_workers(&cfg).await.expect("watch");
    let mut view = BTreeMap::new();

    let a = record("decode-0000000a", Role::Decode);
    let b = record("prefill-0000000b", Role::Prefill);
    let reg_a = Registration::register(&cfg, a.clone())
        .await
        .expect("register a");
    let reg_b = Registration::register(&config(&etcd, "restart", 2), b.clone())
        .await
        .expect("register b");
    converge(&mut watcher, &mut view, &[&a, &b]).await;

    // While etcd is down, b stops its keep-alive: its lease survives the restart but then
    // expires. a keeps trying and must find its lease (and record) again.
    etcd.kill();
    drop(reg_b);
    etcd.restart().await;
    let c = record("decode-0000000c", Role::Decode);
    let reg_c = Registration::register(&cfg, c.clone())
        .await
        .expect("register c");
    converge(&mut watcher, &mut view, &[&a, &c]).await;

    // Both live registrations still own their keys: shutdown removes them.
    reg_a.shutdown().await.expect("shutdown a");
    reg_c.shutdown().await.expect("shutdown c");
    converge(&mut watcher, &mut view, &[]).await;
}

#[tokio::test]
async fn unreachable_etcd_is_an_error_not_a_hang() {
    let etcd = EtcdServer::start().await;
    let cfg = config(&etcd, "down", 10);
    drop(etcd);
    let err = Registration::register(&cfg, record("decode-1", Role::Decode))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            DiscoveryError::Etcd(_) | DiscoveryError::Timeout { .. }
        ),
        "{err:?}"
    );
    let err = watch_workers(&cfg).await.unwrap_err();
    assert!(
        matches!(
            err,
            DiscoveryError::Etcd(_) | DiscoveryError::Timeout { .. }
        ),
        "{err:?}"
    );
}

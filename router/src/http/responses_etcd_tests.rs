//! Responses kept in a real etcd (`--responses-etcd-ttl`): two routers share them, they end
//! after their TTL, a lost lease is replaced, and an unreachable etcd fails only what needs it.

use std::time::Duration;

use dolphin_cluster::testing::EtcdServer;

use super::super::response_store::ResponseStore;
use super::super::response_store_etcd::EtcdResponses;
use super::*;

async fn etcd_store(etcd: &EtcdServer, ttl: Duration) -> ResponseStore {
    let cfg = dolphin_cluster::EtcdConfig::new(vec![etcd.endpoint()], "c");
    ResponseStore::etcd(EtcdResponses::connect(&cfg, ttl).await.expect("connect"))
}

/// A router in front of `d` keeping responses in `store`.
async fn router_with(d: Arc<Dispatcher>, store: ResponseStore) -> Server {
    let state = AppState {
        dispatcher: d,
        metrics: Some(dolphin_cluster::init_metrics()),
        api_keys: None,
        limit: InflightLimit::new(16),
        responses: store,
    };
    serve_state(state, None).await
}

async fn get(s: &Server, id: &str) -> (StatusCode, Value) {
    let (status, _, body) = call(s.addr, Method::GET, &format!("/v1/responses/{id}"), "").await;
    (status, parse(&body))
}

#[tokio::test]
async fn routers_share_responses_kept_in_etcd() {
    let mut etcd = EtcdServer::start().await;
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("abc".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let ttl = Duration::from_secs(600);
    let a = router_with(d.clone(), etcd_store(&etcd, ttl).await).await;
    let b = router_with(d.clone(), etcd_store(&etcd, ttl).await).await;

    // Kept by A, read and continued through B.
    let first = json!({"input": "Remember the word pelican.", "max_output_tokens": 3});
    let (status, _, body) = post(a.addr, "/v1/responses", first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let kept = parse(&body);
    assert_eq!(kept["store"], true, "{kept}");
    let id = kept["id"].as_str().expect("id").to_owned();
    let (status, read) = get(&b, &id).await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read, kept);
    let next = json!({"input": "Which word?", "previous_response_id": id, "max_output_tokens": 3,
        "stream": true});
    let (status, _, body) = post(b.addr, "/v1/responses", next).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let prompt = SimTokenizer.decode(&fake.state.calls.lock().last().expect("call").token_ids);
    assert!(
        prompt.contains("pelican") && prompt.contains("Which word?"),
        "{prompt}"
    );
    // The streamed one is kept too, before its last event went out.
    // (cut off at 3 tokens: `response.incomplete`, the last event).
    let done = parse(sse_data(&body).last().expect("events"));
    assert_eq!(done["type"], "response.incomplete", "{done}");
    let second = done["response"]["id"].as_str().expect("id").to_owned();
    assert_eq!(get(&a, &second).await.0, StatusCode::OK);

    // Forgotten through B, gone for A.
    let (status, _, body) = call(b.addr, Method::DELETE, &format!("/v1/responses/{id}"), "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["deleted"], true);
    assert_eq!(get(&a, &id).await.0, StatusCode::NOT_FOUND);
    let (status, _, _) = call(a.addr, Method::DELETE, &format!("/v1/responses/{id}"), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A lease etcd lost (revoked here) is replaced: the next response is kept all the same.
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("connect");
    for lease in raw.leases().await.expect("leases").leases() {
        raw.lease_revoke(lease.id()).await.expect("revoke");
    }
    assert_eq!(get(&b, &second).await.0, StatusCode::NOT_FOUND);
    let (_, _, body) = post(a.addr, "/v1/responses", json!({"input": "hi"})).await;
    let third = parse(&body);
    assert_eq!(third["store"], true, "{third}");
    assert_eq!(
        get(&b, third["id"].as_str().expect("id")).await.0,
        StatusCode::OK
    );

    // Without etcd the answer still goes out, saying it was not kept; what must read the
    // store is a 503, not a 404.
    etcd.kill();
    let (status, _, body) = post(a.addr, "/v1/responses", json!({"input": "hi"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["store"], false, "{body}");
    let (_, _, metrics) = call(a.ops, Method::GET, "/metrics", "").await;
    assert!(
        metrics.contains(r#"dolphin_router_responses_stored_total{outcome="failed"}"#),
        "{metrics}"
    );
    let next = json!({"input": "hi", "previous_response_id": third["id"]});
    let (status, _, body) = post(a.addr, "/v1/responses", next).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn responses_in_etcd_end_after_their_ttl() {
    let etcd = EtcdServer::start().await;
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("abc".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    // One second, kept up to two (the lease's window).
    let s = router_with(d, etcd_store(&etcd, Duration::from_secs(1)).await).await;
    let (_, _, body) = post(s.addr, "/v1/responses", json!({"input": "hi"})).await;
    let id = parse(&body)["id"].as_str().expect("id").to_owned();
    assert_eq!(get(&s, &id).await.0, StatusCode::OK);
    let started = std::time::Instant::now();
    while get(&s, &id).await.0 == StatusCode::OK {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still kept after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(500));
}

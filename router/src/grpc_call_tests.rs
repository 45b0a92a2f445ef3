//! The decode-call client against fake workers (tonic servers) and a silent HTTP/2 peer.

use std::error::Error as _;

use dolphin_cluster::Role;
use dolphin_proto::v1;
use tokio::net::TcpListener;

use super::*;
use crate::testutil::{Behavior, FakeWorker, eventually};

const DECODE: &str = "/dolphin.v1.DecodeWorker/Decode";

fn opts() -> ConnOptions {
    ConnOptions {
        keep_alive_interval: Duration::from_millis(100),
        keep_alive_timeout: Duration::from_millis(100),
    }
}

fn conn(addr: std::net::SocketAddr) -> GrpcConn {
    GrpcConn::new(
        addr.to_string().parse().expect("authority"),
        opts(),
        dolphin_tls::GrpcConnector::plain(Duration::from_secs(2)),
    )
}

fn request(max_tokens: u32) -> v1::DecodeRequest {
    v1::DecodeRequest {
        request_id: "r1".into(),
        token_ids: vec![1, 2, 3],
        sampling: Some(v1::SamplingParams {
            max_tokens,
            ..Default::default()
        }),
        remote: None,
    }
}

async fn call(c: &GrpcConn, max_tokens: u32) -> Result<GrpcStream<v1::DecodeResponse>, Status> {
    let meta = [(
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_static("r1"),
    )];
    c.server_streaming(DECODE, &request(max_tokens), &meta)
        .await
}

#[tokio::test]
async fn streams_every_message_then_ends_ok_and_reuses_the_connection() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("abc".into())).await;
    let c = conn(fake.addr);
    for _ in 0..3 {
        let mut s = call(&c, 5).await.expect("call");
        let mut tokens = Vec::new();
        while let Some(m) = s.message().await.expect("message") {
            tokens.extend(m.token_ids);
        }
        assert_eq!(tokens.len(), 5);
        assert!(s.message().await.expect("after the end").is_none());
    }
    let calls = fake.state.calls.lock();
    assert_eq!(calls.len(), 3);
    assert_eq!(
        calls[0].token_ids,
        vec![1, 2, 3],
        "the request arrived whole"
    );
}

#[tokio::test]
async fn a_workers_status_is_its_answer_and_has_no_source() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Fail(Code::ResourceExhausted)).await;
    let c = conn(fake.addr);
    let err = match call(&c, 5).await {
        Ok(mut s) => s.message().await.expect_err("the call fails"),
        Err(e) => e,
    };
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.source().is_none(),
        "a worker's answer, not a transport error"
    );

    *fake.state.behavior.lock() = Behavior::FailAfterFirst(Code::Internal);
    let mut s = call(&c, 5).await.expect("call");
    assert!(s.message().await.expect("first").is_some());
    let err = s.message().await.expect_err("fails after the first token");
    assert_eq!(err.code(), Code::Internal);
    assert!(err.source().is_none());
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let err = call(&conn(addr), 5).await.expect_err("nobody listens");
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.source().is_some(),
        "carries the transport error: {err:?}"
    );
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_call_on_the_worker() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let c = conn(fake.addr);
    let mut s = call(&c, 5).await.expect("call");
    assert!(s.message().await.expect("first").is_some());
    drop(s);
    eventually("the worker sees the cancel", || {
        fake.state
            .cancelled
            .load(std::sync::atomic::Ordering::SeqCst)
            == 1
    })
    .await;
}

#[tokio::test]
async fn a_call_after_the_worker_restarted_reconnects() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let addr = fake.addr;
    let c = conn(addr);
    let mut s = call(&c, 1).await.expect("call");
    while s.message().await.expect("message").is_some() {}
    fake.stop();
    drop(fake);
    // The old connection dies with the server; a new server on the same port serves the next
    // call (a fresh connection), perhaps after one call that finds the old one dead.
    let again = FakeWorker::start_on(addr, "d1", Role::Decode, Behavior::Text("y".into())).await;
    let mut served = false;
    for _ in 0..20 {
        if let Ok(mut s) = call(&c, 1).await
            && let Ok(Some(_)) = s.message().await
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "never reconnected");
    assert_eq!(again.state.calls.lock().len(), 1);
}

#[tokio::test]
async fn a_peer_that_stops_answering_pings_ends_the_stream() {
    // An HTTP/2 server that takes the call, sends headers and then never reads again: its
    // connection is not polled, so pings go unanswered.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (frozen_tx, frozen_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut h2 = h2::server::handshake(tcp).await.expect("handshake");
        let (_req, mut respond) = h2.accept().await.expect("a call").expect("h2");
        let response = http::Response::builder()
            .header(header::CONTENT_TYPE, "application/grpc")
            .body(())
            .expect("response");
        let _send = respond.send_response(response, false).expect("headers");
        // Flush the headers, then freeze: keep everything alive, poll nothing.
        let _ = tokio::time::timeout(Duration::from_millis(50), h2.accept()).await;
        let _ = frozen_tx.send((h2, _send));
        std::future::pending::<()>().await;
    });
    let c = conn(addr);
    let mut s = call(&c, 5).await.expect("headers arrive");
    let _frozen = frozen_rx.await.expect("server frozen");
    let started = tokio::time::Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(5), s.message())
        .await
        .expect("the keep-alive ends the stream")
        .expect_err("an error, not an end");
    assert!(err.source().is_some(), "a transport error: {err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn non_200_answers_map_as_the_grpc_spec_says() {
    assert_eq!(
        from_http_status(http::StatusCode::SERVICE_UNAVAILABLE).code(),
        Code::Unavailable
    );
    assert_eq!(
        from_http_status(http::StatusCode::NOT_FOUND).code(),
        Code::Unimplemented
    );
    assert_eq!(
        from_http_status(http::StatusCode::IM_A_TEAPOT).code(),
        Code::Unknown
    );
}

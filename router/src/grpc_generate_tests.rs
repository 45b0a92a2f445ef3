//! The `Generate` fast path: which calls it answers, the statuses of what it refuses (tonic's
//! codes and messages), and the stream and trailers it writes.

use dolphin_cluster::Role;
use http::Request;
use http_body_util::Full;
use proptest::prelude::*;
use tonic::Code;
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::policy::Policy;
use crate::request_log::RequestLog;
use crate::testutil::{Behavior, FakeWorker, dispatcher, text_request};

/// What the service below answers: a marker header, so a test sees which path ran.
const BELOW: &str = "x-answered-below";

fn layered(
    d: Arc<Dispatcher>,
    keys: Option<KeySet>,
    limit: InflightLimit,
) -> impl Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> {
    let below = tower::service_fn(|_: http::Request<Body>| async {
        let mut response = http::Response::new(Body::empty());
        response
            .headers_mut()
            .insert(BELOW, HeaderValue::from_static("1"));
        Ok::<_, Infallible>(response)
    });
    GenerateLayer::new(d, keys, limit).layer(below)
}

async fn with_worker(behavior: Behavior) -> (FakeWorker, Arc<Dispatcher>) {
    let fake = FakeWorker::start("d1", Role::Decode, behavior).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    (fake, d)
}

/// `msg` with its gRPC prefix.
fn framed(msg: &v1::GenerateRequest) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_u8(0);
    buf.put_u32(msg.encoded_len() as u32);
    msg.encode(&mut buf).expect("encode");
    buf.freeze()
}

fn call() -> http::request::Builder {
    Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://router{GENERATE}"))
        .header(CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
}

fn request(body: Bytes) -> http::Request<Body> {
    call().body(Body::new(Full::new(body))).expect("request")
}

/// The call's status: from the Trailers-Only headers, else from the trailers; and the messages.
async fn answer(response: http::Response<Body>) -> (Status, Vec<v1::GenerateResponse>) {
    let (parts, body) = response.into_parts();
    assert_eq!(parts.status, http::StatusCode::OK);
    if let Some(status) = Status::from_header_map(&parts.headers) {
        return (status, Vec::new());
    }
    assert_eq!(parts.headers[CONTENT_TYPE], "application/grpc");
    let collected = body.collect().await.expect("body");
    let trailers = collected.trailers().cloned().expect("trailers");
    let status = Status::from_header_map(&trailers).expect("grpc-status");
    let mut data = collected.to_bytes();
    let mut messages = Vec::new();
    while data.has_remaining() {
        assert_eq!(data.get_u8(), 0, "uncompressed");
        let len = data.get_u32() as usize;
        messages.push(v1::GenerateResponse::decode(data.split_to(len)).expect("message"));
    }
    (status, messages)
}

#[tokio::test]
async fn plain_generate_calls_are_answered_here_and_every_other_call_below() {
    let (_fake, d) = with_worker(Behavior::Text("xyz".into())).await;
    let mut svc = layered(d, None, InflightLimit::new(4));
    let body = framed(&text_request("hello", 3));

    let response = svc.ready().await.unwrap().call(request(body.clone()));
    let (status, messages) = answer(response.await.unwrap()).await;
    assert_eq!(status.code(), Code::Ok, "{status:?}");
    let text: String = messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(text, "xyz");
    let last = messages.last().expect("a message");
    assert_eq!(last.finish_reason, v1::FinishReason::Length as i32);
    assert!(last.usage.is_some() && last.routing.is_some());

    let below = [
        call().header("grpc-encoding", "gzip"),
        Request::builder()
            .method(http::Method::POST)
            .uri(format!("http://router{GENERATE}"))
            .header(CONTENT_TYPE, "application/grpc-web"),
        call().method(http::Method::GET),
        call().uri("http://router/dolphin.v1.Inference/ListModels"),
    ];
    for builder in below {
        let req = builder.body(Body::new(Full::new(body.clone()))).unwrap();
        let what = format!("{} {} {:?}", req.method(), req.uri(), req.headers());
        let response = svc.ready().await.unwrap().call(req).await.unwrap();
        assert!(response.headers().contains_key(BELOW), "{what}");
    }
}

#[tokio::test]
async fn malformed_messages_get_the_statuses_tonic_gives_them() {
    let (_fake, d) = with_worker(Behavior::Text("xyz".into())).await;
    let mut svc = layered(d, None, InflightLimit::new(4));
    let cases: [(&[u8], Code, &str); 7] = [
        (b"", Code::Internal, "Missing request message."),
        (b"\x00\x00\x00", Code::Internal, "Unexpected EOF"),
        (b"\x00\x00\x00\x00\x09abc", Code::Internal, "Unexpected EOF"),
        (b"\x01\x00\x00\x00\x00", Code::Internal, "compressed-flag"),
        (
            b"\x07\x00\x00\x00\x00",
            Code::Internal,
            "invalid compression flag: 7",
        ),
        (b"\x00\x00\x50\x00\x01", Code::OutOfRange, "too large"),
        (b"\x00\x00\x00\x00\x02\xff\xff", Code::Internal, ""),
    ];
    for (bytes, code, message) in cases {
        let body = Bytes::from_static(bytes);
        let response = svc.ready().await.unwrap().call(request(body)).await;
        let (status, messages) = answer(response.unwrap()).await;
        assert_eq!(status.code(), code, "{bytes:?}: {status:?}");
        assert!(status.message().contains(message), "{bytes:?}: {status:?}");
        assert!(messages.is_empty());
    }
    // A message the dispatcher refuses: its own status, as through tonic.
    let body = framed(&v1::GenerateRequest::default());
    let response = svc.ready().await.unwrap().call(request(body)).await;
    let (status, _) = answer(response.unwrap()).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn the_key_is_checked_before_the_limit_and_a_refusal_takes_no_slot() {
    let (_fake, d) = with_worker(Behavior::Text("xyz".into())).await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("keys");
    std::fs::write(&path, "sk-1\n").expect("write");
    let keys = KeySet::load(&path).expect("keys");
    let body = framed(&text_request("hello", 2));

    // No slot at all: a caller without the key still hears about the key.
    let mut full = layered(d.clone(), Some(keys.clone()), InflightLimit::new(0));
    let response = full.ready().await.unwrap().call(request(body.clone()));
    let (status, _) = answer(response.await.unwrap()).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let mut req = request(body.clone());
    req.headers_mut()
        .insert("authorization", HeaderValue::from_static("Bearer sk-1"));
    let (status, _) = answer(full.ready().await.unwrap().call(req).await.unwrap()).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    let limit = InflightLimit::new(1);
    let mut svc = layered(d, Some(keys), limit.clone());
    let mut req = request(body.clone());
    req.headers_mut()
        .insert("authorization", HeaderValue::from_static("Bearer sk-2"));
    let (status, _) = answer(svc.ready().await.unwrap().call(req).await.unwrap()).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(limit.in_flight(), 0);
    let mut req = request(body);
    req.headers_mut()
        .insert("authorization", HeaderValue::from_static("Bearer sk-1"));
    let response = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(limit.in_flight(), 1, "the stream holds its slot");
    let (status, messages) = answer(response).await;
    assert_eq!((status.code(), messages.is_empty()), (Code::Ok, false));
    assert_eq!(limit.in_flight(), 0, "freed with the trailers");
}

#[tokio::test]
async fn an_error_after_the_first_token_ends_the_stream_with_its_status() {
    let (_fake, d) = with_worker(Behavior::FailAfterFirst(Code::InvalidArgument)).await;
    let mut svc = layered(d, None, InflightLimit::new(4));
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request(framed(&text_request("hello", 5))));
    let (status, messages) = answer(response.await.unwrap()).await;
    assert_ne!(status.code(), Code::Ok, "{status:?}");
    assert!(!messages.is_empty(), "the first token went out");
}

#[test]
fn a_message_in_one_frame_is_kept_without_a_copy() {
    let body = framed(&text_request("hello", 2));
    let mut reader = Reader::default();
    reader.push(body.clone()).expect("push");
    let message = reader.finish().expect("message");
    assert_eq!(message.as_ptr(), body[PREFIX..].as_ptr());
}

#[test]
fn a_message_split_over_frames_is_joined_and_what_follows_it_dropped() {
    let mut reader = Reader::default();
    for part in [
        &b"\x00\x00"[..],
        b"\x00\x00\x03a",
        b"bc\x00\x09\x09",
        b"more",
    ] {
        reader.push(Bytes::copy_from_slice(part)).expect("push");
    }
    assert_eq!(reader.finish().expect("message"), &b"abc"[..]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary frames: an answer every time (a message or a status), never a panic, and a
    /// message only when the prefix says so.
    #[test]
    fn arbitrary_frames_never_panic(frames in proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..24), 0..6)
    ) {
        let mut reader = Reader::default();
        let mut refused = false;
        for f in &frames {
            if reader.push(Bytes::copy_from_slice(f)).is_err() {
                refused = true;
                break;
            }
        }
        if !refused && let Ok(message) = reader.finish() {
            let all: Vec<u8> = frames.concat();
            let len = u32::from_be_bytes(all[1..5].try_into().unwrap()) as usize;
            prop_assert_eq!(all[0], 0);
            prop_assert_eq!(&message[..], &all[PREFIX..PREFIX + len]);
            let _ = v1::GenerateRequest::decode(message);
        }
    }
}

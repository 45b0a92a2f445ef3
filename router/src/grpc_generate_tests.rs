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
async fn an_error_after_the_first_token_ends_the_stream_in_the_trailers_as_through_tonic() {
    let (_fake, d) = with_worker(Behavior::FailAfterFirst(Code::InvalidArgument)).await;
    let body = framed(&text_request("hello", 5));
    let mut fast = layered(d.clone(), None, InflightLimit::new(4));
    let response = fast.ready().await.unwrap().call(request(body.clone()));
    let response = response.await.unwrap();
    assert!(
        Status::from_header_map(response.headers()).is_none(),
        "not Trailers-Only"
    );
    let (status, messages) = answer(response).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(!messages.is_empty(), "the first token went out");
    let mut tonic = tonic_path(d);
    let response = tonic.ready().await.unwrap().call(request(body)).await;
    let (through_tonic, _) = answer(response.unwrap()).await;
    assert_eq!(
        (status.code(), status.message()),
        (through_tonic.code(), through_tonic.message())
    );
}

/// `msg` framed, split into `parts` frames.
fn frames(msg: &v1::GenerateRequest, extra: &[u8], parts: usize) -> Vec<Bytes> {
    let mut all = framed(msg).to_vec();
    all.extend_from_slice(extra);
    let size = all.len().div_ceil(parts).max(1);
    all.chunks(size).map(Bytes::copy_from_slice).collect()
}

fn read(frames: &[Bytes], end: End) -> Result<v1::GenerateRequest, Status> {
    let mut reader = Reader::default();
    for f in frames {
        reader.push(f.clone())?;
    }
    reader.finish(end)
}

#[test]
fn a_message_split_over_frames_is_joined_and_later_messages_are_checked() {
    let msg = text_request("hello", 2);
    for parts in [1, 2, 3, 7] {
        assert_eq!(read(&frames(&msg, b"", parts), End::Eos).unwrap(), msg);
        // A second whole message is decoded and dropped, as tonic reads a unary request.
        let second = framed(&text_request("more", 1));
        assert_eq!(read(&frames(&msg, &second, parts), End::Eos).unwrap(), msg);
        // A second message cut short, or with a bad prefix, fails the call as in tonic.
        let err = read(&frames(&msg, &second[..6], parts), End::Eos).unwrap_err();
        assert!(err.message().contains("Unexpected EOF"), "{err:?}");
        let err = read(&frames(&msg, b"\x00\x09\x09\x09\x09", parts), End::Eos).unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
        let err = read(
            &frames(&msg, b"\x00\x00\x00\x00\x02\xff\xff", parts),
            End::Eos,
        );
        assert_eq!(err.unwrap_err().code(), Code::Internal);
        // Trailers end the body with what has arrived.
        assert_eq!(
            read(&frames(&msg, &second[..6], parts), End::Trailers).unwrap(),
            msg
        );
    }
    let err = read(&[framed(&msg).slice(..8)], End::Trailers).unwrap_err();
    assert_eq!(err.message(), "Missing request message.");
}

/// Tonic's own `Inference` service, as `serve` installs it below the fast path.
fn tonic_path(
    d: Arc<Dispatcher>,
) -> impl Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> {
    let limit = InflightLimit::new(4);
    let svc = crate::grpc::inference_service(d, None, &limit);
    tower::ServiceBuilder::new()
        .map_response(|r: http::Response<_>| r.map(Body::new))
        .service(svc)
}

#[tokio::test]
async fn both_paths_answer_the_same_bodies_the_same_way() {
    let (_fake, d) = with_worker(Behavior::Text("xyz".into())).await;
    let mut fast = layered(d.clone(), None, InflightLimit::new(4));
    let mut tonic = tonic_path(d);
    let msg = framed(&text_request("hello", 3));
    let second = framed(&text_request("more", 1));
    let mut bodies: Vec<Vec<u8>> = vec![
        msg.to_vec(),
        [&msg[..], &second[..]].concat(),
        [&msg[..], &second[..4]].concat(),
        [&msg[..], b"\x00\x09\x09\x09\x09"].concat(),
        [&msg[..], b"\x00\x00\x00\x00\x02\xff\xff"].concat(),
        [&b"\x00\x00\x00\x00\x02\xff\xff"[..], &msg[..]].concat(),
        framed(&v1::GenerateRequest::default()).to_vec(),
        framed(&text_request("hello", 0)).to_vec(),
    ];
    bodies.extend(
        [
            &b""[..],
            b"\x00\x00\x00",
            b"\x01\x00\x00\x00\x00",
            b"\x07\x00\x00\x00\x00",
        ]
        .map(<[u8]>::to_vec),
    );
    bodies.push(b"\x00\x00\x50\x00\x01".to_vec());
    for body in bodies {
        let body = Bytes::from(body);
        let a = fast
            .ready()
            .await
            .unwrap()
            .call(request(body.clone()))
            .await;
        let b = tonic
            .ready()
            .await
            .unwrap()
            .call(request(body.clone()))
            .await;
        let ((sa, ma), (sb, mb)) = (answer(a.unwrap()).await, answer(b.unwrap()).await);
        assert_eq!(
            (sa.code(), sa.message()),
            (sb.code(), sb.message()),
            "{body:?}"
        );
        let text =
            |m: &[v1::GenerateResponse]| m.iter().map(|m| m.text.clone()).collect::<String>();
        assert_eq!(text(&ma), text(&mb), "{body:?}");
    }
}

/// A scripted answer stream: `None` stands for one `Pending`.
fn scripted(items: Vec<Option<Result<v1::GenerateResponse, Status>>>) -> GenerateStream {
    let mut items = std::collections::VecDeque::from(items);
    Box::pin(futures::stream::poll_fn(move |cx| {
        match items.pop_front() {
            Some(Some(item)) => Poll::Ready(Some(item)),
            Some(None) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            None => Poll::Ready(None),
        }
    }))
}

fn text_message(text: &str) -> v1::GenerateResponse {
    v1::GenerateResponse {
        text: text.into(),
        ..Default::default()
    }
}

/// Every frame of `body`, and whether it said it had ended after the last.
async fn frames_of(mut body: GenerateBody) -> (Vec<Frame<Bytes>>, bool) {
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        frames.push(frame.expect("infallible"));
    }
    let ended = http_body::Body::is_end_stream(&body);
    assert!(body.frame().await.is_none(), "stays ended");
    (frames, ended)
}

#[tokio::test]
async fn the_body_batches_what_is_ready_then_sends_the_trailers() {
    let limit = InflightLimit::new(1);
    let big = "x".repeat(20_000);
    let body = GenerateBody {
        stream: scripted(vec![
            Some(Ok(text_message("a"))),
            Some(Ok(text_message("b"))),
            None,
            Some(Ok(text_message(&big))),
            Some(Ok(text_message(&big))),
            Some(Ok(text_message("c"))),
            Some(Err(Status::unavailable("gone"))),
        ]),
        permit: Some(limit.try_acquire().unwrap()),
        end: None,
    };
    let (frames, ended) = frames_of(body).await;
    let data: Vec<usize> = frames
        .iter()
        .filter_map(|f| f.data_ref().map(Bytes::len))
        .collect();
    // "a" and "b" together; the two large ones pass the frame threshold, "c" follows.
    assert_eq!(data.len(), 3, "{data:?}");
    assert_eq!(data[0], 2 * (PREFIX + text_message("a").encoded_len()));
    let trailers = frames
        .last()
        .and_then(|f| f.trailers_ref())
        .expect("trailers last");
    let status = Status::from_header_map(trailers).expect("status");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, "gone")
    );
    assert!(ended);
    assert_eq!(limit.in_flight(), 0);
}

#[tokio::test]
async fn an_empty_stream_is_trailers_alone_and_a_dropped_body_frees_its_slot() {
    let limit = InflightLimit::new(1);
    let body = GenerateBody {
        stream: scripted(Vec::new()),
        permit: Some(limit.try_acquire().unwrap()),
        end: None,
    };
    let (frames, ended) = frames_of(body).await;
    assert_eq!(frames.len(), 1);
    let trailers = frames[0].trailers_ref().expect("trailers");
    assert_eq!(trailers.len(), 1);
    assert_eq!(trailers["grpc-status"], "0");
    assert!(ended);

    let mut body = GenerateBody {
        stream: scripted(vec![Some(Ok(text_message("a"))), None, None]),
        permit: Some(limit.try_acquire().unwrap()),
        end: None,
    };
    assert!(body.frame().await.expect("a frame").unwrap().is_data());
    assert_eq!(limit.in_flight(), 1);
    drop(body);
    assert_eq!(limit.in_flight(), 0);
}

#[tokio::test]
async fn identity_and_proto_content_take_the_fast_path() {
    let (_fake, d) = with_worker(Behavior::Text("xyz".into())).await;
    let mut svc = layered(d, None, InflightLimit::new(4));
    let body = framed(&text_request("hello", 2));
    let mut req = request(body.clone());
    req.headers_mut()
        .insert("grpc-encoding", HeaderValue::from_static("identity"));
    let mut proto = request(body);
    proto.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/grpc+proto"),
    );
    for req in [req, proto] {
        let response = svc.ready().await.unwrap().call(req).await.unwrap();
        assert!(!response.headers().contains_key(BELOW));
        let (status, messages) = answer(response).await;
        assert_eq!((status.code(), messages.is_empty()), (Code::Ok, false));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary frames: an answer every time (a request or a status), never a panic, and a
    /// request only when the bytes hold one.
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
        if !refused && let Ok(request) = reader.finish(End::Eos) {
            let all: Vec<u8> = frames.concat();
            let len = u32::from_be_bytes(all[1..5].try_into().unwrap()) as usize;
            prop_assert_eq!(all[0], 0);
            prop_assert_eq!(request, v1::GenerateRequest::decode(&all[PREFIX..PREFIX + len]).unwrap());
        }
    }
}

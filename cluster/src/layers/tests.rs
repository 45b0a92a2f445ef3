use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use dolphin_proto::v1::{self, worker_client::WorkerClient};
use http::{HeaderMap, HeaderValue};
use tower::{Layer, Service, ServiceExt, service_fn};
use tracing_subscriber::layer::SubscriberExt;

use super::*;
use crate::otel;

type Response = http::Response<tonic::body::Body>;

/// A server that never answers, keeping the headers of what it was sent.
fn hanging(
    seen: Arc<Mutex<Vec<HeaderMap>>>,
) -> impl Service<
    http::Request<tonic::body::Body>,
    Response = Response,
    Error = Infallible,
    Future: Send,
> + Clone {
    service_fn(move |req: http::Request<tonic::body::Body>| {
        seen.lock().unwrap().push(req.headers().clone());
        std::future::pending::<Result<Response, Infallible>>()
    })
}

fn status_of(err: &BoxError) -> &tonic::Status {
    err.downcast_ref::<tonic::Status>()
        .expect("the layer's own error is a Status")
}

#[tokio::test(start_paused = true)]
async fn a_call_ends_at_its_grpc_timeout_and_then_at_the_default() {
    let seen = Arc::default();
    let mut svc =
        DeadlineLayer::new(Some(Duration::from_secs(10))).layer(hanging(Arc::clone(&seen)));
    let start = tokio::time::Instant::now();
    let mut req = http::Request::new(tonic::body::Body::empty());
    req.headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("250m"));
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(status_of(&err).code(), tonic::Code::DeadlineExceeded);
    assert_eq!(start.elapsed(), Duration::from_millis(250));

    // No grpc-timeout: the default bounds the call, and is not written into the request
    // (a server would bound a whole stream by it).
    let start = tokio::time::Instant::now();
    let req = http::Request::new(tonic::body::Body::empty());
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(status_of(&err).code(), tonic::Code::DeadlineExceeded);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert!(!seen.lock().unwrap()[1].contains_key("grpc-timeout"));
}

#[tokio::test(start_paused = true)]
async fn without_a_default_a_call_without_grpc_timeout_is_not_bounded() {
    let mut svc = DeadlineLayer::new(None).layer(hanging(Arc::default()));
    let req = http::Request::new(tonic::body::Body::empty());
    let call = svc.ready().await.unwrap().call(req);
    let waited = tokio::time::timeout(Duration::from_secs(3600), call).await;
    assert!(waited.is_err(), "the call ended on its own");
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_deadline_passes_through() {
    let svc = service_fn(|_req: http::Request<tonic::body::Body>| async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, Infallible>(http::Response::new(tonic::body::Body::empty()))
    });
    let mut svc = DeadlineLayer::new(Some(Duration::from_millis(20))).layer(svc);
    let req = http::Request::new(tonic::body::Body::empty());
    let answer = svc.ready().await.unwrap().call(req).await;
    assert!(answer.is_ok());
}

#[tokio::test(start_paused = true)]
async fn tonic_clients_see_deadline_exceeded_and_the_server_the_timeout() {
    let seen = Arc::default();
    let mut client = WorkerClient::new(outbound(hanging(Arc::clone(&seen)), None));
    let mut req = tonic::Request::new(v1::InfoRequest {});
    req.set_timeout(Duration::from_millis(300));
    let status = client.info(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    let sent = seen.lock().unwrap()[0]["grpc-timeout"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        dolphin_proto::deadline::parse(&sent),
        Some(Duration::from_millis(300))
    );
}

/// Finished spans, kept in memory.
#[derive(Clone, Debug, Default)]
struct Spans(Arc<Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

impl opentelemetry_sdk::trace::SpanExporter for Spans {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

/// A subscriber that exports [`otel::TARGET`] spans into [`Spans`], as a process with an OTLP
/// endpoint does.
fn traced() -> (
    tracing::subscriber::DefaultGuard,
    Spans,
    opentelemetry_sdk::trace::SdkTracerProvider,
) {
    let spans = Spans::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(otel::layer(&provider));
    (
        tracing::subscriber::set_default(subscriber),
        spans,
        provider,
    )
}

#[tokio::test]
async fn the_current_span_goes_out_as_traceparent_only_while_traced() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut svc = PropagateTraceLayer.layer(hanging(Arc::clone(&seen)));
    let req = http::Request::new(tonic::body::Body::empty());
    drop(svc.call(req));
    assert!(!seen.lock().unwrap()[0].contains_key("traceparent"));

    let (_guard, _exporter, _provider) = traced();
    let span = tracing::trace_span!(target: otel::TARGET, "caller");
    let expected = otel::headers(&span);
    assert!(!expected.is_empty());
    span.in_scope(|| drop(svc.call(http::Request::new(tonic::body::Body::empty()))));
    assert_eq!(
        seen.lock().unwrap()[1]["traceparent"],
        expected[0].1.as_str()
    );

    // A request that already carries one keeps it.
    let mut req = http::Request::new(tonic::body::Body::empty());
    let mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    req.headers_mut()
        .insert("traceparent", HeaderValue::from_static(mine));
    span.in_scope(|| drop(svc.call(req)));
    assert_eq!(seen.lock().unwrap()[2]["traceparent"], mine);
}

/// A body of one data frame, then trailers with `grpc-status: status`.
struct Trailed(Option<&'static str>, bool);

impl http_body::Body for Trailed {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        if !self.1 {
            self.1 = true;
            return Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
                b"x",
            )))));
        }
        Poll::Ready(self.0.take().map(|status| {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static(status));
            Ok(http_body::Frame::trailers(trailers))
        }))
    }
}

/// Reads `body` to its end.
async fn drain<B: http_body::Body + Unpin>(mut body: B) {
    while std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx))
        .await
        .is_some()
    {}
}

/// Calls `svc` with `req` and reads its answer's body to the end.
async fn answer<S, B>(svc: &mut S, req: http::Request<()>)
where
    S: tower::Service<http::Request<()>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body + Unpin,
{
    let body = svc
        .ready()
        .await
        .unwrap()
        .call(req)
        .await
        .unwrap()
        .into_body();
    drain(body).await;
}

#[tokio::test]
async fn server_spans_continue_the_callers_trace_and_record_the_status() {
    let (_guard, exporter, _provider) = traced();
    let svc = service_fn(|req: http::Request<()>| async move {
        // The handler runs inside the call's span: its own spans are children.
        tracing::trace_span!(target: otel::TARGET, "handler").in_scope(|| {});
        let status = if req.uri().path().ends_with("Fails") {
            "14"
        } else {
            "0"
        };
        Ok::<_, Infallible>(http::Response::new(Trailed(Some(status), false)))
    });
    let mut svc = ServerSpanLayer.layer(svc);
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for path in ["/dolphin.v1.Worker/Info", "/dolphin.v1.Worker/Fails"] {
        let req = http::Request::builder()
            .uri(path)
            .header("traceparent", parent)
            .body(())
            .unwrap();
        answer(&mut svc, req).await;
    }
    let spans = exporter.0.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "handler",
            "dolphin.v1.Worker/Info",
            "handler",
            "dolphin.v1.Worker/Fails"
        ]
    );
    let attr = |i: usize, key: &str| {
        spans[i]
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    for i in [1, 3] {
        assert_eq!(
            spans[i].span_context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(spans[i].parent_span_id.to_string(), "b7ad6b7169203331");
        assert_eq!(spans[i - 1].parent_span_id, spans[i].span_context.span_id());
        assert_eq!(attr(i, "rpc.system").as_deref(), Some("grpc"));
        assert_eq!(attr(i, "rpc.service").as_deref(), Some("dolphin.v1.Worker"));
        assert_eq!(spans[i].span_kind, opentelemetry::trace::SpanKind::Server);
    }
    assert_eq!(attr(1, "rpc.method").as_deref(), Some("Info"));
    assert_eq!(attr(1, "rpc.grpc.status_code").as_deref(), Some("0"));
    assert_eq!(attr(3, "rpc.grpc.status_code").as_deref(), Some("14"));
    assert!(matches!(
        spans[3].status,
        opentelemetry::trace::Status::Error { .. }
    ));
    assert_eq!(spans[1].status, opentelemetry::trace::Status::Unset);
}

/// A body whose one data frame is produced inside a span of its own, as a streaming handler's
/// work is (it runs when the body is polled, after the handler returned).
struct Streaming(bool);

impl http_body::Body for Streaming {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        if std::mem::replace(&mut self.0, true) {
            return Poll::Ready(None);
        }
        tracing::trace_span!(target: otel::TARGET, "streamed").in_scope(|| {});
        Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
            b"x",
        )))))
    }
}

#[tokio::test]
async fn spans_opened_while_the_body_streams_are_the_calls_children() {
    let (_guard, exporter, _provider) = traced();
    let svc = service_fn(|_: http::Request<()>| async move {
        Ok::<_, Infallible>(http::Response::new(Streaming(false)))
    });
    let mut svc = ServerSpanLayer.layer(svc);
    let req = http::Request::builder()
        .uri("/dolphin.v1.DecodeWorker/Decode")
        .body(())
        .unwrap();
    answer(&mut svc, req).await;
    let spans = exporter.0.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["streamed", "dolphin.v1.DecodeWorker/Decode"]);
    assert_eq!(spans[0].parent_span_id, spans[1].span_context.span_id());
    assert_eq!(
        spans[0].span_context.trace_id(),
        spans[1].span_context.trace_id()
    );
}

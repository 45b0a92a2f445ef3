//! Trace context out on every outbound call, a span around every incoming one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderValue;
use tower::{Layer, Service};
use tracing::Span;
use tracing::field::Empty;

use crate::otel;

/// Writes the current span's W3C trace context (`traceparent`, `tracestate`) into each
/// outbound request that carries none, so the server's spans continue this process's trace.
/// Nothing is written while traces are off (the span is disabled).
#[derive(Clone, Copy, Debug, Default)]
pub struct PropagateTraceLayer;

impl<S> Layer<S> for PropagateTraceLayer {
    type Service = PropagateTrace<S>;

    fn layer(&self, inner: S) -> PropagateTrace<S> {
        PropagateTrace { inner }
    }
}

/// See [`PropagateTraceLayer`].
#[derive(Clone, Debug)]
pub struct PropagateTrace<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for PropagateTrace<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // `call` runs inside the caller's future, so the current span is the caller's.
        if !req.headers().contains_key("traceparent") {
            for (k, v) in otel::headers(&Span::current()) {
                if let Ok(v) = HeaderValue::try_from(v) {
                    req.headers_mut().insert(k, v);
                }
            }
        }
        self.inner.call(req)
    }
}

/// One span per incoming gRPC call (`otel.name` = `package.Service/Method`, kind server,
/// `rpc.*` attributes), a child of the caller's `traceparent`. The handler runs inside it, so
/// the spans it opens are its children; it stays open until the response body has ended (a
/// stream's last message) and records the call's `rpc.grpc.status_code` from the
/// Trailers-Only headers or the trailers.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerSpanLayer;

impl<S> Layer<S> for ServerSpanLayer {
    type Service = ServerSpan<S>;

    fn layer(&self, inner: S) -> ServerSpan<S> {
        ServerSpan { inner }
    }
}

/// See [`ServerSpanLayer`].
#[derive(Clone, Debug)]
pub struct ServerSpan<S> {
    inner: S,
}

impl<S, B, RB> Service<http::Request<B>> for ServerSpan<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<SpanBody<RB>>;
    type Error = S::Error;
    type Future = ServerSpanFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let span = server_span(&req);
        let inner = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        ServerSpanFuture { inner, span }
    }
}

/// The span of one incoming call (disabled, and nothing read, while traces are off).
fn server_span<B>(req: &http::Request<B>) -> Span {
    let path = req.uri().path();
    let name = path.strip_prefix('/').unwrap_or(path);
    let (service, method) = name.split_once('/').unwrap_or((name, ""));
    let span = tracing::trace_span!(
        target: otel::TARGET,
        "grpc.server",
        otel.name = name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = Empty,
        otel.status_code = Empty,
    );
    otel::set_parent(&span, &|k| {
        req.headers().get(k)?.to_str().ok().map(str::to_owned)
    });
    span
}

/// Records a `grpc-status` value on `span`; the codes OpenTelemetry's conventions count as a
/// server's error also mark the span's status.
fn record_status(span: &Span, value: &HeaderValue) {
    let Some(code) = value.to_str().ok().and_then(|s| s.parse::<i64>().ok()) else {
        return;
    };
    span.record("rpc.grpc.status_code", code);
    // UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
    if matches!(code, 2 | 4 | 12 | 13 | 14 | 15) {
        span.record("otel.status_code", "error");
    }
}

pin_project_lite::pin_project! {
    /// The answer of a [`ServerSpan`] call: the handler polled inside the span.
    pub struct ServerSpanFuture<F> {
        #[pin]
        inner: F,
        span: Span,
    }
}

impl<F, RB, E> Future for ServerSpanFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<SpanBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = {
            let _entered = this.span.enter();
            std::task::ready!(this.inner.poll(cx))
        };
        Poll::Ready(answer.map(|response| {
            // An error before any message comes Trailers-Only: the status is in the headers.
            if let Some(status) = response.headers().get("grpc-status") {
                record_status(this.span, status);
            }
            let span = this.span.clone();
            response.map(|inner| SpanBody { inner, span })
        }))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its call's span open until it is dropped, is polled inside
    /// it, and records the status its trailers carry.
    pub struct SpanBody<B> {
        #[pin]
        inner: B,
        span: Span,
    }
}

impl<B: http_body::Body> http_body::Body for SpanBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        // A stream's work runs as its body is polled: spans it opens are the call's children.
        let frame = {
            let _entered = this.span.enter();
            std::task::ready!(this.inner.poll_frame(cx))
        };
        if let Some(Ok(frame)) = &frame
            && let Some(status) = frame.trailers_ref().and_then(|t| t.get("grpc-status"))
        {
            record_status(this.span, status);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

//! A deadline on every outbound call.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use dolphin_proto::deadline::{self, GRPC_TIMEOUT};
use tokio::time::Sleep;
use tower::{Layer, Service};

use super::BoxError;

/// Bounds each call by the `grpc-timeout` it carries (what the caller set with
/// `tonic::Request::set_timeout`, passed on to the server too) or, without one, by `default`.
///
/// The bound covers the wait for the answer's headers: all of a unary call (tonic's server
/// sends a unary answer's headers with its message), the opening of a stream. A default is
/// enforced here only and not written into the request, because a server bounds a whole
/// stream by a `grpc-timeout` it receives.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeadlineLayer {
    default: Option<Duration>,
}

impl DeadlineLayer {
    /// Deadlines from `grpc-timeout`, else `default` (`None`: calls without one are unbounded).
    pub fn new(default: Option<Duration>) -> Self {
        Self { default }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            default: self.default,
        }
    }
}

/// See [`DeadlineLayer`].
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
    default: Option<Duration>,
}

impl<S, B> Service<http::Request<B>> for Deadline<S>
where
    S: Service<http::Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let limit = req
            .headers()
            .get(GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(deadline::parse)
            .or(self.default);
        DeadlineFuture {
            inner: self.inner.call(req),
            timer: limit.map(|d| (Box::pin(tokio::time::sleep(d)), d)),
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of a [`Deadline`] call, or `DEADLINE_EXCEEDED` once its time is up.
    pub struct DeadlineFuture<F> {
        #[pin]
        inner: F,
        // Boxed: a `Sleep` is large and this future moves before it is first polled.
        timer: Option<(Pin<Box<Sleep>>, Duration)>,
    }
}

impl<F, T, E> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(answer) = this.inner.poll(cx) {
            return Poll::Ready(answer.map_err(Into::into));
        }
        if let Some((sleep, limit)) = this.timer
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(Box::new(tonic::Status::deadline_exceeded(format!(
                "no answer within {limit:?}"
            )))));
        }
        Poll::Pending
    }
}

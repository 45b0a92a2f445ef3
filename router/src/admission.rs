//! The router's in-flight limit and load shedding, as one tower layer in front of the public
//! inference routes (HTTP and gRPC alike).
//!
//! A request takes a slot before its handler runs, so a router at its limit answers 429 /
//! RESOURCE_EXHAUSTED before it reads the body, tokenizes or queues anything. The slot then
//! travels inside the response body and is freed when that body ends or is dropped (the client
//! went away): a streaming response holds its slot for the whole stream, not only until its
//! headers go out. That is why this is not tower's `ConcurrencyLimit` + `LoadShed`, whose
//! permit is released when the response future resolves, which for a stream is at its first
//! byte.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::error::DispatchError;
use crate::metrics as m;
use crate::stream::Api;
use dolphin_cluster::hot_metrics as hot;

/// Slots for requests in flight, shared by every listener and shard of one router.
#[derive(Clone, Debug)]
pub struct InflightLimit(Arc<Slots>);

#[derive(Debug)]
struct Slots {
    taken: AtomicU32,
    limit: u32,
}

impl InflightLimit {
    /// At most `limit` requests in flight at once.
    pub fn new(limit: u32) -> Self {
        Self(Arc::new(Slots {
            taken: AtomicU32::new(0),
            limit,
        }))
    }

    /// Takes a slot, or says how many are taken when none is free.
    pub fn try_acquire(&self) -> Result<Permit, u32> {
        let slots = &self.0;
        let taken = slots
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < slots.limit).then_some(n + 1)
            })?;
        debug_assert!(taken < slots.limit);
        hot::gauge(m::INFLIGHT_REQUESTS, []).increment(1.0);
        Ok(Permit(Arc::clone(&self.0)))
    }

    /// Takes a slot for a request of `api`, or refuses it with `RouterBusy` (counted as that
    /// API's request with the refusal's outcome).
    pub fn try_admit(&self, api: Api) -> Result<Permit, DispatchError> {
        self.try_acquire().map_err(|in_flight| {
            let e = DispatchError::RouterBusy(in_flight);
            hot::counter(
                m::REQUESTS_TOTAL,
                [("api", api.as_str()), ("outcome", e.outcome())],
            )
            .increment(1);
            e
        })
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.0.taken.load(Ordering::Acquire)
    }

    /// The layer that holds each request of `api`'s service below to one slot, answering
    /// `refuse(RouterBusy)` (the API's own 429 / RESOURCE_EXHAUSTED) when none is free.
    /// Requests for the `exempt` paths (cheap calls such as listing models) take no slot.
    pub fn layer<B>(
        &self,
        api: Api,
        refuse: fn(DispatchError) -> http::Response<B>,
        exempt: &'static [&'static str],
    ) -> InflightLimitLayer<B> {
        InflightLimitLayer {
            limit: self.clone(),
            api,
            refuse,
            exempt,
        }
    }
}

/// One request's slot, freed on drop.
#[derive(Debug)]
pub struct Permit(Arc<Slots>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
        hot::gauge(m::INFLIGHT_REQUESTS, []).decrement(1.0);
    }
}

/// See [`InflightLimit::layer`].
#[derive(Debug)]
pub struct InflightLimitLayer<B> {
    limit: InflightLimit,
    api: Api,
    refuse: fn(DispatchError) -> http::Response<B>,
    exempt: &'static [&'static str],
}

impl<B> Clone for InflightLimitLayer<B> {
    fn clone(&self) -> Self {
        Self {
            limit: self.limit.clone(),
            api: self.api,
            refuse: self.refuse,
            exempt: self.exempt,
        }
    }
}

impl<S, B> tower::Layer<S> for InflightLimitLayer<B> {
    type Service = InflightLimited<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        InflightLimited {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service whose requests each hold a slot of the router's in-flight limit.
#[derive(Debug)]
pub struct InflightLimited<S, B> {
    inner: S,
    layer: InflightLimitLayer<B>,
}

impl<S: Clone, B> Clone for InflightLimited<S, B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

// tonic routes gRPC services by name: the limited service keeps the inner one's.
impl<S: tonic::server::NamedService, B> tonic::server::NamedService for InflightLimited<S, B> {
    const NAME: &'static str = S::NAME;
}

impl<S, ReqBody, B> tower::Service<http::Request<ReqBody>> for InflightLimited<S, B>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<B>>,
{
    type Response = http::Response<PermitBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The services below (axum routes, tonic servers) are always ready: the limit is the
        // slot count, not readiness, so a full router refuses instead of making callers wait.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        if self.layer.exempt.contains(&req.uri().path()) {
            return ResponseFuture::Admitted {
                inner: self.inner.call(req),
                permit: None,
            };
        }
        match self.layer.limit.try_admit(self.layer.api) {
            Ok(permit) => ResponseFuture::Admitted {
                inner: self.inner.call(req),
                permit: Some(permit),
            },
            Err(e) => ResponseFuture::Refused {
                response: Some((self.layer.refuse)(e)),
            },
        }
    }
}

pin_project! {
    /// The inner service's response with the request's slot moved into its body, or the
    /// refusal.
    #[project = ResponseFutureProj]
    pub enum ResponseFuture<F, B> {
        /// A slot was free: the handler runs.
        Admitted { #[pin] inner: F, permit: Option<Permit> },
        /// No slot: answered at once.
        Refused { response: Option<http::Response<B>> },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<PermitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ResponseFutureProj::Admitted { inner, permit } => {
                let response = ready!(inner.poll(cx))?;
                let permit = permit.take();
                Poll::Ready(Ok(response.map(|inner| PermitBody { inner, permit })))
            }
            ResponseFutureProj::Refused { response } => {
                let response = response.take().expect("polled after completion");
                Poll::Ready(Ok(response.map(|inner| PermitBody {
                    inner,
                    permit: None,
                })))
            }
        }
    }
}

pin_project! {
    /// A response body that holds its request's slot until it ends or is dropped.
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B> PermitBody<B> {
    /// `inner`, holding `permit` (if any) until it ends or is dropped.
    pub fn new(inner: B, permit: Option<Permit>) -> Self {
        Self { inner, permit }
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            // Ended: the slot is free before the connection gets around to dropping the body.
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_up_to_the_limit_and_freed_on_drop() {
        let limit = InflightLimit::new(2);
        let a = limit.try_acquire().expect("first");
        let _b = limit.try_acquire().expect("second");
        assert_eq!(limit.try_acquire().err(), Some(2));
        assert_eq!(limit.in_flight(), 2);
        drop(a);
        assert_eq!(limit.in_flight(), 1);
        let _c = limit.try_acquire().expect("a slot is free again");
        assert_eq!(limit.in_flight(), 2);
    }
}

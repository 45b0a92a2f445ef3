//! tower layers for the cluster's gRPC hops, shared by every process.
//!
//! - [`DeadlineLayer`] (clients): every outbound call ends by its `grpc-timeout` (the deadline
//!   the caller has left) or, for a call that carries none, by a default; past it the caller
//!   gets `DEADLINE_EXCEEDED` and the call is dropped, which cancels it on the server.
//! - [`PropagateTraceLayer`] (clients): the caller's trace span goes out as W3C `traceparent`,
//!   so the server's spans continue the trace.
//! - [`ServerSpanLayer`] (servers): one span per incoming call, under the caller's trace, with
//!   the method and the call's gRPC status, open until the response body ends.
//!
//! The router's own call to a decode worker does not go through these: it runs on a hand-made
//! HTTP/2 client (`router/src/grpc_call.rs`, issue 11's overhead work) and places its deadline
//! and trace headers itself.

mod deadline;
mod trace;

pub use deadline::{Deadline, DeadlineFuture, DeadlineLayer};
pub use trace::{PropagateTrace, PropagateTraceLayer, ServerSpan, ServerSpanLayer, SpanBody};

/// The error type of the client layers: the inner service's error, or a [`tonic::Status`]
/// tonic's client returns as it is.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client stack for one outbound channel: the deadline outside, so that the time it bounds
/// includes everything below it.
pub type Outbound<S> = Deadline<PropagateTrace<S>>;

/// `inner` behind [`DeadlineLayer`] (with `default` for calls without a `grpc-timeout`) and
/// [`PropagateTraceLayer`].
pub fn outbound<S>(inner: S, default: Option<std::time::Duration>) -> Outbound<S> {
    use tower::Layer;
    DeadlineLayer::new(default).layer(PropagateTraceLayer.layer(inner))
}

#[cfg(test)]
mod tests;

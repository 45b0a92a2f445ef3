//! The router's HTTP/2 client to one worker, without tonic's `Channel`.
//!
//! tonic's `Channel` puts a tower `Buffer` in front of the connection: every request is sent
//! through an mpsc channel to a separate task that owns the connection, and its response future
//! comes back through a oneshot, which costs a task switch and a few allocations per request.
//! hyper-util's pooled client calls the HTTP/2 connection from the caller's task instead, and
//! still connects lazily and reconnects when the connection dies. Measured with
//! `router_overhead` at 1 connection on the shared 2-core box: router CPU 171 -> 165 us/request
//! (gRPC) and 157 -> 134 (HTTP), p99 4.9 -> 0.5 ms (gRPC).
//!
//! Each serving shard ([`crate::shard`]) has a client of its own, made on first use on the
//! shard's thread: the connection's HTTP/2 task then runs on that thread, beside the requests
//! that use it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dolphin_cluster::layers::{Outbound, outbound};
use dolphin_proto::v1;
use dolphin_proto::v1::worker_client::WorkerClient;
use dolphin_tls::GrpcConnector;
use http::{HeaderName, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tonic::transport::Uri;

use crate::grpc_call::{ConnOptions, GrpcConn, GrpcStream};

/// How often a connection is pinged, so that a dead worker (a crashed host, a cut link: no
/// RST ever arrives) is noticed and its streams end with an error instead of hanging.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a ping may go unanswered before the connection and its streams are closed. A
/// worker that left etcd but still answers (only its etcd link is cut) keeps its streams.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a `Worker` call may wait for its answer (the opening of `Subscribe`'s stream):
/// a worker that accepts the call but never answers would otherwise hold its event stream
/// down without a reconnect. Pings do not notice it: the connection is alive.
const WORKER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP/2 client type under [`WorkerChannel`].
pub type HttpClient = Client<GrpcConnector, tonic::body::Body>;

/// A lazily connected, self-reconnecting HTTP/2 client to one worker's gRPC address, one
/// connection per serving shard (and one for the control runtime).
#[derive(Clone, Debug)]
pub struct WorkerChannel {
    /// Index 0: the control runtime; `i`: shard `i`.
    clients: Arc<[OnceLock<HttpClient>]>,
    /// Decode calls, per shard like `clients` (see [`crate::grpc_call`]).
    decode_calls: Arc<[OnceLock<GrpcConn>]>,
    origin: Uri,
    /// TCP (TCP_NODELAY, connect timeout), then mutual TLS when the router has it.
    connector: GrpcConnector,
}

/// `DecodeWorker.Decode`'s path.
const DECODE_PATH: &str = "/dolphin.v1.DecodeWorker/Decode";

/// The worker's address is not a valid URI authority.
#[derive(Debug, thiserror::Error)]
#[error("bad worker address {0:?}")]
pub struct BadAddress(pub String);

impl WorkerChannel {
    /// A channel to `addr` (`host:port`) through `connector`; nothing connects until the first
    /// request.
    pub fn new(addr: &str, connector: &GrpcConnector) -> Result<Self, BadAddress> {
        let origin: Uri = format!("{}://{addr}", connector.scheme())
            .parse()
            .map_err(|_| BadAddress(addr.to_string()))?;
        if origin.authority().is_none() || origin.path() != "/" {
            return Err(BadAddress(addr.to_string()));
        }
        let slots = crate::shard::count() + 1;
        Ok(Self {
            clients: (0..slots).map(|_| OnceLock::new()).collect(),
            decode_calls: (0..slots).map(|_| OnceLock::new()).collect(),
            origin,
            connector: connector.clone(),
        })
    }

    /// Calls `DecodeWorker.Decode` on this thread's connection; `metadata` goes out as request
    /// headers.
    pub async fn decode_call(
        &self,
        request: &v1::DecodeRequest,
        metadata: &[(HeaderName, HeaderValue)],
    ) -> Result<GrpcStream<v1::DecodeResponse>, tonic::Status> {
        let i = crate::shard::current().min(self.decode_calls.len() - 1);
        let conn = self.decode_calls[i].get_or_init(|| {
            let authority = self
                .origin
                .authority()
                .cloned()
                .expect("checked at construction");
            GrpcConn::new(
                authority,
                ConnOptions {
                    keep_alive_interval: KEEP_ALIVE_INTERVAL,
                    keep_alive_timeout: KEEP_ALIVE_TIMEOUT,
                },
                self.connector.clone(),
            )
        });
        conn.server_streaming(DECODE_PATH, request, metadata).await
    }

    /// This thread's client: its shard's, made on first use.
    fn client(&self) -> HttpClient {
        let i = crate::shard::current().min(self.clients.len() - 1);
        self.clients[i]
            .get_or_init(|| {
                Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .timer(TokioTimer::new())
                    .pool_timer(TokioTimer::new())
                    .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
                    .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
                    .http2_keep_alive_while_idle(true)
                    // Keep the connection for as long as it lives: reconnecting costs a round
                    // trip.
                    .pool_idle_timeout(None)
                    .build(self.connector.clone())
            })
            .clone()
    }

    /// A `Worker` client over this thread's connection, behind the cluster's client layers
    /// (a deadline, the trace context).
    pub fn worker(&self) -> WorkerClient<Outbound<HttpClient>> {
        WorkerClient::with_origin(
            outbound(self.client(), Some(WORKER_CALL_TIMEOUT)),
            self.origin.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_addresses_that_are_not_host_port() {
        let c = GrpcConnector::plain(Duration::from_secs(1));
        assert!(WorkerChannel::new("127.0.0.1:9000", &c).is_ok());
        assert!(WorkerChannel::new("bad addr", &c).is_err());
        assert!(WorkerChannel::new("host:1/path", &c).is_err());
    }
}

//! gRPC channels to prefill workers, one per address, reused across requests, each behind the
//! cluster's client layers (`dolphin_cluster::layers`): a deadline on every call, the trace
//! context on every call.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use dolphin_cluster::layers::{Outbound, outbound};
use dolphin_proto::v1::prefill_worker_client::PrefillWorkerClient;
use dolphin_tls::{GrpcConnector, Tls, TlsError};
use dolphin_worker_common::BadRequest;
use tonic::transport::{Channel, Endpoint};

/// How long connecting to a prefill worker may take; a dead host shows up this fast, and the
/// request falls back to local prefill.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Channels kept at most. Addresses come from the router's view of the cluster, so this only
/// bounds memory against churn (restarted workers on new ports).
const MAX_CHANNELS: usize = 256;
/// The deadline of a call to a prefill worker that sets none of its own. A prefill call
/// always carries what its request has left (`grpc-timeout`); opening an NCCL link does not,
/// and its answer (a unique id) comes at once from a healthy worker.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of one prefill worker: its shared channel behind the deadline and trace layers.
pub type PrefillClient = PrefillWorkerClient<Outbound<Channel>>;

/// Cached channels to prefill workers, keyed by address.
#[derive(Debug)]
pub struct PrefillClients {
    channels: Mutex<HashMap<String, Channel>>,
    /// TCP, then mutual TLS when the worker has it.
    connector: GrpcConnector,
}

impl PrefillClients {
    /// An empty cache; with `tls`, every connection is mutual TLS.
    pub fn new(tls: Option<&Tls>) -> Result<Self, TlsError> {
        Ok(Self {
            channels: Mutex::default(),
            connector: GrpcConnector::new(tls, CONNECT_TIMEOUT)?,
        })
    }

    /// A client for the prefill worker at `addr` (`host:port`, or a URL with a scheme). The
    /// channel connects lazily and reconnects on its own; clients share it (HTTP/2 multiplexes).
    pub fn client(&self, addr: &str) -> Result<PrefillClient, BadRequest> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(addr) {
            return Ok(layered(channel.clone()));
        }
        let channel = endpoint(addr, self.connector.scheme())?
            .connect_with_connector_lazy(self.connector.clone());
        if channels.len() >= MAX_CHANNELS {
            // Crude but bounded: forget every channel; live ones are re-created on next use.
            channels.clear();
        }
        channels.insert(addr.to_owned(), channel.clone());
        Ok(layered(channel))
    }

    /// Channels cached now.
    pub fn len(&self) -> usize {
        self.channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no channel is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A client over `channel`, behind the layers. The deadline sits in this process, above tonic's
/// channel, so it bounds the wait for a connection too.
fn layered(channel: Channel) -> PrefillClient {
    PrefillWorkerClient::new(outbound(channel, Some(DEFAULT_CALL_TIMEOUT)))
}

/// The endpoint for a prefill worker address (the connector sets TCP_NODELAY: small
/// request/response RPCs).
fn endpoint(addr: &str, scheme: &str) -> Result<Endpoint, BadRequest> {
    if addr.is_empty() {
        return Err(BadRequest("remote.prefill_addr is required".into()));
    }
    let uri = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("{scheme}://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|e| {
        BadRequest(format!(
            "remote.prefill_addr {addr:?} is not an address: {e}"
        ))
    })?;
    // Pings notice a prefill host that vanished (no RST ever comes) well before the prefill
    // timeout, so the request falls back to local prefill sooner.
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_channel_per_address() {
        let clients = PrefillClients::new(None).expect("plaintext");
        clients.client("127.0.0.1:1").expect("valid");
        clients.client("127.0.0.1:1").expect("valid");
        clients.client("http://127.0.0.1:2").expect("valid");
        assert_eq!(clients.len(), 2);
    }

    #[tokio::test]
    async fn refuses_what_is_not_an_address() {
        let clients = PrefillClients::new(None).expect("plaintext");
        assert!(clients.client("").unwrap_err().0.contains("required"));
        assert!(clients.client("not an address").is_err());
        assert!(clients.is_empty());
    }
}

#![warn(missing_docs)]
//! TLS for every connection of a Dolphin cluster, with rustls (ring as the crypto provider).
//!
//! Every process takes the same flags ([`TlsArgs`]): the certificate chain and key it presents,
//! and the CA bundle its peers' certificates must chain to. With the CA, servers of cluster
//! traffic (workers' gRPC, the KV transfer listener) require a client certificate from that CA:
//! mutual TLS between router, decode and prefill workers. Public listeners (the router's HTTP and
//! gRPC APIs) present the certificate but ask for none; clients there authenticate with API keys.
//!
//! The files are read again when they change on disk ([`Tls::watch`]), as Kubernetes updates
//! a mounted secret: new handshakes use the new certificate, key and CA at once, open
//! connections keep theirs. A file that does not parse is refused with a log line and the
//! previous material stays in use.
//!
//! Certificates are checked against [`TlsArgs::tls_server_name`] when it is set (one name every
//! member's certificate carries, since members dial each other by IP address), otherwise against
//! the host of the address dialed.

mod args;
mod connector;
mod error;
mod incoming;
mod material;
mod stream;
mod tls;

pub use args::TlsArgs;
pub use connector::{Dialer, GrpcConnector, connect_tcp};
pub use error::TlsError;
pub use incoming::{HANDSHAKE_TIMEOUT, TlsIncoming, accept_incoming, accept_tls};
pub use stream::MaybeTlsStream;
pub use tls::{ClientAuth, Tls};

#[cfg(any(test, feature = "test-util"))]
pub mod testing;
#[cfg(test)]
mod tests;

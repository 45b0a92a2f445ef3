//! Dialing a cluster member: TCP (TCP_NODELAY), then TLS when the process has it, as a
//! connector for tonic's `Endpoint::connect_with_connector`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tonic::transport::Uri;

use crate::{MaybeTlsStream, Tls, TlsError};

/// Connects to `addr` (`host:port`) within `timeout`, with TCP_NODELAY.
pub async fn connect_tcp(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {addr} timed out"),
            )
        })??;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// Dials cluster members: TCP (TCP_NODELAY), then TLS with the given ALPN protocols when the
/// process has TLS on.
#[derive(Clone, Debug)]
pub struct Dialer {
    tls: Option<(Tls, Arc<ClientConfig>)>,
    connect_timeout: Duration,
}

impl Dialer {
    /// A dialer; with `tls`, every connection is TLS (client certificate offered if the process
    /// has one) and offers `alpn`.
    pub fn new(
        tls: Option<&Tls>,
        alpn: &[&[u8]],
        connect_timeout: Duration,
    ) -> Result<Self, TlsError> {
        let tls = tls
            .map(|t| Ok::<_, TlsError>((t.clone(), t.client_config(alpn)?)))
            .transpose()?;
        Ok(Self {
            tls,
            connect_timeout,
        })
    }

    /// A dialer without TLS.
    pub fn plain(connect_timeout: Duration) -> Self {
        Self {
            tls: None,
            connect_timeout,
        }
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Dials `host:port`.
    pub async fn dial(&self, authority: &str) -> io::Result<MaybeTlsStream> {
        let tcp = connect_tcp(authority, self.connect_timeout).await?;
        match &self.tls {
            None => Ok(MaybeTlsStream::Plain(tcp)),
            Some((tls, config)) => {
                let host = host_of(authority);
                let handshake = tls.connect(config.clone(), tcp, host);
                let stream = tokio::time::timeout(self.connect_timeout, handshake)
                    .await
                    .map_err(|_| {
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("TLS handshake with {authority} timed out"),
                        )
                    })??;
                Ok(MaybeTlsStream::Client(Box::new(stream)))
            }
        }
    }
}

/// Dials gRPC servers for tonic (`Endpoint::connect_with_connector`): TCP, then TLS (ALPN `h2`)
/// when configured.
#[derive(Clone, Debug)]
pub struct GrpcConnector {
    dialer: Dialer,
}

impl GrpcConnector {
    /// A connector; with `tls`, every connection is TLS (client certificate offered if the
    /// process has one).
    pub fn new(tls: Option<&Tls>, connect_timeout: Duration) -> Result<Self, TlsError> {
        Ok(Self {
            dialer: Dialer::new(tls, &[b"h2"], connect_timeout)?,
        })
    }

    /// A connector without TLS.
    pub fn plain(connect_timeout: Duration) -> Self {
        Self {
            dialer: Dialer::plain(connect_timeout),
        }
    }

    /// Dials `host:port`.
    pub async fn dial(&self, authority: &str) -> io::Result<MaybeTlsStream> {
        self.dialer.dial(authority).await
    }

    /// The scheme of URLs to servers dialed through this connector: `http` even with TLS,
    /// which the connector does itself (tonic refuses `https` URLs unless its own TLS is built
    /// in).
    pub fn scheme(&self) -> &'static str {
        "http"
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.dialer.is_tls()
    }
}

/// The host of `host:port` (brackets of an IPv6 literal kept; `Tls` strips them).
fn host_of(authority: &str) -> &str {
    match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    }
}

impl tower_service::Service<Uri> for GrpcConnector {
    type Response = TokioIo<MaybeTlsStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let authority = uri
                .authority()
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}"))
                })?
                .to_string();
            this.dial(&authority).await.map(TokioIo::new)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts_of_authorities() {
        assert_eq!(host_of("10.0.0.3:50051"), "10.0.0.3");
        assert_eq!(host_of("[::1]:80"), "[::1]");
        assert_eq!(host_of("decode-0.dolphin:9000"), "decode-0.dolphin");
        assert_eq!(host_of("bare"), "bare");
    }
}

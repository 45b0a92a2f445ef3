//! Accepting connections with TLS handshakes done beside the accept loop, so a slow or silent
//! client delays only itself.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::MaybeTlsStream;

/// How long a client may take over its TLS handshake before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Completes the server side of a TLS handshake on `tcp` (TCP_NODELAY set first), or passes it
/// through when `config` is `None`.
pub async fn accept_tls(
    tcp: TcpStream,
    config: Option<Arc<ServerConfig>>,
) -> io::Result<MaybeTlsStream> {
    tcp.set_nodelay(true)?;
    let Some(config) = config else {
        return Ok(MaybeTlsStream::Plain(tcp));
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(stream) => Ok(MaybeTlsStream::Server(Box::new(stream?))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "TLS handshake timed out",
        )),
    }
}

/// Connections accepted from a listener, handshaken (TLS or not), as a stream for tonic's
/// `serve_with_incoming`. Failed handshakes are logged and dropped, never returned: an error
/// would end tonic's server.
#[derive(Debug)]
pub struct TlsIncoming {
    rx: mpsc::Receiver<MaybeTlsStream>,
}

/// Accepts on `listener` until `shutdown`, each handshake on a task of its own.
pub fn accept_incoming(
    listener: TcpListener,
    config: Option<Arc<ServerConfig>>,
    shutdown: CancellationToken,
) -> TlsIncoming {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (tx, config) = (tx.clone(), config.clone());
            tokio::spawn(async move {
                match accept_tls(tcp, config).await {
                    Ok(stream) => {
                        let _ = tx.send(stream).await;
                    }
                    Err(e) => {
                        tracing::info!(%peer, error = %e, "connection refused in the TLS handshake")
                    }
                }
            });
        }
    });
    TlsIncoming { rx }
}

impl futures_core::Stream for TlsIncoming {
    type Item = io::Result<MaybeTlsStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|s| s.map(Ok))
    }
}

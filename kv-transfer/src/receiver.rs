//! The decode worker's listener: accepts sender connections and routes transfers to slots.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dolphin_tls::{Tls, accept_tls};
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::TransferId;
use crate::config::TransferConfig;
use crate::error::TransferError;
use crate::pool::BufferPool;
use crate::sender::ALPN;
use crate::serve::serve;
use crate::slot::{Registry, TransferSlot};

/// Pause after a failed accept (out of file descriptors, say), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Listener on the decode worker. Each connection is served by its own task, so several
/// senders (or one sender's several pooled connections) transfer at once.
///
/// Dropping the receiver closes the listener and every connection soon after (on the runtime);
/// [`KvReceiver::shutdown`] does it before returning. Pending slots end with
/// [`TransferError::Aborted`].
#[derive(Debug)]
pub struct KvReceiver {
    local_addr: SocketAddr,
    registry: Arc<Registry>,
    channel_blocks: usize,
    /// Dropping or firing it stops the accept loop.
    stop: Option<oneshot::Sender<()>>,
    accept: JoinHandle<()>,
}

impl KvReceiver {
    /// Binds `addr` (port 0 picks one) and starts accepting, in plaintext. Must run inside a
    /// tokio runtime.
    pub async fn bind(addr: SocketAddr, cfg: TransferConfig) -> Result<Self, TransferError> {
        Self::bind_with_tls(addr, cfg, None).await
    }

    /// [`bind`](Self::bind), every connection TLS when `tls` is given, with a client
    /// certificate from the CA required when it has one (mutual TLS).
    pub async fn bind_with_tls(
        addr: SocketAddr,
        cfg: TransferConfig,
        tls: Option<&Tls>,
    ) -> Result<Self, TransferError> {
        let tls = tls.map(server_config).transpose()?;
        let bind_err = |e| TransferError::Bind {
            addr,
            source: Arc::new(e),
        };
        let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
        let local_addr = listener.local_addr().map_err(bind_err)?;
        let registry = Arc::new(Registry::default());
        let channel_blocks = cfg.channel_blocks;
        let (stop, stopped) = oneshot::channel();
        let accept = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&registry),
            cfg,
            tls,
            stopped,
        ));
        tracing::debug!(%local_addr, "KV receiver listening");
        Ok(Self {
            local_addr,
            registry,
            channel_blocks,
            stop: Some(stop),
            accept,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Announces transfer `id` of `n_blocks` blocks. Its blocks arrive on the returned slot in
    /// order, through a channel of `channel_blocks` (backpressure reaches the sender's socket).
    /// A transfer id is delivered at most once; announcing a pending id again supersedes the
    /// older slot. Dropping the slot rejects the transfer.
    pub fn expect(&self, id: TransferId, n_blocks: u32) -> TransferSlot {
        self.registry.expect(id, n_blocks, self.channel_blocks)
    }

    /// Joins the NCCL communicator `id` (made by a prefill worker, which joins it as rank 0)
    /// on CUDA device `device` and serves transfers on it from a thread of its own, into the
    /// slots of [`expect`](Self::expect) like a TCP connection. Returns once both ranks joined.
    #[cfg(feature = "nccl")]
    pub async fn accept_nccl(
        &self,
        id: crate::nccl::NcclId,
        device: usize,
    ) -> Result<(), TransferError> {
        self.nccl_acceptor().accept(id, device).await
    }

    /// A handle that joins NCCL communicators into this receiver, for tasks that outlive a
    /// borrow of it.
    #[cfg(feature = "nccl")]
    pub fn nccl_acceptor(&self) -> crate::nccl::NcclAcceptor {
        crate::nccl::NcclAcceptor::new(Arc::clone(&self.registry))
    }

    /// Stops accepting, closes every connection and the listening socket, and returns once they
    /// are closed (the port can be bound again). NCCL links end when their peer goes.
    pub async fn shutdown(mut self) {
        self.registry.close();
        self.stop.take();
        if let Err(e) = (&mut self.accept).await
            && e.is_panic()
        {
            tracing::error!(error = %e, "KV receiver accept loop panicked");
        }
    }
}

impl Drop for KvReceiver {
    fn drop(&mut self) {
        // Dropping the stop sender ends the accept loop, which then closes every connection.
        self.stop.take();
        self.registry.close();
    }
}

/// The receiver's TLS configuration: the cluster's (mutual TLS with a CA). No session
/// tickets: the sender's pool peeks an idle connection to see whether it is still open, and a
/// ticket arriving after the handshake would look like a closing one.
fn server_config(tls: &Tls) -> Result<Arc<ServerConfig>, TransferError> {
    let config = tls
        .cluster_server_config(&[ALPN])
        .map_err(|e| TransferError::Tls(Arc::new(e)))?;
    let mut config = Arc::unwrap_or_clone(config);
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

async fn accept_loop(
    listener: TcpListener,
    registry: Arc<Registry>,
    cfg: TransferConfig,
    tls: Option<Arc<ServerConfig>>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut conns = JoinSet::new();
    let pool = Arc::new(BufferPool::default());
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let (registry, pool, cfg, tls) =
                        (Arc::clone(&registry), Arc::clone(&pool), cfg.clone(), tls.clone());
                    // The handshake runs on the connection's task, so a silent client holds up
                    // only itself. TCP_NODELAY: acks are tiny and the sender waits for them.
                    conns.spawn(async move {
                        match accept_tls(tcp, tls).await {
                            Ok(stream) => serve(stream, peer, registry, pool, cfg).await,
                            Err(e) => {
                                tracing::info!(%peer, error = %e, "KV connection refused in the TLS handshake");
                            }
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "KV receiver accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reap finished connections so the set does not grow with every connection served.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    // Aborts every connection task and waits until they are gone (their sockets closed).
    conns.shutdown().await;
}

//! The decode worker's listener: accepts sender connections and routes transfers to slots.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::TransferId;
use crate::config::TransferConfig;
use crate::error::TransferError;
use crate::pool::BufferPool;
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
    /// Binds `addr` (port 0 picks one) and starts accepting. Must run inside a tokio runtime.
    pub async fn bind(addr: SocketAddr, cfg: TransferConfig) -> Result<Self, TransferError> {
        let bind_err = |e| TransferError::Bind {
            addr,
            source: Arc::new(e),
        };
        let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
        let local_addr = listener.local_addr().map_err(bind_err)?;
        let registry = Arc::new(Registry::default());
        let channel_blocks = cfg.channel_blocks;
        let (stop, stopped) = oneshot::channel();
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&registry), cfg, stopped));
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

async fn accept_loop(
    listener: TcpListener,
    registry: Arc<Registry>,
    cfg: TransferConfig,
    mut stop: oneshot::Receiver<()>,
) {
    let mut conns = JoinSet::new();
    let pool = Arc::new(BufferPool::default());
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Acks are tiny and the sender waits for them: never let Nagle hold one.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::warn!(%peer, error = %e, "cannot set TCP_NODELAY");
                    }
                    conns.spawn(serve(
                        stream,
                        peer,
                        Arc::clone(&registry),
                        Arc::clone(&pool),
                        cfg.clone(),
                    ));
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

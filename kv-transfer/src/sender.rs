//! The prefill worker's side: pushes a transfer's blocks to a decode worker's receiver.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dolphin_kv_block::KvBlock;
use dolphin_tls::{Dialer, Tls, TlsError};
use parking_lot::Mutex;

use crate::TransferId;
use crate::config::TransferConfig;
use crate::error::TransferError;
use crate::link::Link;
use crate::metrics as m;

/// ALPN protocol of the KV transport over TLS.
pub(crate) const ALPN: &[u8] = b"dolphin-kv";

/// Idle connections kept per target; more concurrent transfers open more connections, and the
/// extra ones are closed when they finish.
const MAX_IDLE_PER_TARGET: usize = 8;

/// What one successful `send` moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendStats {
    /// Payload bytes (frame headers not counted).
    pub bytes: u64,
    /// Blocks.
    pub blocks: u32,
    /// From the call to the receiver's ack, connecting included.
    pub elapsed: Duration,
}

/// Sender on the prefill worker. Keeps a pool of idle connections per target, so repeated
/// transfers skip the connect and handshake; concurrent `send`s to one target each use their own
/// connection. Cheap to clone (clones share the pool).
#[derive(Clone, Debug)]
pub struct KvSender {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: TransferConfig,
    dialer: Dialer,
    idle: Mutex<HashMap<String, Vec<Link>>>,
}

impl KvSender {
    /// A sender with no connections yet, in plaintext.
    pub fn new(cfg: TransferConfig) -> Self {
        let dialer = Dialer::plain(cfg.io_timeout);
        Self::with_dialer(cfg, dialer)
    }

    /// A sender whose connections are TLS when `tls` is given: the receiver's certificate is
    /// checked against the CA, and this process's certificate is presented (mutual TLS).
    pub fn with_tls(cfg: TransferConfig, tls: Option<&Tls>) -> Result<Self, TlsError> {
        let dialer = Dialer::new(tls, &[ALPN], cfg.io_timeout)?;
        Ok(Self::with_dialer(cfg, dialer))
    }

    fn with_dialer(cfg: TransferConfig, dialer: Dialer) -> Self {
        Self {
            inner: Arc::new(Inner {
                cfg,
                dialer,
                idle: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Pushes `blocks` as transfer `id` to the receiver at `target` ("host:port") and waits for
    /// its ack. `Ok` means every block arrived intact and was handed to the decode worker.
    pub async fn send(
        &self,
        target: &str,
        id: TransferId,
        blocks: &[KvBlock],
    ) -> Result<SendStats, TransferError> {
        self.send_with_trailer(target, id, blocks, &Bytes::new())
            .await
    }

    /// [`send`](Self::send), the end frame carrying `trailer` (at most
    /// [`MAX_TRAILER_BYTES`](crate::frame::MAX_TRAILER_BYTES)) to the receiver's slot.
    pub async fn send_with_trailer(
        &self,
        target: &str,
        id: TransferId,
        blocks: &[KvBlock],
        trailer: &Bytes,
    ) -> Result<SendStats, TransferError> {
        let result = self.push(target, id, blocks, trailer).await;
        m::record_send(&result);
        result
    }

    async fn push(
        &self,
        target: &str,
        id: TransferId,
        blocks: &[KvBlock],
        trailer: &Bytes,
    ) -> Result<SendStats, TransferError> {
        let started = Instant::now();
        let cfg = &self.inner.cfg;
        let n_blocks = u32::try_from(blocks.len())
            .map_err(|_| TransferError::TooManyBlocks { n: blocks.len() })?;
        // Refuse here what the receiver would refuse after we had sent everything before it.
        if let Some((index, b)) = blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() > cfg.max_block_bytes as usize)
        {
            return Err(TransferError::BlockTooLarge {
                index,
                len: b.len(),
                max: cfg.max_block_bytes,
            });
        }

        let (mut link, reused) = match self.take_idle(target) {
            Some(link) => (link, true),
            None => (Link::connect(target, &self.inner.dialer, cfg).await?, false),
        };
        let mut result = link.transfer(id, blocks, trailer, cfg).await;
        if reused
            && result
                .as_ref()
                .is_err_and(TransferError::is_broken_connection)
        {
            // The receiver may have closed the pooled connection just as we took it. Retrying
            // is safe: the receiver consumes a transfer id at most once, so a retry is either
            // delivered whole or refused, never delivered twice.
            tracing::debug!(
                target,
                id,
                "pooled KV connection broken; retrying on a new one"
            );
            link = Link::connect(target, &self.inner.dialer, cfg).await?;
            result = link.transfer(id, blocks, trailer, cfg).await;
        }
        match &result {
            Ok(()) => self.put_idle(target, link),
            Err(TransferError::Refused { code, .. }) if code.keeps_connection() => {
                self.put_idle(target, link);
            }
            // Anything else may leave the stream mid-frame: drop the connection.
            Err(_) => {}
        }
        result.map(|()| SendStats {
            bytes: blocks.iter().map(|b| b.len() as u64).sum(),
            blocks: n_blocks,
            elapsed: started.elapsed(),
        })
    }

    /// Pushes transfer `id` of `n_blocks` blocks to `target` while they are still being
    /// produced: each block goes out as soon as it arrives on `blocks` and the socket is free,
    /// so the transfer overlaps the computation of the KV it carries. The end frame carries
    /// what `trailer` yields (the prefill's result, known only once it is done). Waits for the
    /// receiver's ack. If `blocks` closes before `n_blocks` arrived or `trailer` is dropped
    /// (the prefill failed or was cancelled), the connection is dropped mid-transfer, so the
    /// receiver sees it break, and the error is [`TransferError::SourceEnded`]. `elapsed` in
    /// the stats counts from the call, so it includes the wait for the first block.
    pub async fn send_stream(
        &self,
        target: &str,
        id: TransferId,
        n_blocks: u32,
        blocks: tokio::sync::mpsc::UnboundedReceiver<KvBlock>,
        trailer: tokio::sync::oneshot::Receiver<Bytes>,
    ) -> Result<SendStats, TransferError> {
        if n_blocks == 0 {
            let trailer = trailer.await.map_err(|_| TransferError::SourceEnded {
                id,
                sent: 0,
                expected: 0,
            });
            let result = match trailer {
                Ok(trailer) => self.push(target, id, &[], &trailer).await,
                Err(e) => Err(e),
            };
            m::record_send(&result);
            return result;
        }
        let result = self
            .push_stream(target, id, n_blocks, blocks, trailer)
            .await;
        m::record_send(&result);
        result
    }

    async fn push_stream(
        &self,
        target: &str,
        id: TransferId,
        n_blocks: u32,
        mut blocks: tokio::sync::mpsc::UnboundedReceiver<KvBlock>,
        mut trailer: tokio::sync::oneshot::Receiver<Bytes>,
    ) -> Result<SendStats, TransferError> {
        let started = Instant::now();
        let cfg = &self.inner.cfg;
        let mut link = match self.take_idle(target) {
            Some(link) => link,
            None => Link::connect(target, &self.inner.dialer, cfg).await?,
        };
        // No retry on a fresh connection as `send` does: blocks taken from the source are gone.
        // `take_idle` probed the pooled link just now; a link that still breaks fails this
        // transfer, and the decode worker falls back to prefilling locally.
        let result = link
            .transfer_stream(id, n_blocks, &mut blocks, &mut trailer, cfg)
            .await;
        match &result {
            Ok(_) => self.put_idle(target, link),
            Err(TransferError::Refused { code, .. }) if code.keeps_connection() => {
                self.put_idle(target, link);
            }
            Err(_) => {}
        }
        result.map(|(blocks, bytes)| SendStats {
            bytes,
            blocks,
            elapsed: started.elapsed(),
        })
    }

    fn take_idle(&self, target: &str) -> Option<Link> {
        // Half the receiver's idle timeout: leave a margin so we do not pick a connection the
        // receiver is about to close.
        let max_idle = self.inner.cfg.idle_timeout / 2;
        let mut idle = self.inner.idle.lock();
        let links = idle.get_mut(target)?;
        // Most recently used first: the likeliest to be alive.
        while let Some(link) = links.pop() {
            if link.is_reusable(max_idle) {
                return Some(link);
            }
        }
        None
    }

    fn put_idle(&self, target: &str, mut link: Link) {
        link.touch();
        let mut idle = self.inner.idle.lock();
        let links = idle.entry(target.to_owned()).or_default();
        if links.len() < MAX_IDLE_PER_TARGET {
            links.push(link);
        }
    }

    /// Idle pooled connections to `target` (for tests and metrics).
    pub fn idle_connections(&self, target: &str) -> usize {
        self.inner.idle.lock().get(target).map_or(0, Vec::len)
    }
}

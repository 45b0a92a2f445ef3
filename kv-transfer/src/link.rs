//! The sender's side of one connection: connect and handshake, then one transfer at a time.

use std::io::{ErrorKind, IoSlice};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dolphin_kv_block::KvBlock;
use dolphin_tls::{Dialer, MaybeTlsStream};
use tokio::io::ReadBuf;
use tokio::sync::{mpsc, oneshot};

use crate::TransferId;
use crate::batch::{BATCH_BLOCKS, BATCH_BYTES, batch_at, checksums};
use crate::config::TransferConfig;
use crate::error::TransferError;
use crate::frame::{
    AckCode, Frame, FrameError, HEADER_LEN, MAX_TRAILER_BYTES, PREFACE_LEN, Preface, VERSION,
    end_frame,
};
use crate::io::{flush, read_exact, write_all, write_all_vectored};

/// A connected, handshaken socket to one receiver (TLS on it when the sender has TLS).
#[derive(Debug)]
pub(crate) struct Link {
    stream: MaybeTlsStream,
    idle_since: Instant,
}

impl Link {
    /// Connects to `target` (TCP_NODELAY: headers are small writes, and Nagle would hold them
    /// behind an ack; TLS when `dialer` has it) and exchanges prefaces.
    pub(crate) async fn connect(
        target: &str,
        dialer: &Dialer,
        cfg: &TransferConfig,
    ) -> Result<Self, TransferError> {
        let after = cfg.io_timeout;
        let mut stream = match dialer.dial(target).await {
            Ok(s) => s,
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                return Err(TransferError::Timeout {
                    op: "connect",
                    after,
                });
            }
            Err(e) => {
                return Err(TransferError::Connect {
                    target: target.to_owned(),
                    source: Arc::new(e),
                });
            }
        };
        write_all(
            &mut stream,
            &Preface::CURRENT.encode(),
            after,
            "write preface",
        )
        .await?;
        let mut b = [0u8; PREFACE_LEN];
        read_exact(&mut stream, &mut b, after, "read preface").await?;
        let theirs = Preface::decode(&b)?;
        if theirs.version != VERSION {
            return Err(TransferError::VersionMismatch {
                ours: VERSION,
                theirs: theirs.version,
            });
        }
        Ok(Self {
            stream,
            idle_since: Instant::now(),
        })
    }

    /// Whether a pooled link can carry another transfer: not idle too long, and the receiver
    /// has not closed it. An open, idle connection has nothing to read; a closed one reads as
    /// end-of-file or an error at once, and a TLS one that is closing has its close_notify
    /// waiting. The TCP socket is peeked, never read, so TLS records stay where they are.
    pub(crate) fn is_reusable(&self, max_idle: Duration) -> bool {
        if self.idle_since.elapsed() >= max_idle {
            return false;
        }
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        // Pending: nothing to read, the connection is open and idle. The no-op waker is
        // replaced by the next real read.
        matches!(
            self.stream.tcp().poll_peek(&mut cx, &mut probe),
            Poll::Pending
        )
    }

    /// Marks the link idle from now (it goes back to the pool).
    pub(crate) fn touch(&mut self) {
        self.idle_since = Instant::now();
    }

    /// Sends one transfer, its end frame carrying `trailer`, and waits for its ack.
    pub(crate) async fn transfer(
        &mut self,
        id: TransferId,
        blocks: &[KvBlock],
        trailer: &Bytes,
        cfg: &TransferConfig,
    ) -> Result<(), TransferError> {
        check_trailer(id, trailer)?;
        if let Err(e) = self
            .write_transfer(id, blocks, trailer, cfg.io_timeout)
            .await
        {
            return Err(self.refusal_or(id, e, cfg).await);
        }
        self.read_ack(id, cfg.io_timeout).await?
    }

    /// Sends one transfer of `n_blocks` blocks taken from `blocks` as they arrive (each batch
    /// is what is waiting when the socket is free), its end frame carrying what `trailer`
    /// yields, then waits for its ack. The transfer begins once the first block is there, so
    /// the receiver's progress timeout does not run while the source has not started. When the
    /// trailer is ready with the last blocks it goes in the same write; otherwise the blocks go
    /// out at once and the end frame follows. Blocks beyond `n_blocks` are left in `blocks`; a
    /// source that ends early (either channel closed before it delivered) is
    /// [`TransferError::SourceEnded`] (the link must then be dropped).
    pub(crate) async fn transfer_stream(
        &mut self,
        id: TransferId,
        n_blocks: u32,
        blocks: &mut mpsc::UnboundedReceiver<KvBlock>,
        trailer: &mut oneshot::Receiver<Bytes>,
        cfg: &TransferConfig,
    ) -> Result<(u32, u64), TransferError> {
        let mut sent = 0u32;
        let mut bytes = 0u64;
        let mut batch: Vec<KvBlock> = Vec::with_capacity(BATCH_BLOCKS);
        let ended = |sent| TransferError::SourceEnded {
            id,
            sent,
            expected: n_blocks,
        };
        let mut end: Option<Bytes> = None;
        while sent < n_blocks {
            let Some(first) = blocks.recv().await else {
                return Err(ended(sent));
            };
            batch.clear();
            let mut batch_bytes = first.len();
            batch.push(first);
            // What is already waiting joins the batch, within the same limits as `batch_at`.
            while batch.len() < BATCH_BLOCKS
                && batch_bytes < BATCH_BYTES
                && (sent as usize + batch.len()) < n_blocks as usize
                && let Ok(b) = blocks.try_recv()
            {
                batch_bytes += b.len();
                batch.push(b);
            }
            if let Some((k, b)) = batch
                .iter()
                .enumerate()
                .find(|(_, b)| b.len() > cfg.max_block_bytes as usize)
            {
                return Err(TransferError::BlockTooLarge {
                    index: sent as usize + k,
                    len: b.len(),
                    max: cfg.max_block_bytes,
                });
            }
            let last = sent as usize + batch.len() == n_blocks as usize;
            if last {
                end = match trailer.try_recv() {
                    Ok(t) => Some(t),
                    Err(oneshot::error::TryRecvError::Empty) => None,
                    Err(oneshot::error::TryRecvError::Closed) => {
                        return Err(ended(sent + batch.len() as u32));
                    }
                };
                if let Some(t) = &end {
                    check_trailer(id, t)?;
                }
            }
            let result = self
                .write_blocks(id, n_blocks, sent, &batch, end.as_ref(), cfg.io_timeout)
                .await;
            if let Err(e) = result {
                return Err(self.refusal_or(id, e, cfg).await);
            }
            sent += batch.len() as u32;
            bytes += batch.iter().map(|b| b.len() as u64).sum::<u64>();
        }
        if end.is_none() {
            // The last blocks are out; the result comes when the source has it.
            let t = trailer.await.map_err(|_| ended(sent))?;
            check_trailer(id, &t)?;
            let frame = end_frame(id, n_blocks, &t).encode();
            let mut slices = [IoSlice::new(&frame), IoSlice::new(&t)];
            let n = if t.is_empty() { 1 } else { 2 };
            let result = write_all_vectored(
                &mut self.stream,
                &mut slices[..n],
                cfg.io_timeout,
                "write end",
            )
            .await;
            if let Err(e) = result {
                return Err(self.refusal_or(id, e, cfg).await);
            }
        }
        self.read_ack(id, cfg.io_timeout).await??;
        Ok((sent, bytes))
    }

    /// A receiver that refused a frame acks before closing: its reason beats "broken pipe".
    async fn refusal_or(
        &mut self,
        id: TransferId,
        e: TransferError,
        cfg: &TransferConfig,
    ) -> TransferError {
        if e.is_broken_connection()
            && let Ok(Err(refused @ TransferError::Refused { .. })) =
                self.read_ack(id, cfg.io_timeout).await
        {
            return refused;
        }
        e
    }

    /// Writes `batch`, blocks `first..` of a transfer of `n_blocks`: the begin frame before
    /// block 0 and, with the last block when `trailer` is given, the end frame and the trailer,
    /// in one vectored write.
    async fn write_blocks(
        &mut self,
        id: TransferId,
        n_blocks: u32,
        first: u32,
        batch: &[KvBlock],
        trailer: Option<&Bytes>,
        after: Duration,
    ) -> Result<(), TransferError> {
        let begin = Frame::Begin { id, n_blocks }.encode();
        let end = trailer.map(|t| end_frame(id, n_blocks, t).encode());
        let mut headers = [[0u8; HEADER_LEN]; BATCH_BLOCKS];
        let sums = checksums(id, first as usize, batch);
        for (k, ((header, block), checksum)) in headers.iter_mut().zip(batch).zip(sums).enumerate()
        {
            *header = Frame::Block {
                id,
                index: first + k as u32,
                len: block.len() as u32,
                checksum,
            }
            .encode();
        }
        let mut slices = [IoSlice::new(&[]); 2 * BATCH_BLOCKS + 3];
        let mut n = 0;
        if first == 0 {
            push(&mut slices, &mut n, &begin);
        }
        for (header, block) in headers.iter().zip(batch) {
            push(&mut slices, &mut n, header);
            if !block.is_empty() {
                push(&mut slices, &mut n, block.bytes());
            }
        }
        if first as usize + batch.len() == n_blocks as usize
            && let (Some(end), Some(trailer)) = (&end, trailer)
        {
            push(&mut slices, &mut n, end);
            if !trailer.is_empty() {
                push(&mut slices, &mut n, trailer);
            }
        }
        write_all_vectored(&mut self.stream, &mut slices[..n], after, "write blocks").await
    }

    async fn write_transfer(
        &mut self,
        id: TransferId,
        blocks: &[KvBlock],
        trailer: &Bytes,
        after: Duration,
    ) -> Result<(), TransferError> {
        let n_blocks = u32::try_from(blocks.len())
            .map_err(|_| TransferError::TooManyBlocks { n: blocks.len() })?;
        if blocks.is_empty() {
            let begin = Frame::Begin { id, n_blocks }.encode();
            let end = end_frame(id, n_blocks, trailer).encode();
            let mut slices = [
                IoSlice::new(&begin),
                IoSlice::new(&end),
                IoSlice::new(trailer),
            ];
            let n = if trailer.is_empty() { 2 } else { 3 };
            return write_all_vectored(&mut self.stream, &mut slices[..n], after, "write blocks")
                .await;
        }
        let mut start = 0;
        while start < blocks.len() {
            let range = batch_at(blocks, start);
            // Lossless: start < n_blocks, a u32.
            self.write_blocks(
                id,
                n_blocks,
                start as u32,
                &blocks[range.clone()],
                Some(trailer),
                after,
            )
            .await?;
            start = range.end;
        }
        Ok(())
    }

    /// Reads the ack of transfer `id`, after flushing what was written (the receiver acks
    /// only once it has everything). The outer error is a broken link; the inner one the
    /// receiver's refusal, after which the link may still be usable.
    async fn read_ack(
        &mut self,
        id: TransferId,
        after: Duration,
    ) -> Result<Result<(), TransferError>, TransferError> {
        flush(&mut self.stream, after, "flush transfer").await?;
        let mut b = [0u8; HEADER_LEN];
        read_exact(&mut self.stream, &mut b, after, "read ack").await?;
        match Frame::decode(&b, 0)? {
            Frame::Ack {
                id: got,
                code,
                index,
            } if got == id => Ok(match code {
                AckCode::Ok => Ok(()),
                code => Err(TransferError::Refused { id, code, index }),
            }),
            _ => Err(TransferError::UnexpectedFrame {
                id,
                detail: "expected the transfer's ack",
            }),
        }
    }
}

/// Refuses a trailer the receiver would refuse.
fn check_trailer(id: TransferId, trailer: &Bytes) -> Result<(), TransferError> {
    match u32::try_from(trailer.len()) {
        Ok(len) if len <= MAX_TRAILER_BYTES => Ok(()),
        _ => Err(FrameError::TrailerTooLarge {
            id,
            len: u32::try_from(trailer.len()).unwrap_or(u32::MAX),
        }
        .into()),
    }
}

fn push<'a>(slices: &mut [IoSlice<'a>], n: &mut usize, s: &'a [u8]) {
    slices[*n] = IoSlice::new(s);
    *n += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn closed_peer_makes_a_link_unusable() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let (close_tx, close_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut p = [0u8; PREFACE_LEN];
            s.read_exact(&mut p).await.unwrap();
            s.write_all(&Preface::CURRENT.encode()).await.unwrap();
            let _ = close_rx.await;
        });
        let cfg = TransferConfig::default();
        let dialer = Dialer::plain(cfg.io_timeout);
        let link = Link::connect(&target, &dialer, &cfg).await.unwrap();
        assert!(link.is_reusable(Duration::from_secs(60)));
        assert!(
            !link.is_reusable(Duration::ZERO),
            "idle longer than allowed"
        );
        drop(close_tx);
        server.await.unwrap();
        // The FIN reaches the reactor at some point; until then the link looks alive.
        while link.is_reusable(Duration::from_secs(60)) {
            tokio::task::yield_now().await;
        }
    }
}

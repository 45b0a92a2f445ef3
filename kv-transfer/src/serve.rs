//! The receiver's side of one connection: handshake, then transfers one after another.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use dolphin_tls::MaybeTlsStream;
use tokio::io::AsyncWriteExt;

use crate::TransferId;
use crate::config::TransferConfig;
use crate::error::TransferError;
use crate::frame::{
    AckCode, BlockHasher, Frame, HEADER_LEN, PREFACE_LEN, Preface, TRAILER_INDEX, VERSION,
    raw_transfer_id,
};
use crate::io::{discard, read_exact, read_next, read_payload, write_all};
use crate::pool::BufferPool;
use crate::slot::{Claim, Registry, SlotSink};

/// The wait for a transfer to begin; it times out after `idle_timeout`, not `io_timeout`.
const IDLE_OP: &str = "wait for a transfer";

/// Size of the buffer that drains payloads nobody takes.
const SCRATCH_BYTES: usize = 64 << 10;

/// Serves one accepted connection until the peer closes it or breaks the protocol.
pub(crate) async fn serve(
    stream: MaybeTlsStream,
    peer: SocketAddr,
    registry: Arc<Registry>,
    pool: Arc<BufferPool>,
    cfg: TransferConfig,
) {
    let mut conn = Conn {
        stream,
        registry,
        pool,
        cfg,
        scratch: Vec::new(),
    };
    match conn.run().await {
        Ok(()) => tracing::trace!(%peer, "KV connection closed"),
        Err(e) => tracing::warn!(%peer, error = %e, "KV connection failed"),
    }
}

/// Where a transfer's blocks go.
enum Sink {
    /// To the decode worker's slot.
    Deliver(SlotSink),
    /// Nowhere: read and drop them, then answer with this code and block index.
    Drain(AckCode, u32),
}

/// What became of one block meant for a slot.
enum Verdict {
    Delivered,
    /// Payload read, but its checksum is wrong.
    Corrupt,
    /// The slot was dropped; the payload is still on the wire.
    SlotDropped,
    /// The consumer took no block for `io_timeout`; the payload is still on the wire.
    Stalled,
}

struct Conn {
    stream: MaybeTlsStream,
    registry: Arc<Registry>,
    /// Block buffers, shared by the receiver's connections.
    pool: Arc<BufferPool>,
    cfg: TransferConfig,
    /// Allocated on the first drained payload only.
    scratch: Vec<u8>,
}

impl Conn {
    async fn run(&mut self) -> Result<(), TransferError> {
        self.handshake().await?;
        loop {
            let mut header = [0u8; HEADER_LEN];
            let next = read_next(
                &mut self.stream,
                &mut header,
                self.cfg.idle_timeout,
                self.cfg.io_timeout,
                IDLE_OP,
            )
            .await;
            match next {
                Ok(Some(())) => {}
                Ok(None) => return Ok(()),
                // Closing a connection nobody uses is routine; the sender reconnects.
                Err(TransferError::Timeout { op: IDLE_OP, .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
            let id = raw_transfer_id(&header);
            let result = match Frame::decode(&header, self.cfg.max_block_bytes) {
                Ok(Frame::Begin { id, n_blocks }) => self.transfer(id, n_blocks).await,
                Ok(_) => Err(TransferError::UnexpectedFrame {
                    id,
                    detail: "expected a begin frame",
                }),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                if let Some((code, index)) = e.fatal_ack() {
                    // The stream is out of step: say why, then close. Best effort, the
                    // connection is being dropped anyway.
                    let _ = self.ack(id, code, index).await;
                    let _ = self.stream.shutdown().await;
                }
                return Err(e);
            }
        }
    }

    async fn handshake(&mut self) -> Result<(), TransferError> {
        let mut b = [0u8; PREFACE_LEN];
        read_exact(
            &mut self.stream,
            &mut b,
            self.cfg.io_timeout,
            "read preface",
        )
        .await?;
        let theirs = Preface::decode(&b)?;
        let ours = Preface::CURRENT.encode();
        write_all(
            &mut self.stream,
            &ours,
            self.cfg.io_timeout,
            "write preface",
        )
        .await?;
        if theirs.version != VERSION {
            return Err(TransferError::VersionMismatch {
                ours: VERSION,
                theirs: theirs.version,
            });
        }
        Ok(())
    }

    /// Receives one transfer after its begin frame and acks it. Errors are fatal to the
    /// connection; refusals (unknown id, bad checksum, dropped slot) are acked and not errors.
    async fn transfer(&mut self, id: TransferId, n_blocks: u32) -> Result<(), TransferError> {
        let mut sink = match self.registry.claim(id, n_blocks) {
            Claim::Slot(s) => Sink::Deliver(s),
            Claim::CountMismatch | Claim::Dropped => Sink::Drain(AckCode::Rejected, 0),
            Claim::Unknown => Sink::Drain(AckCode::UnknownTransfer, 0),
        };
        let received = self.receive_blocks(id, n_blocks, &mut sink).await;
        let (code, index) = match (received, sink) {
            // The slot hears first, the sender second: the decode worker goes on with the
            // trailer's result while the ack is on its way.
            (Ok(Ok(trailer)), Sink::Deliver(s)) => {
                s.finish(Ok(trailer));
                (AckCode::Ok, 0)
            }
            (Ok(Err(e)), Sink::Deliver(s)) => {
                s.finish(Err(e));
                (AckCode::ChecksumMismatch, TRAILER_INDEX)
            }
            (Ok(_), Sink::Drain(code, index)) => (code, index),
            (Err(e), Sink::Deliver(s)) => {
                s.finish(Err(e.clone()));
                return Err(e);
            }
            (Err(e), Sink::Drain(..)) => return Err(e),
        };
        if code != AckCode::Ok {
            tracing::debug!(id, %code, index, "KV transfer refused");
        }
        self.ack(id, code, index).await
    }

    /// Reads the blocks and the end frame with its trailer. The outer error breaks the
    /// connection; the inner one is a corrupt trailer (read whole, so the stream is in step).
    async fn receive_blocks(
        &mut self,
        id: TransferId,
        n_blocks: u32,
        sink: &mut Sink,
    ) -> Result<Result<Bytes, TransferError>, TransferError> {
        let mut next = 0u32;
        loop {
            let mut header = [0u8; HEADER_LEN];
            let io_timeout = self.cfg.io_timeout;
            read_exact(
                &mut self.stream,
                &mut header,
                io_timeout,
                "read block frame",
            )
            .await?;
            let detail = match Frame::decode(&header, self.cfg.max_block_bytes)? {
                Frame::Block { id: got, .. } | Frame::End { id: got, .. } if got != id => {
                    "frame of another transfer"
                }
                Frame::Block {
                    index,
                    len,
                    checksum,
                    ..
                } if index == next && next < n_blocks => {
                    self.block(id, index, len as usize, checksum, sink).await?;
                    next += 1;
                    continue;
                }
                Frame::Block { .. } => "block out of order or beyond the announced count",
                Frame::End {
                    n_blocks: sent,
                    len,
                    checksum,
                    ..
                } if sent == n_blocks && next == n_blocks => {
                    return self.trailer(id, len as usize, checksum).await;
                }
                Frame::End { .. } => "end frame before all blocks or with another count",
                Frame::Begin { .. } | Frame::Ack { .. } => "expected a block or end frame",
            };
            return Err(TransferError::UnexpectedFrame { id, detail });
        }
    }

    /// Reads an end frame's trailer (bounded by the frame decoder) and checks it.
    async fn trailer(
        &mut self,
        id: TransferId,
        len: usize,
        checksum: u32,
    ) -> Result<Result<Bytes, TransferError>, TransferError> {
        if len == 0 {
            return Ok(Ok(Bytes::new()));
        }
        let mut hasher = BlockHasher::new(id, TRAILER_INDEX);
        let buf = BytesMut::with_capacity(len);
        let io_timeout = self.cfg.io_timeout;
        let trailer = read_payload(&mut self.stream, buf, len, &mut hasher, io_timeout).await?;
        if hasher.finish() != checksum {
            return Ok(Err(TransferError::ChecksumMismatch {
                id,
                index: TRAILER_INDEX,
            }));
        }
        Ok(Ok(trailer.freeze()))
    }

    /// Reads one block's payload (its header already read) and hands it on or drops it.
    async fn block(
        &mut self,
        id: TransferId,
        index: u32,
        len: usize,
        checksum: u32,
        sink: &mut Sink,
    ) -> Result<(), TransferError> {
        let io_timeout = self.cfg.io_timeout;
        let verdict = match &*sink {
            Sink::Drain(..) => None,
            Sink::Deliver(s) => Some(self.deliver(s, id, index, len, checksum).await?),
        };
        let (code, slot_error) = match verdict {
            Some(Verdict::Delivered) => return Ok(()),
            Some(Verdict::Corrupt) => {
                let e = TransferError::ChecksumMismatch { id, index };
                self.fail(sink, AckCode::ChecksumMismatch, index, Some(e));
                return Ok(());
            }
            None => return self.drain(len).await,
            Some(Verdict::SlotDropped) => (AckCode::Rejected, None),
            Some(Verdict::Stalled) => {
                let e = TransferError::Timeout {
                    op: "hand a block to the decode worker",
                    after: io_timeout,
                };
                (AckCode::Rejected, Some(e))
            }
        };
        self.fail(sink, code, index, slot_error);
        self.drain(len).await
    }

    /// Reads one block's payload into the slot's channel, checking it on the way.
    async fn deliver(
        &mut self,
        slot: &SlotSink,
        id: TransferId,
        index: u32,
        len: usize,
        checksum: u32,
    ) -> Result<Verdict, TransferError> {
        let io_timeout = self.cfg.io_timeout;
        // Room in the channel first, payload second: while the consumer is behind, the bytes
        // wait in the socket and TCP flow control slows the sender.
        let permit = match tokio::time::timeout(io_timeout, slot.blocks.reserve()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_closed)) => return Ok(Verdict::SlotDropped),
            Err(_elapsed) => return Ok(Verdict::Stalled),
        };
        let mut hasher = BlockHasher::new(id, index);
        let buf = self.pool.take(len);
        let payload = read_payload(&mut self.stream, buf, len, &mut hasher, io_timeout).await?;
        if hasher.finish() != checksum {
            return Ok(Verdict::Corrupt);
        }
        let payload = payload.freeze();
        self.pool.track(&payload);
        permit.send((index, payload));
        Ok(Verdict::Delivered)
    }

    /// Switches a transfer to draining, telling its slot why (if it is still there).
    fn fail(&self, sink: &mut Sink, code: AckCode, index: u32, error: Option<TransferError>) {
        if let Sink::Deliver(s) = std::mem::replace(sink, Sink::Drain(code, index))
            && let Some(e) = error
        {
            s.finish(Err(e));
        }
    }

    async fn drain(&mut self, len: usize) -> Result<(), TransferError> {
        if self.scratch.is_empty() && len > 0 {
            self.scratch = vec![0u8; SCRATCH_BYTES];
        }
        discard(
            &mut self.stream,
            len,
            &mut self.scratch,
            self.cfg.io_timeout,
        )
        .await
    }

    async fn ack(
        &mut self,
        id: TransferId,
        code: AckCode,
        index: u32,
    ) -> Result<(), TransferError> {
        let frame = Frame::Ack { id, code, index }.encode();
        write_all(&mut self.stream, &frame, self.cfg.io_timeout, "write ack").await
    }
}

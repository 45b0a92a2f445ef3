//! How a prefill worker pushes a transfer's blocks to a decode worker, whatever carries them:
//! TCP ([`KvSender`]) everywhere, NCCL between GPUs (`NcclSender`, feature `nccl`).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use dolphin_kv_block::KvBlock;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

use crate::TransferId;
use crate::error::TransferError;
use crate::sender::{KvSender, SendStats};

/// The future of one [`KvTransport::send_stream`].
pub type SendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<SendStats, TransferError>> + Send + 'a>>;

/// A way to push KV blocks to decode workers. Every implementation keeps the guarantees of the
/// crate: a transfer is delivered whole and acknowledged, or it fails on both sides; a transfer id
/// is delivered at most once; payloads are checksummed.
pub trait KvTransport: Debug + Send + Sync {
    /// Name for logs and metrics (`tcp`, `nccl`).
    fn kind(&self) -> &'static str;

    /// Pushes transfer `id` of `n_blocks` blocks to the decode worker known as `target` (its KV
    /// address), taking the blocks from `blocks` as they are produced, ends it with what
    /// `trailer` yields (the receiver's slot gets it with the end of the transfer), and waits
    /// for the receiver's ack. A source that closes early, or a trailer dropped unsent, fails
    /// the transfer on both sides ([`TransferError::SourceEnded`]).
    fn send_stream<'a>(
        &'a self,
        target: &'a str,
        id: TransferId,
        n_blocks: u32,
        blocks: UnboundedReceiver<KvBlock>,
        trailer: oneshot::Receiver<Bytes>,
    ) -> SendFuture<'a>;
}

impl KvTransport for KvSender {
    fn kind(&self) -> &'static str {
        "tcp"
    }

    fn send_stream<'a>(
        &'a self,
        target: &'a str,
        id: TransferId,
        n_blocks: u32,
        blocks: UnboundedReceiver<KvBlock>,
        trailer: oneshot::Receiver<Bytes>,
    ) -> SendFuture<'a> {
        Box::pin(KvSender::send_stream(
            self, target, id, n_blocks, blocks, trailer,
        ))
    }
}

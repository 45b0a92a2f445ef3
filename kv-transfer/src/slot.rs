//! Transfers announced by the decode worker, and the slots their blocks arrive on.
//!
//! `expect` puts a pending entry in the [`Registry`]; the connection that receives the transfer's
//! begin frame claims it (at most once: a transfer id is consumed by its first delivery) and
//! feeds the blocks into the slot's bounded channel. The slot learns how the transfer ended
//! through a one-shot outcome, sent before the channel closes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::TransferId;
use crate::error::TransferError;
use crate::metrics as m;

/// How many ids of slots dropped before their transfer began are remembered, to answer
/// "rejected" rather than "unknown". Bounded so abandoned announcements cannot grow memory.
const DROPPED_MEMORY: usize = 4096;

/// How a transfer ended, as the slot sees it: its end frame's trailer, or why it failed.
pub(crate) type Outcome = Result<Bytes, TransferError>;

/// The receiving end of one announced transfer: blocks arrive in index order.
///
/// Dropping the slot rejects the transfer: the sender gets a `rejected` ack and the bytes still
/// on the wire are drained without being kept.
#[derive(Debug)]
pub struct TransferSlot {
    id: TransferId,
    n_blocks: u32,
    blocks: mpsc::Receiver<(u32, Bytes)>,
    outcome: oneshot::Receiver<Outcome>,
    finished: bool,
    trailer: Option<Bytes>,
    registry: Arc<Registry>,
    generation: u64,
}

impl TransferSlot {
    /// The transfer this slot receives.
    pub fn id(&self) -> TransferId {
        self.id
    }

    /// Blocks announced with `expect`.
    pub fn n_blocks(&self) -> u32 {
        self.n_blocks
    }

    /// The next block as `(index, bytes)`, indexes 0, 1, ... in order. `None` once every block
    /// has arrived and the transfer is complete; `Some(Err(..))` once if it failed, after which
    /// blocks already delivered must be discarded.
    pub async fn recv(&mut self) -> Option<Result<(u32, Bytes), TransferError>> {
        if self.finished {
            return None;
        }
        if let Some(block) = self.blocks.recv().await {
            metrics::counter!(m::RECEIVED_BLOCKS_TOTAL).increment(1);
            metrics::counter!(m::RECEIVED_BYTES_TOTAL).increment(block.1.len() as u64);
            return Some(Ok(block));
        }
        // The channel closes only after the outcome was sent, or when its sender was dropped
        // without one (connection lost, receiver shut down).
        self.finished = true;
        let e = match self.outcome.try_recv() {
            Ok(Ok(trailer)) => {
                self.trailer = Some(trailer);
                return None;
            }
            Ok(Err(e)) => e,
            Err(_) => TransferError::Aborted { id: self.id },
        };
        m::failed("receive", &e);
        Some(Err(e))
    }
}

impl TransferSlot {
    /// The trailer of the transfer's end frame (empty when the sender sent none), once
    /// [`recv`](Self::recv) returned `None`: the transfer is complete. `None` before that or
    /// after a failure.
    pub fn trailer(&self) -> Option<&Bytes> {
        self.trailer.as_ref()
    }
}

impl Drop for TransferSlot {
    fn drop(&mut self) {
        self.registry.release(self.id, self.generation);
    }
}

/// The connection side of a claimed slot.
#[derive(Debug)]
pub(crate) struct SlotSink {
    pub(crate) blocks: mpsc::Sender<(u32, Bytes)>,
    outcome: oneshot::Sender<Outcome>,
}

impl SlotSink {
    /// Ends the transfer for the slot. Consuming the sink closes the block channel right after
    /// the outcome is set, which is the order `TransferSlot::recv` relies on.
    pub(crate) fn finish(self, outcome: Outcome) {
        // The slot may be gone already; then nobody needs to hear it.
        let _ = self.outcome.send(outcome);
    }
}

/// What a connection found for a transfer id announced in a begin frame.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The transfer is expected with this block count; deliver to the sink.
    Slot(SlotSink),
    /// Expected, but with another block count: the slot has been failed, drain and reject.
    CountMismatch,
    /// Its slot was dropped before the transfer began: drain and reject.
    Dropped,
    /// Never announced, or already delivered: drain and answer "unknown".
    Unknown,
}

#[derive(Debug)]
struct Pending {
    generation: u64,
    n_blocks: u32,
    sink: SlotSink,
}

#[derive(Debug, Default)]
struct Inner {
    pending: HashMap<TransferId, Pending>,
    dropped: VecDeque<TransferId>,
    next_generation: u64,
    closed: bool,
}

/// Announced transfers not yet claimed by a connection.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

impl Registry {
    /// Announces a transfer and returns its slot; a pending announcement of the same id is
    /// superseded (its slot gets an error).
    pub(crate) fn expect(
        self: &Arc<Self>,
        id: TransferId,
        n_blocks: u32,
        channel_blocks: usize,
    ) -> TransferSlot {
        let (block_tx, block_rx) = mpsc::channel(channel_blocks.max(1));
        let (outcome_tx, outcome_rx) = oneshot::channel();
        let sink = SlotSink {
            blocks: block_tx,
            outcome: outcome_tx,
        };
        let mut inner = self.inner.lock();
        let generation = inner.next_generation;
        inner.next_generation += 1;
        if inner.closed {
            // Receiver shut down: the slot sees `Aborted` at once.
            drop(sink);
        } else {
            inner.dropped.retain(|&d| d != id);
            let old = inner.pending.insert(
                id,
                Pending {
                    generation,
                    n_blocks,
                    sink,
                },
            );
            if let Some(old) = old {
                old.sink.finish(Err(TransferError::Superseded { id }));
            }
        }
        drop(inner);
        TransferSlot {
            id,
            n_blocks,
            blocks: block_rx,
            outcome: outcome_rx,
            finished: false,
            trailer: None,
            registry: Arc::clone(self),
            generation,
        }
    }

    /// Takes the announcement of `id` for a connection that received its begin frame.
    pub(crate) fn claim(&self, id: TransferId, announced: u32) -> Claim {
        let mut inner = self.inner.lock();
        let Some(p) = inner.pending.remove(&id) else {
            return if inner.dropped.contains(&id) {
                Claim::Dropped
            } else {
                Claim::Unknown
            };
        };
        drop(inner);
        if p.sink.blocks.is_closed() {
            return Claim::Dropped;
        }
        if p.n_blocks != announced {
            p.sink.finish(Err(TransferError::BlockCountMismatch {
                id,
                expected: p.n_blocks,
                announced,
            }));
            return Claim::CountMismatch;
        }
        Claim::Slot(p.sink)
    }

    /// A slot was dropped: forget its announcement if no connection claimed it yet, and
    /// remember the id so a late transfer is told "rejected".
    fn release(&self, id: TransferId, generation: u64) {
        let mut inner = self.inner.lock();
        if inner
            .pending
            .get(&id)
            .is_some_and(|p| p.generation == generation)
        {
            inner.pending.remove(&id);
            if inner.dropped.len() == DROPPED_MEMORY {
                inner.dropped.pop_front();
            }
            inner.dropped.push_back(id);
        }
    }

    /// Receiver shut down: every pending slot ends with `Aborted`, later ones at once.
    pub(crate) fn close(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.pending.clear();
        inner.dropped.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    #[tokio::test]
    async fn claimed_slot_gets_blocks_then_completion() {
        let reg = registry();
        let mut slot = reg.expect(1, 2, 4);
        let Claim::Slot(sink) = reg.claim(1, 2) else {
            panic!("expected a slot")
        };
        sink.blocks
            .send((0, Bytes::from_static(b"a")))
            .await
            .unwrap();
        sink.blocks
            .send((1, Bytes::from_static(b"b")))
            .await
            .unwrap();
        sink.finish(Ok(Bytes::from_static(b"done")));
        assert_eq!(slot.recv().await.unwrap().unwrap().0, 0);
        assert_eq!(slot.recv().await.unwrap().unwrap().0, 1);
        assert!(slot.trailer().is_none(), "no trailer before the end");
        assert!(slot.recv().await.is_none());
        assert_eq!(slot.trailer().map(|b| &b[..]), Some(&b"done"[..]));
        assert!(slot.recv().await.is_none());
        // Consumed: a second delivery of the same id is unknown.
        assert!(matches!(reg.claim(1, 2), Claim::Unknown));
    }

    #[tokio::test]
    async fn lost_sink_aborts_the_slot() {
        let reg = registry();
        let mut slot = reg.expect(1, 1, 4);
        let Claim::Slot(sink) = reg.claim(1, 1) else {
            panic!("expected a slot")
        };
        drop(sink);
        assert!(matches!(
            slot.recv().await,
            Some(Err(TransferError::Aborted { id: 1 }))
        ));
        assert!(slot.recv().await.is_none());
    }

    #[tokio::test]
    async fn dropped_or_unknown_or_miscounted() {
        let reg = registry();
        drop(reg.expect(1, 1, 4));
        assert!(matches!(reg.claim(1, 1), Claim::Dropped));
        assert!(matches!(reg.claim(2, 1), Claim::Unknown));
        let mut slot = reg.expect(3, 5, 4);
        assert!(matches!(reg.claim(3, 4), Claim::CountMismatch));
        assert!(matches!(
            slot.recv().await,
            Some(Err(TransferError::BlockCountMismatch {
                expected: 5,
                announced: 4,
                ..
            }))
        ));
    }

    #[tokio::test]
    async fn re_announcing_supersedes_and_close_aborts() {
        let reg = registry();
        let mut old = reg.expect(1, 1, 4);
        let mut new = reg.expect(1, 1, 4);
        assert!(matches!(
            old.recv().await,
            Some(Err(TransferError::Superseded { id: 1 }))
        ));
        // Dropping the superseded slot must not forget the new announcement.
        drop(old);
        reg.close();
        assert!(matches!(
            new.recv().await,
            Some(Err(TransferError::Aborted { .. }))
        ));
        let mut late = reg.expect(2, 1, 4);
        assert!(matches!(
            late.recv().await,
            Some(Err(TransferError::Aborted { .. }))
        ));
    }

    #[test]
    fn dropped_memory_is_bounded() {
        let reg = registry();
        for id in 0..(DROPPED_MEMORY as u64 + 10) {
            drop(reg.expect(id, 1, 1));
        }
        let inner = reg.inner.lock();
        assert_eq!(inner.dropped.len(), DROPPED_MEMORY);
        assert!(inner.pending.is_empty());
    }
}

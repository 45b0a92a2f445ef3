//! The approximate prefix index: what a worker probably holds, from what this router sent it.
//!
//! The exact index follows each worker's KV events. When a worker's event stream is down, its
//! exact entries go stale (blocks it stored since are missing), so the router falls back to this
//! index for that worker: every prompt routed to it while stale is remembered for
//! [`APPROX_TTL`] (as Dynamo's approximate indexer does), and its estimated cached prefix is
//! the longer of the leading run of those blocks and its last known exact prefix. The fallback is announced once per worker in
//! a log line and counted per lookup in `dolphin_router_approx_index_lookups_total`. When the
//! stream reconnects, the worker's snapshot is exact again and its approximate entries are
//! dropped.
//!
//! Only stale workers touch this index, so the request path pays nothing while every stream is
//! live.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dolphin_cluster::{BlockHash, Role, WorkerId};
use parking_lot::Mutex;

use crate::metrics as m;

/// How long a routed prompt's blocks are assumed cached on a stale worker.
pub const APPROX_TTL: Duration = Duration::from_secs(120);
/// Most blocks remembered per worker (bounds memory while a stream stays down).
pub const MAX_BLOCKS_PER_WORKER: usize = 1 << 18;

#[derive(Debug, Default)]
struct SlotBlocks {
    /// Block hash -> when the assumption expires.
    expires: HashMap<BlockHash, Instant>,
}

/// Approximate index of one pool.
#[derive(Debug, Default)]
pub struct ApproxIndex {
    slots: Mutex<HashMap<usize, SlotBlocks>>,
}

impl ApproxIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leading `hashes` assumed cached on `slot` at `now`. The first lookup for a worker since
    /// its stream went down logs the fallback.
    pub fn count(
        &self,
        role: Role,
        slot: usize,
        worker: &WorkerId,
        hashes: &[BlockHash],
        now: Instant,
    ) -> u32 {
        metrics::counter!(m::APPROX_INDEX_LOOKUPS_TOTAL, "role" => role.as_str()).increment(1);
        let mut slots = self.slots.lock();
        let entry = slots.entry(slot).or_insert_with(|| {
            tracing::warn!(%worker, %role, ttl_secs = APPROX_TTL.as_secs(), "worker event stream is stale; estimating its cache with the approximate index (prompts routed to it)");
            SlotBlocks::default()
        });
        hashes
            .iter()
            .take_while(|h| entry.expires.get(h).is_some_and(|e| *e > now))
            .count() as u32
    }

    /// Remembers that `hashes` were routed to `slot` at `now`.
    pub fn record(&self, slot: usize, hashes: &[BlockHash], now: Instant) {
        let mut slots = self.slots.lock();
        let entry = slots.entry(slot).or_default();
        let until = now + APPROX_TTL;
        if entry.expires.len() + hashes.len() > MAX_BLOCKS_PER_WORKER {
            entry.expires.retain(|_, e| *e > now);
            if entry.expires.len() + hashes.len() > MAX_BLOCKS_PER_WORKER {
                // Still full of live assumptions: start over rather than grow without bound.
                entry.expires.clear();
            }
        }
        for h in hashes.iter().take(MAX_BLOCKS_PER_WORKER) {
            entry.expires.insert(*h, until);
        }
    }

    /// Drops what is assumed about `slot` (its stream is back, or it left).
    pub fn forget(&self, slot: usize) {
        self.slots.lock().remove(&slot);
    }

    /// Blocks currently assumed for `slot` (expired ones included until the next purge).
    pub fn len(&self, slot: usize) -> usize {
        self.slots.lock().get(&slot).map_or(0, |s| s.expires.len())
    }

    /// Whether nothing is assumed about any worker.
    pub fn is_empty(&self) -> bool {
        self.slots.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_leading_routed_blocks_until_they_expire() {
        let idx = ApproxIndex::new();
        let w = WorkerId::from("d1");
        let t0 = Instant::now();
        assert_eq!(idx.count(Role::Decode, 3, &w, &[1, 2, 3], t0), 0);
        idx.record(3, &[1, 2, 3], t0);
        assert_eq!(idx.count(Role::Decode, 3, &w, &[1, 2, 3, 4], t0), 3);
        assert_eq!(idx.count(Role::Decode, 3, &w, &[1, 9, 3], t0), 1);
        assert_eq!(idx.count(Role::Decode, 4, &w, &[1, 2], t0), 0, "other slot");
        let later = t0 + APPROX_TTL + Duration::from_millis(1);
        assert_eq!(idx.count(Role::Decode, 3, &w, &[1, 2, 3], later), 0);
        idx.forget(3);
        assert_eq!(idx.len(3), 0);
    }

    #[test]
    fn stays_bounded() {
        let idx = ApproxIndex::new();
        let t0 = Instant::now();
        let many: Vec<u64> = (0..MAX_BLOCKS_PER_WORKER as u64).collect();
        idx.record(0, &many, t0);
        idx.record(0, &[u64::MAX - 1, u64::MAX], t0);
        assert!(idx.len(0) <= MAX_BLOCKS_PER_WORKER);
        assert!(idx.len(0) >= 2);
    }
}

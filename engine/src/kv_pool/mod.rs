//! Paged KV block pool with a prefix cache.
//!
//! Every block is in exactly one of three states:
//! - **referenced** (`refs > 0`): held by one or more sequences (shared prefix blocks have
//!   several holders); it may also be cached;
//! - **evictable**: unreferenced but cached (named by its chained hash); kept in LRU order so a
//!   later prompt with the same prefix reuses it, and evicted, least recently used first, when a
//!   block is needed;
//! - **free**: unreferenced and uncached.
//!
//! Admission reserves capacity (`admit`), so later `allocate` calls of an admitted sequence
//! cannot fail and no sequence ever has to be preempted. Only full blocks are cached (`commit`),
//! whether the prompt or generated tokens filled them. Every change to the set of cached hashes
//! queues a [`KvEvent`]; the owner drains them (`drain_events`) and publishes them in order.

mod lru;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use dolphin_cluster::{BlockHash, BlockHashMap};

use crate::types::{BlockId, KvEvent};
use lru::Lru;

/// Per-block bookkeeping.
#[derive(Clone, Copy, Debug, Default)]
struct BlockMeta {
    refs: u32,
    /// Set while the block is in the prefix cache.
    hash: Option<BlockHash>,
    /// Hash of the block before it in its prompt (valid while cached).
    parent: Option<BlockHash>,
    /// Block index within its prompt (valid while cached); orders snapshots parents first.
    depth: u32,
}

/// Paged block pool with a prefix cache over chained block hashes.
#[derive(Debug)]
pub struct KvPool {
    block_size: u32,
    blocks: Vec<BlockMeta>,
    /// Unreferenced, uncached blocks (a stack: recently freed blocks are reused first).
    free: Vec<BlockId>,
    /// Unreferenced cached blocks, least recently used first.
    lru: Lru,
    cached: BlockHashMap<BlockId>,
    /// Blocks promised to admitted sequences and not allocated yet.
    reserved: u32,
    events: Vec<KvEvent>,
}

impl KvPool {
    /// A pool of `total_blocks` free blocks of `block_size` tokens.
    pub fn new(total_blocks: u32, block_size: u32) -> Self {
        Self {
            block_size,
            blocks: vec![BlockMeta::default(); total_blocks as usize],
            // Reversed so block 0 is handed out first (easier to read in logs and tests).
            free: (0..total_blocks).rev().collect(),
            lru: Lru::new(total_blocks),
            cached: HashMap::with_capacity_and_hasher(total_blocks as usize, Default::default()),
            reserved: 0,
            events: Vec::new(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Blocks a new admission can still obtain: free plus evictable, minus reservations.
    pub fn available(&self) -> u32 {
        self.unreferenced() - self.reserved
    }

    /// Blocks free or evictable, reserved or not.
    pub fn unreferenced(&self) -> u32 {
        self.free.len() as u32 + self.lru.len()
    }

    /// Blocks held by sequences (KV in use).
    pub fn referenced(&self) -> u32 {
        self.total() - self.unreferenced()
    }

    /// Blocks reserved and not yet allocated.
    pub fn reserved(&self) -> u32 {
        self.reserved
    }

    /// Blocks in the prefix cache (referenced or not).
    pub fn cached_len(&self) -> usize {
        self.cached.len()
    }

    /// Whether `hash` is cached.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.cached.contains_key(&hash)
    }

    /// Number of leading `hashes` present in the cache.
    pub fn match_prefix(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Admits a sequence if the pool can hold it: takes a reference on the cached blocks named by
    /// `hits` (all cached: a `match_prefix` result), appending them to `table`, and reserves
    /// `new_blocks` more. Returns false, changing nothing, if that does not fit.
    pub fn admit(&mut self, hits: &[BlockHash], new_blocks: u32, table: &mut Vec<BlockId>) -> bool {
        let mut revived = 0u32; // hits that leave the evictable set when referenced
        for hash in hits {
            match self.cached.get(hash) {
                Some(&b) if self.blocks[b as usize].refs == 0 => revived += 1,
                Some(_) => {}
                None => return false,
            }
        }
        if u64::from(new_blocks) + u64::from(revived) > u64::from(self.available()) {
            return false;
        }
        for hash in hits {
            let b = self.cached[hash];
            let meta = &mut self.blocks[b as usize];
            if meta.refs == 0 {
                self.lru.unlink(b);
            }
            meta.refs += 1;
            table.push(b);
        }
        self.reserved += new_blocks;
        true
    }

    /// Takes one reserved block: a free one, else the least recently used evictable one (whose
    /// hash leaves the cache). `None` only if nothing was reserved.
    pub fn allocate(&mut self) -> Option<BlockId> {
        if self.reserved == 0 {
            return None;
        }
        let block = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.lru.pop_front()?;
                self.evict(b);
                b
            }
        };
        self.reserved -= 1;
        self.blocks[block as usize].refs = 1;
        Some(block)
    }

    /// Returns `n` reserved blocks that will not be allocated.
    pub fn unreserve(&mut self, n: u32) {
        debug_assert!(
            n <= self.reserved,
            "unreserving {n} of {} blocks",
            self.reserved
        );
        self.reserved -= n.min(self.reserved);
    }

    /// Drops one reference on each block of a sequence's table. Blocks left unreferenced become
    /// evictable if cached (last block first, so a prompt's tail is evicted before its head,
    /// which other prompts are likelier to share) or free otherwise.
    pub fn release(&mut self, table: &[BlockId]) {
        for &b in table.iter().rev() {
            let meta = &mut self.blocks[b as usize];
            debug_assert!(meta.refs > 0, "releasing unreferenced block {b}");
            if meta.refs == 0 {
                continue;
            }
            meta.refs -= 1;
            if meta.refs == 0 {
                if meta.hash.is_some() {
                    self.lru.push_back(b);
                } else {
                    self.free.push(b);
                }
            }
        }
    }

    /// Puts a full, referenced block into the prefix cache under `hash` (the `depth`-th block of
    /// its prompt, after `parent`). Returns false if the block is already cached or another block
    /// already holds `hash` (computed concurrently): this block then stays private and is freed
    /// normally.
    pub fn commit(
        &mut self,
        block: BlockId,
        parent: Option<BlockHash>,
        hash: BlockHash,
        depth: u32,
    ) -> bool {
        let meta = &mut self.blocks[block as usize];
        debug_assert!(meta.refs > 0, "committing unreferenced block {block}");
        if meta.hash.is_some() || self.cached.contains_key(&hash) {
            return false;
        }
        *meta = BlockMeta {
            refs: meta.refs,
            hash: Some(hash),
            parent,
            depth,
        };
        self.cached.insert(hash, block);
        // Coalesce with the previous event when this block continues its chain.
        if let Some(KvEvent::Stored { hashes, .. }) = self.events.last_mut()
            && parent.is_some()
            && hashes.last() == parent.as_ref()
        {
            hashes.push(hash);
        } else {
            self.events.push(KvEvent::Stored {
                parent,
                hashes: vec![hash],
            });
        }
        true
    }

    /// Every cached block as `Stored` events, parents before children, chains coalesced.
    pub fn snapshot(&self) -> Vec<KvEvent> {
        let mut blocks: Vec<&BlockMeta> = self
            .cached
            .values()
            .map(|&b| &self.blocks[b as usize])
            .collect();
        blocks.sort_unstable_by_key(|m| (m.depth, m.hash));
        let mut events: Vec<KvEvent> = Vec::new();
        // Event index whose last hash is the key: a child extends it (first child only).
        let mut open: HashMap<BlockHash, usize> = HashMap::new();
        for meta in blocks {
            let Some(hash) = meta.hash else { continue };
            match meta.parent.and_then(|p| open.remove(&p)) {
                Some(i) => {
                    if let KvEvent::Stored { hashes, .. } = &mut events[i] {
                        hashes.push(hash);
                    }
                    open.insert(hash, i);
                }
                None => {
                    open.insert(hash, events.len());
                    events.push(KvEvent::Stored {
                        parent: meta.parent,
                        hashes: vec![hash],
                    });
                }
            }
        }
        events
    }

    /// Events queued since the last drain, in order.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, KvEvent> {
        self.events.drain(..)
    }

    /// Removes an evictable block's hash from the cache and queues a `Removed` event.
    fn evict(&mut self, block: BlockId) {
        let meta = &mut self.blocks[block as usize];
        let Some(hash) = meta.hash.take() else { return };
        meta.parent = None;
        self.cached.remove(&hash);
        if let Some(KvEvent::Removed { hashes }) = self.events.last_mut() {
            hashes.push(hash);
        } else {
            self.events.push(KvEvent::Removed { hashes: vec![hash] });
        }
    }

    /// Checks every invariant; panics with a description of the first broken one (tests).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut seen = vec![0u8; self.blocks.len()];
        for &b in &self.free {
            seen[b as usize] += 1;
            let m = &self.blocks[b as usize];
            assert!(m.refs == 0 && m.hash.is_none(), "free block {b} is {m:?}");
        }
        for b in self.lru.iter() {
            seen[b as usize] += 1;
            let m = &self.blocks[b as usize];
            assert!(
                m.refs == 0 && m.hash.is_some(),
                "evictable block {b} is {m:?}"
            );
        }
        for (i, m) in self.blocks.iter().enumerate() {
            let listed = seen[i];
            if m.refs > 0 {
                assert_eq!(listed, 0, "referenced block {i} is also free or evictable");
            } else {
                assert_eq!(listed, 1, "unreferenced block {i} listed {listed} times");
            }
            if let Some(h) = m.hash {
                assert_eq!(
                    self.cached.get(&h),
                    Some(&(i as BlockId)),
                    "block {i} hash not indexed"
                );
            }
        }
        for (h, &b) in &self.cached {
            assert_eq!(
                self.blocks[b as usize].hash,
                Some(*h),
                "index entry {h:x} -> {b} is stale"
            );
        }
        assert!(
            self.reserved <= self.unreferenced(),
            "reserved {} > unreferenced",
            self.reserved
        );
    }
}

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
//! cannot fail and no sequence ever has to be preempted. Only full blocks are cached
//! (`commit_many`), whether the prompt or generated tokens filled them, and a chain's cached
//! blocks are always prefix-closed (a cached block's parent is cached, and held by whoever
//! holds the block), so a lookup may stop at the first miss, or search a chain, and never step
//! over a hole. Every change to the set of cached hashes queues a [`KvEvent`]; the owner drains
//! them (`drain_events`) and publishes them in order.

mod lru;
#[cfg(test)]
mod proptests;
mod tag_map;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use dolphin_cluster::BlockHash;
use dolphin_cluster::block_map::TOUCH_AHEAD;

use crate::types::{BlockId, KvEvent};
use lru::{Linked, Lru};
use tag_map::{TagMap, tag_at};

/// Per-block bookkeeping: 32 bytes, aligned, so one cache line serves a block's every field on
/// the evict / allocate / commit path (at 40 bytes, one block in two straddled two lines, and
/// the second was never prefetched).
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(32))]
struct BlockMeta {
    /// The block's hash while it is in the prefix cache (`CACHED`).
    hash: BlockHash,
    /// Hash of the block before it in its prompt (valid while cached and `HAS_PARENT`).
    parent: BlockHash,
    refs: u32,
    /// The block's tag in the map while cached and indexed (`tag_map::tag_at`: its chain's,
    /// not its own hash's, so the eviction that removes it needs it here).
    tag: u32,
    /// Stamp of the block's latest LRU queue entry (see `lru.rs`).
    lru_stamp: u32,
    /// The flags in the low 8 bits; above them the block's index within its prompt (valid
    /// while cached), which orders snapshots parents first.
    depth_flags: u32,
}

const _: () = assert!(std::mem::size_of::<BlockMeta>() == 32);

/// The deepest depth `BlockMeta` keeps (24 bits: 268M tokens at 16 a block); deeper blocks
/// keep this one, and a snapshot may then list them before their parents.
const MAX_DEPTH: u32 = (1 << 24) - 1;

/// `BlockMeta::flags`: the block is in the prefix cache.
const CACHED: u8 = 1;
/// `BlockMeta::flags`: its prompt has a block before it (`parent` is valid).
const HAS_PARENT: u8 = 2;
/// `BlockMeta::flags`: it is in the LRU order (evictable).
const IN_LRU: u8 = 4;
/// `BlockMeta::flags`: cached, but not in the map: no lookup will ask for its hash (see
/// [`KvPool::commit_many_unindexed`]).
const UNINDEXED: u8 = 8;

impl BlockMeta {
    fn flags(&self) -> u8 {
        self.depth_flags as u8
    }

    fn depth(&self) -> u32 {
        self.depth_flags >> 8
    }

    fn set_depth(&mut self, depth: u32) {
        self.depth_flags = (depth.min(MAX_DEPTH) << 8) | u32::from(self.flags());
    }

    fn cached(&self) -> bool {
        self.flags() & CACHED != 0
    }

    /// The hash a lookup finds it by: cached and in the map.
    fn hash(&self) -> Option<BlockHash> {
        (self.flags() & (CACHED | UNINDEXED) == CACHED).then_some(self.hash)
    }

    fn parent(&self) -> Option<BlockHash> {
        (self.flags() & (CACHED | HAS_PARENT) == CACHED | HAS_PARENT).then_some(self.parent)
    }

    fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.depth_flags |= u32::from(flag);
        } else {
            self.depth_flags &= !u32::from(flag);
        }
    }
}

impl Linked for BlockMeta {
    fn linked(&self) -> bool {
        self.flags() & IN_LRU != 0
    }
    fn set_linked(&mut self, linked: bool) {
        self.set(IN_LRU, linked);
    }
    fn stamp(&self) -> u32 {
        self.lru_stamp
    }
    fn set_stamp(&mut self, stamp: u32) {
        self.lru_stamp = stamp;
    }
}

/// The lines a walk fetched last (its metadata's and the map's), so that a run of blocks
/// sharing them fetches them once.
#[derive(Default)]
struct Touched {
    block: usize,
    map: usize,
}

/// Records `line` as the `last` one fetched; whether it is another than before.
fn moved(last: &mut usize, line: usize) -> bool {
    std::mem::replace(last, line) != line
}

/// Whether a block is cached under `hash`: how the pool's map confirms a matching tag.
fn holds(blocks: &[BlockMeta], hash: BlockHash) -> impl Fn(BlockId) -> bool + '_ {
    move |b| blocks[b as usize].hash() == Some(hash)
}

/// Paged block pool with a prefix cache over chained block hashes.
///
/// Walks over many blocks (admission, allocation of a prompt's blocks, commits, release) touch
/// the lines of blocks [`TOUCH_AHEAD`] positions ahead of the one they work on, so on pools
/// larger than the CPU's caches their misses overlap (see `dolphin_cluster::block_map`).
#[derive(Debug)]
pub struct KvPool {
    block_size: u32,
    blocks: Vec<BlockMeta>,
    /// Unreferenced, uncached blocks (a stack: recently freed blocks are reused first).
    free: Vec<BlockId>,
    /// Unreferenced cached blocks, least recently used first.
    lru: Lru,
    /// Cached hash -> block (confirmed against `blocks`).
    cached: TagMap,
    /// Blocks promised to admitted sequences and not allocated yet.
    reserved: u32,
    events: Vec<KvEvent>,
    /// Whether cache changes queue events (off where nothing subscribes).
    record_events: bool,
}

impl KvPool {
    /// A pool of `total_blocks` free blocks of `block_size` tokens.
    pub fn new(total_blocks: u32, block_size: u32) -> Self {
        Self {
            block_size,
            blocks: vec![BlockMeta::default(); total_blocks as usize],
            // Reversed so block 0 is handed out first (easier to read in logs and tests).
            free: (0..total_blocks).rev().collect(),
            lru: Lru::default(),
            cached: TagMap::with_capacity(2 * total_blocks as usize),
            reserved: 0,
            events: Vec::new(),
            record_events: true,
        }
    }

    /// Stops (or restarts) queueing cache events, for an owner that never drains them: the
    /// simulator reads every pool directly where the router reads its index.
    pub fn record_events(&mut self, on: bool) {
        self.record_events = on;
        if !on {
            self.events.clear();
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

    /// Whether the last block of `chain` (a prompt's block hashes from its first) is cached.
    pub fn contains(&self, chain: &[BlockHash]) -> bool {
        chain
            .len()
            .checked_sub(1)
            .is_some_and(|d| self.lookup(chain, d).is_some())
    }

    /// The block cached under `chain[depth]` (`chain`: a prompt's block hashes from its first).
    #[inline]
    fn lookup(&self, chain: &[BlockHash], depth: usize) -> Option<BlockId> {
        let hash = chain[depth];
        self.cached
            .get(tag_at(chain, depth), holds(&self.blocks, hash))
    }

    /// Prefetches the cache's home lines of the first and the last block of `chain` (a
    /// prompt's block hashes from its first): the probes [`match_prefix`](Self::match_prefix)
    /// starts with, so a caller about to ask many pools overlaps their misses.
    pub fn touch_ends(&self, chain: &[BlockHash]) {
        if let Some(last) = chain.len().checked_sub(1) {
            self.cached.touch_home(tag_at(chain, 0));
            self.cached.touch_home(tag_at(chain, last));
        }
    }

    /// Number of leading `hashes` (a prompt's block hashes from its first) present in the
    /// cache. A chain's cached blocks are prefix-closed, so this is a binary search: the first
    /// block (a prompt nobody shares misses at once), the last (a prompt cached whole), then
    /// halves, each probe's two possible successors fetched ahead so their misses overlap it:
    /// about log2(n) probes instead of n.
    pub fn match_prefix(&self, hashes: &[BlockHash]) -> usize {
        let n = hashes.len();
        if n == 0 || self.lookup(hashes, 0).is_none() {
            return 0;
        }
        if self.lookup(hashes, n - 1).is_some() {
            return n;
        }
        // `hashes[lo]` is cached and `hashes[hi]` is not.
        let (mut lo, mut hi) = (0, n - 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            for next in [lo + (mid - lo) / 2, mid + (hi - mid) / 2] {
                self.cached.touch_home(tag_at(hashes, next));
            }
            if self.lookup(hashes, mid).is_some() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo + 1
    }

    /// Walks the blocks of `chain` (a prompt's block hashes from its first) cached from depth
    /// `from` on, handing each one's block to `hit`; returns how many. The first probe alone
    /// decides most walks (a prompt nobody shares misses at once), so the lines ahead are
    /// fetched only once it hits. A chain's run of 8 blocks shares a home line
    /// (`tag_map::tag_at`), so that line and the next (where the run spills when other
    /// entries took its slots) are fetched once per run, `TOUCH_AHEAD` blocks ahead.
    fn walk_cached(&self, chain: &[BlockHash], from: usize, mut hit: impl FnMut(BlockId)) -> usize {
        if from >= chain.len() {
            return 0;
        }
        let Some(b) = self.lookup(chain, from) else {
            return 0;
        };
        hit(b);
        for d in from + 1..(from + 1 + TOUCH_AHEAD).min(chain.len()) {
            self.touch_run(chain, d, from + 1);
        }
        for d in from + 1..chain.len() {
            self.touch_run(chain, d + TOUCH_AHEAD, from + 1);
            let Some(b) = self.lookup(chain, d) else {
                return d - from;
            };
            hit(b);
        }
        chain.len() - from
    }

    /// The blocks that hold the longest cached prefix of `hashes`, into `out` (cleared first);
    /// returns how many. `known` may name blocks that held the first hashes before (an earlier
    /// answer for a prompt with the same start): each is checked by its own metadata, which
    /// sits in a few neighbouring lines where the blocks were allocated together, and the cache
    /// is probed only from the first that no longer holds its hash. The answer is exactly
    /// [`match_prefix`](Self::match_prefix)'s, whatever `known` holds.
    pub fn cached_blocks(
        &self,
        hashes: &[BlockHash],
        known: &[BlockId],
        out: &mut Vec<BlockId>,
    ) -> usize {
        out.clear();
        let known = &known[..known.len().min(hashes.len())];
        let touch = |b: BlockId| {
            if let Some(meta) = self.blocks.get(b as usize) {
                dolphin_cluster::prefetch::prefetch(meta);
            }
        };
        for &b in known.iter().take(TOUCH_AHEAD) {
            touch(b);
        }
        for (i, (&b, &h)) in known.iter().zip(hashes).enumerate() {
            if let Some(&ahead) = known.get(i + TOUCH_AHEAD) {
                touch(ahead);
            }
            let meta = self.blocks.get(b as usize);
            if meta.and_then(BlockMeta::hash) != Some(h) {
                break;
            }
            out.push(b);
        }
        let checked = out.len();
        checked + self.walk_cached(hashes, checked, |b| out.push(b))
    }

    /// Admits a sequence if the pool can hold it: takes a reference on the cached blocks named by
    /// `hits` (all cached: a `match_prefix` result), appending them to `table`, and reserves
    /// `new_blocks` more. Returns false, changing nothing, if that does not fit.
    pub fn admit(&mut self, hits: &[BlockHash], new_blocks: u32, table: &mut Vec<BlockId>) -> bool {
        let start = table.len();
        if self.walk_cached(hits, 0, |b| table.push(b)) < hits.len() {
            table.truncate(start);
            return false;
        }
        self.admit_held(start, new_blocks, table)
    }

    /// [`admit`](Self::admit) for hits already resolved to their blocks (a
    /// [`cached_blocks`](Self::cached_blocks) answer, with nothing changed in the pool since).
    pub fn admit_blocks(
        &mut self,
        hits: &[BlockId],
        new_blocks: u32,
        table: &mut Vec<BlockId>,
    ) -> bool {
        debug_assert!(
            hits.iter().all(|&b| self.blocks[b as usize].cached()),
            "admitting an uncached hit"
        );
        let start = table.len();
        table.extend_from_slice(hits);
        self.admit_held(start, new_blocks, table)
    }

    /// Takes a reference on `table[start..]` (cached blocks) and reserves `new_blocks`, if the
    /// pool can hold both; false, with `table` cut back to `start` and nothing else changed, if
    /// not.
    fn admit_held(&mut self, start: usize, new_blocks: u32, table: &mut Vec<BlockId>) -> bool {
        let hits = &table[start..];
        for &b in hits.iter().take(TOUCH_AHEAD) {
            self.touch_block(b);
        }
        let mut revived = 0u32; // hits that leave the evictable set when referenced
        for (i, &b) in hits.iter().enumerate() {
            if let Some(&ahead) = hits.get(i + TOUCH_AHEAD) {
                self.touch_block(ahead);
            }
            revived += u32::from(self.blocks[b as usize].refs == 0);
        }
        if u64::from(new_blocks) + u64::from(revived) > u64::from(self.available()) {
            table.truncate(start);
            return false;
        }
        for &b in hits {
            self.hold(b);
        }
        self.reserved += new_blocks;
        true
    }

    /// Extends an admitted sequence's prefix hit, before it holds a block of its own: takes a
    /// reference on the blocks of `chain` (the prompt's block hashes from its first) now cached
    /// from depth `from` on (they continue the hits already in `table`, which hold
    /// `chain[..from]`), appends them to `table` and returns that many blocks of its
    /// reservation. Returns how many blocks it took; 0, changing nothing, when none is cached
    /// or reviving the evictable ones does not fit.
    pub fn extend_hit(
        &mut self,
        chain: &[BlockHash],
        from: usize,
        table: &mut Vec<BlockId>,
    ) -> u32 {
        let start = table.len();
        let found = self.walk_cached(chain, from, |b| table.push(b));
        if found == 0 {
            return 0;
        }
        let n = found as u32;
        self.unreserve(n);
        if !self.admit_held(start, 0, table) {
            let restored = self.admit(&[], n, table);
            debug_assert!(restored, "a reservation just given back fits again");
            return 0;
        }
        n
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
                let b = self.lru.pop_front(&mut self.blocks)?;
                self.evict(b);
                b
            }
        };
        self.reserved -= 1;
        self.blocks[block as usize].refs = 1;
        Some(block)
    }

    /// Takes `n` reserved blocks at once, appending them to `table` (as `n` calls of
    /// [`allocate`](Self::allocate) would, in the same order), with the evicted blocks' lines
    /// fetched ahead. Returns how many it took: fewer than `n` only if fewer were reserved.
    pub fn allocate_many(&mut self, n: u32, table: &mut Vec<BlockId>) -> u32 {
        let n = n.min(self.reserved);
        // Prefetch what the evictions to come will touch (the block's line and its hash's cache
        // slot): the first ones now, then one TOUCH_AHEAD places ahead per block taken, also
        // past `n` (the queue's front is the next eviction, whoever asks next).
        let evicting = self.free.len() < n as usize;
        let mut last = Touched::default();
        if evicting {
            for ahead in 0..(n as usize).min(TOUCH_AHEAD) {
                self.touch_eviction(ahead, &mut last);
            }
        }
        for taken in 0..n {
            if evicting {
                self.touch_eviction(TOUCH_AHEAD, &mut last);
            }
            let Some(b) = self.allocate() else {
                return taken;
            };
            table.push(b);
        }
        n
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
        let n = table.len();
        for &b in table.iter().rev().take(TOUCH_AHEAD) {
            self.touch_block(b);
        }
        for i in (0..n).rev() {
            if let Some(ahead) = i.checked_sub(TOUCH_AHEAD) {
                self.touch_block(table[ahead]);
            }
            let b = table[i];
            let meta = &mut self.blocks[b as usize];
            debug_assert!(meta.refs > 0, "releasing unreferenced block {b}");
            if meta.refs == 0 {
                continue;
            }
            meta.refs -= 1;
            if meta.refs == 0 {
                if meta.cached() {
                    // The map slot its eviction will touch: none for an unindexed block.
                    let slot_hint = meta.hash().map(|_| meta.tag);
                    self.lru.push_back(&mut self.blocks, b, slot_hint);
                } else {
                    self.free.push(b);
                }
            }
        }
    }

    /// Commits `table[depth]` under `chain[depth]` (see [`commit_many`](Self::commit_many));
    /// whether it was newly cached.
    fn commit_at(
        &mut self,
        table: &mut [BlockId],
        chain: &[BlockHash],
        depth: usize,
        displaced: &mut Vec<BlockId>,
    ) -> bool {
        let block = table[depth];
        let meta = &self.blocks[block as usize];
        debug_assert!(meta.refs > 0, "committing unreferenced block {block}");
        if meta.cached() {
            return false;
        }
        if let Some(parent) = depth.checked_sub(1)
            && self.blocks[table[parent] as usize].hash().is_none()
        {
            // After a private block: cached, it could outlive the parent no one holds for it.
            return false;
        }
        let (hash, tag) = (chain[depth], tag_at(chain, depth));
        let Some(copy) = self
            .cached
            .insert_or_get(tag, block, holds(&self.blocks, hash))
        else {
            self.blocks[block as usize].tag = tag;
            self.name(block, chain, depth, CACHED);
            return true;
        };
        // Computed concurrently: hold the cached copy instead, unless reviving it (taking it
        // out of the evictable set while this block waits for release) does not fit.
        if self.blocks[copy as usize].refs == 0 && self.available() == 0 {
            return false;
        }
        self.hold(copy);
        table[depth] = copy;
        displaced.push(block);
        false
    }

    /// Takes a reference on cached block `b`, reviving it (out of the evictable set) if it had
    /// none.
    fn hold(&mut self, b: BlockId) {
        let meta = &mut self.blocks[b as usize];
        if meta.refs == 0 {
            self.lru.unlink(meta);
        }
        meta.refs += 1;
    }

    /// Names `block` `chain[depth]` in its metadata (`flags`: `CACHED`, and `UNINDEXED` when
    /// the map does not hold it) and queues its `Stored` event.
    fn name(&mut self, block: BlockId, chain: &[BlockHash], depth: usize, flags: u8) {
        let hash = chain[depth];
        let parent = depth.checked_sub(1).map(|p| chain[p]);
        let meta = &mut self.blocks[block as usize];
        meta.hash = hash;
        meta.parent = parent.unwrap_or_default();
        meta.set_depth(depth as u32);
        meta.set(flags, true);
        meta.set(HAS_PARENT, parent.is_some());
        if !self.record_events {
            return;
        }
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
    }

    /// Puts a sequence's newly full blocks into the prefix cache: `table[i]` under `chain[i]`
    /// for `i` in `from..chain.len()` (`chain`: the prompt's block hashes from its first
    /// through the last block committed; `table`: the sequence's blocks, `table[..from]`
    /// committed before). Returns how many were newly cached. Every chain's cached blocks stay
    /// prefix-closed, and each is held by whoever holds its children, so no eviction opens a
    /// hole a lookup could step over:
    /// - a block whose hash another block holds already (the prompt computed concurrently) is
    ///   replaced in `table` by that block, which the sequence now references (one copy, as
    ///   SGLang's radix cache keeps), and the replaced block goes to `displaced`, for the
    ///   caller to [`release`](Self::release) once no running step writes it;
    /// - a block after a private one stays private (freed normally): the copy was evictable
    ///   and reviving it did not fit, or its predecessor left the cache
    ///   ([`forget`](Self::forget)).
    ///
    /// The cache's lines are fetched ahead.
    pub fn commit_many(
        &mut self,
        table: &mut [BlockId],
        chain: &[BlockHash],
        from: usize,
        displaced: &mut Vec<BlockId>,
    ) -> usize {
        debug_assert!(table.len() >= chain.len());
        let mut committed = 0;
        let touch = |pool: &Self, table: &[BlockId], d: usize| {
            if d < chain.len() {
                pool.touch_block(table[d]);
                pool.touch_run(chain, d, from);
            }
        };
        for d in from..(from + TOUCH_AHEAD).min(chain.len()) {
            touch(self, table, d);
        }
        for d in from..chain.len() {
            touch(self, table, d + TOUCH_AHEAD);
            committed += usize::from(self.commit_at(table, chain, d, displaced));
        }
        committed
    }

    /// [`commit_many`](Self::commit_many) for blocks whose hashes no lookup of this pool will
    /// ever ask for: a simulator that knows the whole workload knows which prompt blocks no
    /// other request shares. They are cached as far as the pool's capacity and LRU order go
    /// (evictable once released, evicted in turn, with the same events) but not entered in
    /// the map, whose random lines are what commits and evictions wait for; a lookup of such
    /// a hash misses, as it would in a pool whose requests never repeat it. `table[i]` goes
    /// under `chain[i]` for `i` in `from..chain.len()`; those blocks must be referenced and
    /// not cached. After a private block they stay private, as `commit_many` leaves them, so
    /// the pool holds what it would hold had they been indexed. The engine never calls this.
    pub fn commit_many_unindexed(&mut self, table: &[BlockId], chain: &[BlockHash], from: usize) {
        debug_assert!(table.len() >= chain.len());
        if let Some(parent) = from.checked_sub(1)
            && !self.blocks[table[parent] as usize].cached()
        {
            return;
        }
        for (i, &b) in table[..chain.len()].iter().enumerate().skip(from) {
            let meta = &self.blocks[b as usize];
            debug_assert!(meta.refs > 0 && !meta.cached(), "block {b} is {meta:?}");
            if meta.cached() {
                continue;
            }
            self.name(b, chain, i, CACHED | UNINDEXED);
        }
    }

    /// Takes `block` out of the prefix cache: its KV is not what its hash says (the step that
    /// was to compute it failed). Its holders keep it; it is freed when the last lets go (at
    /// once if none holds it). Nothing happens to a block that is not cached.
    pub fn forget(&mut self, block: BlockId) {
        let meta = &mut self.blocks[block as usize];
        if !meta.cached() {
            return;
        }
        let unreferenced = meta.refs == 0;
        if unreferenced {
            self.lru.unlink(meta);
        }
        self.evict(block);
        if unreferenced {
            self.free.push(block);
        }
    }

    /// Every cached block as `Stored` events, parents before children, chains coalesced.
    pub fn snapshot(&self) -> Vec<KvEvent> {
        let mut blocks: Vec<&BlockMeta> = self
            .cached
            .blocks()
            .map(|b| &self.blocks[b as usize])
            .collect();
        blocks.sort_unstable_by_key(|m| (m.depth(), m.hash));
        let mut events: Vec<KvEvent> = Vec::new();
        // Event index whose last hash is the key: a child extends it (first child only).
        let mut open: HashMap<BlockHash, usize> = HashMap::new();
        for meta in blocks {
            let Some(hash) = meta.hash() else { continue };
            match meta.parent().and_then(|p| open.remove(&p)) {
                Some(i) => {
                    if let KvEvent::Stored { hashes, .. } = &mut events[i] {
                        hashes.push(hash);
                    }
                    open.insert(hash, i);
                }
                None => {
                    open.insert(hash, events.len());
                    events.push(KvEvent::Stored {
                        parent: meta.parent(),
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

    /// Prefetches what evicting the LRU queue's entry `ahead` places behind its front will
    /// touch: the block's line and, for a block in the map, its tag's lines. Evictions come in
    /// runs (a released sequence's blocks, tail first), whose metadata and map slots share
    /// lines: a line `last` fetched is not fetched again.
    fn touch_eviction(&self, ahead: usize, last: &mut Touched) {
        if let Some((b, tag)) = self.lru.front_ahead(ahead) {
            let meta = &self.blocks[b as usize];
            if moved(&mut last.block, dolphin_cluster::prefetch::line_of(meta)) {
                dolphin_cluster::prefetch::prefetch(meta);
            }
            if let Some(tag) = tag
                && moved(&mut last.map, self.cached.home_line(tag))
            {
                self.cached.touch(tag);
            }
        }
    }

    /// Prefetches the map lines of `chain[depth]`'s run if `depth` starts a run or is `first`,
    /// the first block a walk fetches ahead (whose run may have begun before it): a chain's
    /// run of 8 blocks shares a home line (`tag_map::tag_at`), so that line and the next
    /// (where the run spills when other entries took its slots) are fetched once per run.
    #[inline]
    fn touch_run(&self, chain: &[BlockHash], depth: usize, first: usize) {
        if depth < chain.len() && (depth.is_multiple_of(tag_map::RUN) || depth == first) {
            self.cached.touch(tag_at(chain, depth));
        }
    }

    /// Prefetches block `b`'s metadata.
    fn touch_block(&self, b: BlockId) {
        dolphin_cluster::prefetch::prefetch(&self.blocks[b as usize]);
    }

    /// Removes an evictable block's hash from the cache and queues a `Removed` event.
    fn evict(&mut self, block: BlockId) {
        let meta = &mut self.blocks[block as usize];
        if !meta.cached() {
            return;
        }
        let indexed = meta.flags() & UNINDEXED == 0;
        meta.set(CACHED | HAS_PARENT | UNINDEXED, false);
        let hash = meta.hash;
        if indexed {
            let removed = self.cached.remove(meta.tag, block);
            debug_assert!(removed, "cached block {block} missing from the map");
        }
        if !self.record_events {
            return;
        }
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
            assert!(m.refs == 0 && !m.cached(), "free block {b} is {m:?}");
        }
        for b in self.lru.iter(&self.blocks) {
            seen[b as usize] += 1;
            let m = &self.blocks[b as usize];
            assert!(m.refs == 0 && m.cached(), "evictable block {b} is {m:?}");
        }
        for (i, m) in self.blocks.iter().enumerate() {
            let listed = seen[i];
            if m.refs > 0 {
                assert_eq!(listed, 0, "referenced block {i} is also free or evictable");
            } else {
                assert_eq!(listed, 1, "unreferenced block {i} listed {listed} times");
            }
            if let Some(h) = m.hash() {
                assert_eq!(
                    self.cached.get(m.tag, holds(&self.blocks, h)),
                    Some(i as BlockId),
                    "block {i} hash not indexed"
                );
            }
        }
        for b in self.cached.blocks() {
            let h = self.blocks[b as usize].hash();
            assert!(h.is_some(), "map entry -> {b} is stale");
        }
        let named = self.blocks.iter().filter(|m| m.hash().is_some()).count();
        let indexed: std::collections::HashSet<BlockHash> =
            self.blocks.iter().filter_map(BlockMeta::hash).collect();
        for (i, m) in self.blocks.iter().enumerate() {
            if m.hash().is_some()
                && let Some(p) = m.parent()
            {
                assert!(
                    indexed.contains(&p),
                    "block {i}'s parent {p:x} is not cached"
                );
            }
        }
        assert_eq!(
            self.cached.len(),
            named,
            "map entries against cached blocks"
        );
        assert!(
            self.reserved <= self.unreferenced(),
            "reserved {} > unreferenced",
            self.reserved
        );
    }
}

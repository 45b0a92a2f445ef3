//! Prefix index of one worker pool: which worker holds which cached KV block.
//!
//! Fed by every worker's `Worker.Subscribe` events (blocks stored, removed, cleared). A lookup
//! answers, for every worker of the pool at once, how many leading blocks of a prompt it holds, in
//! one pass over the prompt's chained block hashes: each hash maps to the set of worker slots that
//! hold it, and the set of workers still matching narrows block by block.

use std::collections::HashMap;

use dolphin_cluster::BlockHash;

/// Most workers one pool's index tracks (the width of [`SlotSet`]).
pub const MAX_POOL_WORKERS: usize = 256;
const WORDS: usize = MAX_POOL_WORKERS / 64;
/// Hashes probed together in a lookup (see [`PrefixIndex::lookup`]).
const LOOKAHEAD: usize = 16;

/// A set of worker slots, as a fixed bitset (no allocation, cheap to AND).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotSet([u64; WORDS]);

impl SlotSet {
    /// The empty set.
    pub const EMPTY: SlotSet = SlotSet([0; WORDS]);

    /// Adds `slot` (must be below [`MAX_POOL_WORKERS`]).
    pub fn insert(&mut self, slot: usize) {
        self.0[slot / 64] |= 1 << (slot % 64);
    }

    /// Removes `slot`.
    pub fn remove(&mut self, slot: usize) {
        self.0[slot / 64] &= !(1 << (slot % 64));
    }

    /// Whether `slot` is in the set.
    pub fn contains(&self, slot: usize) -> bool {
        slot < MAX_POOL_WORKERS && self.0[slot / 64] & (1 << (slot % 64)) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    fn and(&self, other: &SlotSet) -> SlotSet {
        let mut out = *self;
        for (o, w) in out.0.iter_mut().zip(other.0.iter()) {
            *o &= *w;
        }
        out
    }

    fn and_not(&self, other: &SlotSet) -> SlotSet {
        let mut out = *self;
        for (o, w) in out.0.iter_mut().zip(other.0.iter()) {
            *o &= !*w;
        }
        out
    }

    /// The slots in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(i * 64 + bit)
            })
        })
    }
}

type IdentityBuild = dolphin_cluster::BlockHashBuild;

/// The prefix index of one pool.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    /// Block hash -> slots holding it.
    blocks: HashMap<BlockHash, SlotSet, IdentityBuild>,
    /// Per slot, how many hashes it holds. Membership itself is the slot's bit in `blocks`: one
    /// map operation per stored or removed block instead of two (a second per-slot set made the
    /// simulator's cache bookkeeping twice as slow), at the price of a scan over `blocks` in
    /// [`clear_slot`](Self::clear_slot), which runs only when a worker leaves or resubscribes.
    held: Vec<usize>,
    /// Slots in use.
    registered: SlotSet,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a free slot for a new worker; `None` when the pool already has
    /// [`MAX_POOL_WORKERS`] workers.
    pub fn allocate_slot(&mut self) -> Option<usize> {
        let slot = (0..MAX_POOL_WORKERS).find(|s| !self.registered.contains(*s))?;
        self.registered.insert(slot);
        if self.held.len() <= slot {
            self.held.resize(slot + 1, 0);
        }
        Some(slot)
    }

    /// Forgets a worker: drops its blocks and frees its slot.
    pub fn release_slot(&mut self, slot: usize) {
        self.clear_slot(slot);
        self.registered.remove(slot);
    }

    /// Number of slot positions a lookup writes (highest slot ever used + 1).
    pub fn slot_capacity(&self) -> usize {
        self.held.len()
    }

    /// Records that `slot` stored `hashes`.
    pub fn stored(&mut self, slot: usize, hashes: &[BlockHash]) {
        if !self.registered.contains(slot) {
            return;
        }
        let held = &mut self.held[slot];
        for &h in hashes {
            let set = self.blocks.entry(h).or_default();
            if !set.contains(slot) {
                set.insert(slot);
                *held += 1;
            }
        }
    }

    /// Records that `slot` evicted `hashes`.
    pub fn removed(&mut self, slot: usize, hashes: &[BlockHash]) {
        let Some(held) = self.held.get_mut(slot) else {
            return;
        };
        for h in hashes {
            if let Some(set) = self.blocks.get_mut(h)
                && set.contains(slot)
            {
                set.remove(slot);
                *held -= 1;
                if set.is_empty() {
                    self.blocks.remove(h);
                }
            }
        }
    }

    /// Drops every block of `slot` (the worker cleared its cache, or its event stream restarts
    /// with a fresh snapshot).
    pub fn clear_slot(&mut self, slot: usize) {
        let Some(held) = self.held.get_mut(slot) else {
            return;
        };
        if *held == 0 {
            return;
        }
        *held = 0;
        self.blocks.retain(|_, set| {
            set.remove(slot);
            !set.is_empty()
        });
    }

    /// Blocks the index holds for `slot`.
    pub fn held_blocks(&self, slot: usize) -> usize {
        self.held.get(slot).copied().unwrap_or(0)
    }

    /// Distinct blocks in the index.
    pub fn distinct_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// For every slot, the number of leading `hashes` it holds, written to `out[slot]`
    /// (`out` is resized to [`slot_capacity`](Self::slot_capacity); free slots get 0).
    /// One pass over `hashes`, stopping as soon as no worker matches.
    pub fn lookup(&self, hashes: &[BlockHash], out: &mut Vec<u32>) {
        out.clear();
        out.resize(self.held.len(), 0);
        let mut live = self.registered;
        // Probe a few hashes before using any result: the probes are independent, so the cache
        // misses of a large index overlap instead of being paid one after another. At most
        // LOOKAHEAD - 1 probes are wasted past the point where no worker matches.
        for (c, chunk) in hashes.chunks(LOOKAHEAD).enumerate() {
            let mut sets = [None; LOOKAHEAD];
            for (set, h) in sets.iter_mut().zip(chunk) {
                *set = self.blocks.get(h);
            }
            for (j, set) in sets[..chunk.len()].iter().enumerate() {
                let next = match set {
                    Some(set) => live.and(set),
                    None => SlotSet::EMPTY,
                };
                if next == live {
                    continue;
                }
                // Each slot drops out once, so this inner loop runs at most once per worker.
                for slot in live.and_not(&next).iter() {
                    out[slot] = (c * LOOKAHEAD + j) as u32;
                }
                live = next;
                if live.is_empty() {
                    return;
                }
            }
        }
        for slot in live.iter() {
            out[slot] = hashes.len() as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slot_set_basics() {
        let mut s = SlotSet::EMPTY;
        assert!(s.is_empty());
        for slot in [0, 63, 64, 200, 255] {
            s.insert(slot);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 64, 200, 255]);
        s.remove(64);
        assert!(!s.contains(64));
        assert!(s.contains(200));
        assert!(!s.contains(1000));
    }

    #[test]
    fn lookup_counts_leading_blocks_per_worker() {
        let mut idx = PrefixIndex::new();
        let a = idx.allocate_slot().expect("slot");
        let b = idx.allocate_slot().expect("slot");
        let c = idx.allocate_slot().expect("slot");
        idx.stored(a, &[1, 2, 3]);
        idx.stored(b, &[1, 2]);
        idx.stored(c, &[2, 3]); // no first block: holds no leading prefix
        let mut out = Vec::new();
        idx.lookup(&[1, 2, 3, 4], &mut out);
        assert_eq!(out, vec![3, 2, 0]);
        idx.lookup(&[9], &mut out);
        assert_eq!(out, vec![0, 0, 0]);
        idx.lookup(&[], &mut out);
        assert_eq!(out, vec![0, 0, 0]);
    }

    #[test]
    fn a_gap_ends_the_prefix() {
        let mut idx = PrefixIndex::new();
        let a = idx.allocate_slot().expect("slot");
        idx.stored(a, &[1, 2, 3]);
        idx.removed(a, &[2]);
        let mut out = Vec::new();
        idx.lookup(&[1, 2, 3], &mut out);
        assert_eq!(out, vec![1]);
        assert_eq!(idx.held_blocks(a), 2);
    }

    #[test]
    fn release_frees_entries_and_slot_reuse_starts_empty() {
        let mut idx = PrefixIndex::new();
        let a = idx.allocate_slot().expect("slot");
        idx.stored(a, &[1, 2]);
        idx.release_slot(a);
        assert_eq!(idx.distinct_blocks(), 0);
        let again = idx.allocate_slot().expect("slot");
        assert_eq!(again, a);
        let mut out = Vec::new();
        idx.lookup(&[1, 2], &mut out);
        assert_eq!(out, vec![0]);
        // Events for a released slot are ignored.
        idx.release_slot(again);
        idx.stored(again, &[1]);
        assert_eq!(idx.distinct_blocks(), 0);
    }

    #[test]
    fn pool_is_bounded() {
        let mut idx = PrefixIndex::new();
        for _ in 0..MAX_POOL_WORKERS {
            assert!(idx.allocate_slot().is_some());
        }
        assert!(idx.allocate_slot().is_none());
        idx.release_slot(17);
        assert_eq!(idx.allocate_slot(), Some(17));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Store(usize, Vec<u64>),
        Remove(usize, Vec<u64>),
        Clear(usize),
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let hashes = proptest::collection::vec(0u64..24, 0..8);
        prop_oneof![
            4 => (0usize..6, hashes.clone()).prop_map(|(s, h)| Op::Store(s, h)),
            2 => (0usize..6, hashes).prop_map(|(s, h)| Op::Remove(s, h)),
            1 => (0usize..6).prop_map(Op::Clear),
            1 => (0usize..6).prop_map(Op::Release),
        ]
    }

    proptest! {
        #[test]
        fn matches_brute_force(
            ops in proptest::collection::vec(op(), 0..60),
            queries in proptest::collection::vec(proptest::collection::vec(0u64..24, 0..10), 1..8),
        ) {
            let mut idx = PrefixIndex::new();
            for _ in 0..6 {
                idx.allocate_slot();
            }
            // The model: per slot, a plain set of hashes, or None once released.
            let mut model: Vec<Option<std::collections::HashSet<u64>>> = vec![Some(Default::default()); 6];
            for op in &ops {
                match op {
                    Op::Store(s, h) => {
                        idx.stored(*s, h);
                        if let Some(set) = &mut model[*s] { set.extend(h.iter().copied()); }
                    }
                    Op::Remove(s, h) => {
                        idx.removed(*s, h);
                        if let Some(set) = &mut model[*s] { for x in h { set.remove(x); } }
                    }
                    Op::Clear(s) => {
                        idx.clear_slot(*s);
                        if let Some(set) = &mut model[*s] { set.clear(); }
                    }
                    Op::Release(s) => {
                        idx.release_slot(*s);
                        model[*s] = None;
                    }
                }
            }
            let mut out = Vec::new();
            for q in &queries {
                idx.lookup(q, &mut out);
                for (slot, m) in model.iter().enumerate() {
                    let expect = m.as_ref().map_or(0, |set| q.iter().take_while(|h| set.contains(h)).count() as u32);
                    prop_assert_eq!(out[slot], expect, "slot {} query {:?}", slot, q);
                    prop_assert_eq!(idx.held_blocks(slot), m.as_ref().map_or(0, |s| s.len()));
                }
            }
        }
    }
}

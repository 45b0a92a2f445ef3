//! The pool's prefix-cache map, block hash -> block, in 8-byte slots.
//!
//! A slot holds 32 bits of the hash (its tag) and the block. The full hash is not stored: the
//! pool keeps it in the block's metadata, so a tag that matches is confirmed there (`get`'s
//! `holds`), and the block is what a removal names. Against [`BlockMap`]'s 16-byte slots
//! the map takes half the memory, a cache line holds 8 slots instead of 4, and a probe or a
//! removal's shift leaves its home line half as often. Callers already read the block's
//! metadata on every path that finds a block (to take a reference, or to evict it), so the
//! confirmation costs a line only on lookups that do nothing else with the block.
//!
//! The home slot is computed from the tag alone, so entries can be moved (backward-shift
//! deletion, growth) without their hashes. Open addressing, linear probing, at most half full;
//! a slot of 0 is empty (blocks are stored plus one).
//!
//! [`BlockMap`]: dolphin_cluster::BlockMap

use dolphin_cluster::BlockHash;
use dolphin_cluster::block_map::backward_shift;
use dolphin_cluster::prefetch::prefetch;

use crate::types::BlockId;

const EMPTY: u64 = 0;
/// The smallest table (slots).
const MIN_SLOTS: usize = 16;
/// Slots of a 64-byte cache line.
const SLOTS_PER_LINE: usize = 8;
/// Fibonacci hashing's 32-bit multiplier.
const SPREAD: u32 = 0x9e37_79b9;

/// The 32 bits of `hash` a slot keeps.
#[inline]
fn tag(hash: BlockHash) -> u32 {
    (hash >> 32) as u32
}

/// The home slot of `tag` in a table of `2^(32 - shift)` slots. A shift by 32 (a one-slot
/// table) cannot happen: tables have at least `MIN_SLOTS`.
#[inline]
fn home_of_tag(tag: u32, shift: u32) -> usize {
    (tag.wrapping_mul(SPREAD) >> shift) as usize
}

#[inline]
fn slot(hash: BlockHash, block: BlockId) -> u64 {
    (u64::from(tag(hash)) << 32) | (u64::from(block) + 1)
}

#[inline]
fn slot_tag(slot: u64) -> u32 {
    (slot >> 32) as u32
}

#[inline]
fn slot_block(slot: u64) -> BlockId {
    (slot as u32).wrapping_sub(1)
}

/// Block hash -> block, confirmed against the blocks' own hashes.
#[derive(Debug)]
pub(super) struct TagMap {
    slots: Box<[u64]>,
    /// `32 - log2(slots.len())`: the home slot is the top bits of `tag * SPREAD`.
    shift: u32,
    len: usize,
}

impl TagMap {
    /// An empty map that holds `capacity` entries without growing.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        let n = capacity
            .saturating_mul(2)
            .max(MIN_SLOTS)
            .checked_next_power_of_two()
            .expect("tag map capacity overflows usize");
        // The home slot is at most 32 bits of the tag.
        assert!(
            n.trailing_zeros() <= 32,
            "a tag map holds at most 2^31 blocks"
        );
        Self {
            slots: vec![EMPTY; n].into_boxed_slice(),
            shift: 32 - n.trailing_zeros(),
            len: 0,
        }
    }

    /// Entries in the map.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn home_of_tag(&self, tag: u32) -> usize {
        home_of_tag(tag, self.shift)
    }

    #[inline]
    fn home(&self, hash: BlockHash) -> usize {
        self.home_of_tag(tag(hash))
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Prefetches `hash`'s home line and the next one (a removal's shift reads on to the next
    /// empty slot).
    #[inline]
    pub(super) fn touch(&self, hash: BlockHash) {
        let home = self.home(hash);
        prefetch(&self.slots[home]);
        prefetch(&self.slots[(home + SLOTS_PER_LINE) & self.mask()]);
    }

    /// Prefetches `hash`'s home line only (lookups and insertions rarely leave it).
    #[inline]
    pub(super) fn touch_home(&self, hash: BlockHash) {
        prefetch(&self.slots[self.home(hash)]);
    }

    /// The block of `hash`: the first block on its probe sequence whose tag matches and that
    /// `holds(block)` confirms (the block is cached under `hash`).
    #[inline]
    pub(super) fn get(&self, hash: BlockHash, holds: impl Fn(BlockId) -> bool) -> Option<BlockId> {
        let (mask, t) = (self.mask(), tag(hash));
        let mut i = self.home_of_tag(t);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if slot_tag(s) == t && holds(slot_block(s)) {
                return Some(slot_block(s));
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds `hash` -> `block` unless `hash` is already there (a block with its tag that
    /// `holds` confirms, as in [`get`](Self::get)): one probe for both. Returns whether it added.
    #[inline]
    pub(super) fn insert_if_absent(
        &mut self,
        hash: BlockHash,
        block: BlockId,
        holds: impl Fn(BlockId) -> bool,
    ) -> bool {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let (mask, t) = (self.mask(), tag(hash));
        let mut i = self.home_of_tag(t);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                break;
            }
            if slot_tag(s) == t && holds(slot_block(s)) {
                return false;
            }
            i = (i + 1) & mask;
        }
        self.slots[i] = slot(hash, block);
        self.len += 1;
        true
    }

    fn place(&mut self, s: u64) {
        let mask = self.mask();
        let mut i = self.home_of_tag(slot_tag(s));
        while self.slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = s;
    }

    /// Removes `hash` -> `block`; false if it is not there.
    #[inline]
    pub(super) fn remove(&mut self, hash: BlockHash, block: BlockId) -> bool {
        let (mask, want) = (self.mask(), slot(hash, block));
        let mut i = self.home(hash);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return false;
            }
            if s == want {
                self.remove_at(i);
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    /// Empties slot `hole` and moves back every later entry of the run that may no longer be
    /// reachable from its home slot (backward-shift deletion).
    fn remove_at(&mut self, hole: usize) {
        self.len -= 1;
        let shift = self.shift;
        let home = |&s: &u64| (s != EMPTY).then(|| home_of_tag(slot_tag(s), shift));
        backward_shift(&mut self.slots, hole, EMPTY, home);
    }

    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        assert!(
            n.trailing_zeros() <= 32,
            "a tag map holds at most 2^31 blocks"
        );
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; n].into_boxed_slice());
        self.shift -= 1;
        for s in old.iter().copied().filter(|&s| s != EMPTY) {
            self.place(s);
        }
    }

    /// Every block in the map.
    pub(super) fn blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.slots
            .iter()
            .copied()
            .filter(|&s| s != EMPTY)
            .map(slot_block)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Against a std map, with hashes that share tags (the same high 32 bits) and a table
        /// that grows: every present hash is found with its block, removed ones are not.
        #[test]
        fn behaves_as_a_map(ops in prop::collection::vec((0u64..4, 0u64..40, any::<bool>()), 1..400)) {
            let mut map = TagMap::with_capacity(2);
            let mut model: HashMap<BlockHash, BlockId> = HashMap::new();
            let mut next: BlockId = 0;
            for (high, low, add) in ops {
                let hash = (high << 32) | low;
                match (add, model.get(&hash).copied()) {
                    (true, None) => {
                        prop_assert!(map.insert_if_absent(hash, next, |_| false));
                        model.insert(hash, next);
                        next += 1;
                    }
                    (false, Some(b)) => {
                        prop_assert!(map.remove(hash, b));
                        model.remove(&hash);
                    }
                    (false, None) => {
                        prop_assert!(!map.remove(hash, next));
                    }
                    (true, Some(b)) => {
                        prop_assert!(!map.insert_if_absent(hash, next, |x| x == b));
                    }
                }
                let holds = |b: BlockId| model.iter().any(|(&h, &mb)| mb == b && h == hash);
                prop_assert_eq!(map.get(hash, holds), model.get(&hash).copied());
                prop_assert_eq!(map.len(), model.len());
            }
            for (&h, &b) in &model {
                prop_assert_eq!(map.get(h, |x| x == b), Some(b));
            }
            let mut blocks: Vec<BlockId> = map.blocks().collect();
            blocks.sort_unstable();
            let mut want: Vec<BlockId> = model.values().copied().collect();
            want.sort_unstable();
            prop_assert_eq!(blocks, want);
        }
    }
}

//! The pool's prefix-cache map, block hash -> block, in 8-byte slots.
//!
//! A slot holds a 32-bit tag and the block. The full hash is not stored: the pool keeps it in
//! the block's metadata, so a tag that matches is confirmed there (`get`'s `holds`), and the
//! block is what a removal names. Against [`BlockMap`]'s 16-byte slots the map takes half the
//! memory, and a cache line holds 8 slots instead of 4. Callers already read the block's
//! metadata on every path that finds a block (to take a reference, or to evict it), so the
//! confirmation costs a line only on lookups that do nothing else with the block.
//!
//! **Chains share lines.** Every walk over the map follows a prompt's chain of blocks in
//! order (a lookup from its first block, a commit of the blocks a step filled, an eviction
//! from a released sequence's tail back), so a block's tag is not its own hash's bits but its
//! chain's ([`tag_at`]): each run of 8 blocks (depths `8k..8k + 8`) takes the bits of the
//! run's first hash, and its depth within the run picks the slot within one home line. A
//! 1,200-block document then sits in about 150 lines walked in order where it sat in 1,200
//! random ones. A tag still names one prefix (chained hashes: a block's hash names its
//! ancestors, the run's first block among them), so the pool computes it whenever it has the
//! chain, and keeps each cached block's in its metadata for the eviction.
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

/// Blocks of a chain that share a home line: a line's slots.
pub(super) const RUN: usize = SLOTS_PER_LINE;

/// The tag of the block at `depth` of a prompt whose block hashes are `chain` (at least
/// `depth + 1` of them): the high bits of the hash that starts its run of [`RUN`] blocks,
/// with the block's place in the run in the low bits.
#[inline]
pub(super) fn tag_at(chain: &[BlockHash], depth: usize) -> u32 {
    let start = depth - depth % RUN;
    ((chain[start] >> 32) as u32 & !(RUN as u32 - 1)) | (depth % RUN) as u32
}

/// The home slot of `tag` in a table of `2^(32 - shift)` slots: the run's line from the
/// tag's high bits, the slot within it from its low bits. A table has at least `MIN_SLOTS`,
/// so at least two lines.
#[inline]
fn home_of_tag(tag: u32, shift: u32) -> usize {
    let line = ((tag / RUN as u32).wrapping_mul(SPREAD) >> (shift + RUN.trailing_zeros())) as usize;
    line * RUN + tag as usize % RUN
}

#[inline]
fn slot(tag: u32, block: BlockId) -> u64 {
    (u64::from(tag) << 32) | (u64::from(block) + 1)
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
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Prefetches `tag`'s home line and the next one (a removal's shift reads on to the next
    /// empty slot, and a run's entries spill into it when the line was taken).
    #[inline]
    pub(super) fn touch(&self, tag: u32) {
        let home = self.home_of_tag(tag);
        prefetch(&self.slots[home]);
        prefetch(&self.slots[(home + SLOTS_PER_LINE) & self.mask()]);
    }

    /// The cache line `tag`'s home slot is in.
    #[inline]
    pub(super) fn home_line(&self, tag: u32) -> usize {
        dolphin_cluster::prefetch::line_of(&self.slots[self.home_of_tag(tag)])
    }

    /// Prefetches `tag`'s home line only.
    #[inline]
    pub(super) fn touch_home(&self, tag: u32) {
        prefetch(&self.slots[self.home_of_tag(tag)]);
    }

    /// The block tagged `t` that `holds(block)` confirms (the block is cached under the hash
    /// the caller looks for): the first such block on the tag's probe sequence.
    #[inline]
    pub(super) fn get(&self, t: u32, holds: impl Fn(BlockId) -> bool) -> Option<BlockId> {
        let mask = self.mask();
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

    /// Adds `block` under tag `t` unless its hash is already there (a block with tag `t`
    /// that `holds` confirms, as in [`get`](Self::get)): one probe for both. Returns the block
    /// already there, or `None` when it added.
    #[inline]
    pub(super) fn insert_or_get(
        &mut self,
        t: u32,
        block: BlockId,
        holds: impl Fn(BlockId) -> bool,
    ) -> Option<BlockId> {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home_of_tag(t);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                break;
            }
            if slot_tag(s) == t && holds(slot_block(s)) {
                return Some(slot_block(s));
            }
            i = (i + 1) & mask;
        }
        self.slots[i] = slot(t, block);
        self.len += 1;
        None
    }

    fn place(&mut self, s: u64) {
        let mask = self.mask();
        let mut i = self.home_of_tag(slot_tag(s));
        while self.slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = s;
    }

    /// Removes `block`, tagged `t`; false if it is not there.
    #[inline]
    pub(super) fn remove(&mut self, t: u32, block: BlockId) -> bool {
        let (mask, want) = (self.mask(), slot(t, block));
        let mut i = self.home_of_tag(t);
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
        /// Against a std map, with hashes that share tags (a handful of tags, three lines' worth,
        /// for many hashes) and a table that grows: every present hash is found with its block,
        /// removed ones are not.
        #[test]
        fn behaves_as_a_map(ops in prop::collection::vec((0u32..24, 0u64..8, any::<bool>()), 1..400)) {
            let mut map = TagMap::with_capacity(2);
            // hash -> (tag, block), and each block's hash (what `holds` confirms against).
            let mut model: HashMap<BlockHash, (u32, BlockId)> = HashMap::new();
            let mut hash_of: Vec<BlockHash> = Vec::new();
            for (t, low, add) in ops {
                let hash = (u64::from(t) << 32) | low;
                let holds = |b: BlockId| hash_of[b as usize] == hash && model.get(&hash).is_some_and(|&(_, mb)| mb == b);
                match (add, model.get(&hash).copied()) {
                    (true, None) => {
                        let next = hash_of.len() as BlockId;
                        prop_assert_eq!(map.insert_or_get(t, next, |_| false), None);
                        model.insert(hash, (t, next));
                        hash_of.push(hash);
                    }
                    (false, Some((t, b))) => {
                        prop_assert!(map.remove(t, b));
                        model.remove(&hash);
                    }
                    (false, None) => {
                        prop_assert!(!map.remove(t, hash_of.len() as BlockId));
                    }
                    (true, Some((_, b))) => {
                        prop_assert_eq!(map.insert_or_get(t, hash_of.len() as BlockId, holds), Some(b));
                    }
                }
                let holds = |b: BlockId| hash_of[b as usize] == hash && model.get(&hash).is_some_and(|&(_, mb)| mb == b);
                prop_assert_eq!(map.get(t, holds), model.get(&hash).map(|&(_, b)| b));
                prop_assert_eq!(map.len(), model.len());
            }
            for &(t, b) in model.values() {
                prop_assert_eq!(map.get(t, |x| x == b), Some(b));
            }
            let mut blocks: Vec<BlockId> = map.blocks().collect();
            blocks.sort_unstable();
            let mut want: Vec<BlockId> = model.values().map(|&(_, b)| b).collect();
            want.sort_unstable();
            prop_assert_eq!(blocks, want);
        }
    }

    /// A run of blocks shares its first hash's line: consecutive depths, consecutive home
    /// slots, whatever the hashes of the run's other blocks.
    #[test]
    fn a_run_of_a_chain_shares_a_line() {
        let chain: Vec<BlockHash> = (0..20u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let shift = 32 - 16; // 2^16 slots
        let homes: Vec<usize> = (0..chain.len())
            .map(|d| home_of_tag(tag_at(&chain, d), shift))
            .collect();
        for run in homes.chunks(RUN) {
            let line = run[0] / RUN;
            for (i, &h) in run.iter().enumerate() {
                assert_eq!((h / RUN, h % RUN), (line, i), "homes {homes:?}");
            }
        }
        assert_ne!(homes[0] / RUN, homes[8] / RUN, "another run, another line");
    }
}

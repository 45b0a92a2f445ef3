//! LRU order of the evictable blocks (cached, unreferenced), least recently used first, as a
//! queue with lazy deletion.
//!
//! A block enters at the back with a fresh stamp; leaving the order before it reaches the front
//! (a prefix hit revives it) only clears its `linked` flag, and the queue entry it left behind
//! is skipped when it comes up. So popping reads the queue front to back, never following a
//! link from one block to the next: on a pool far larger than the caches, a doubly linked list
//! paid a dependent cache miss per eviction (the simulator's hottest loop), while here the
//! queue streams, and the lines an eviction will touch (the block's and its cache slot) can be
//! fetched ahead from the entries themselves (`front_ahead`). Stale entries
//! are dropped in one pass once they outnumber the live ones, so the queue never holds more than
//! about twice the pool's blocks.

use std::collections::VecDeque;

use crate::types::BlockId;

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The map tag whose slot the block's eviction will touch, kept here so a prefetch of that
    /// slot needs no read of the block's own line first; [`NO_SLOT`] for a block not in the map
    /// (a prefetch hint only: a real tag equal to it merely goes unprefetched).
    tag: u32,
    block: BlockId,
    stamp: u32,
}

/// [`Entry::tag`] of a block whose eviction touches no map slot.
const NO_SLOT: u32 = u32::MAX;

/// A block's place in the LRU order, kept in its metadata: whether it is in the order, and
/// the stamp of its latest queue entry (older entries are stale).
pub(crate) trait Linked {
    fn linked(&self) -> bool;
    fn set_linked(&mut self, linked: bool);
    fn stamp(&self) -> u32;
    fn set_stamp(&mut self, stamp: u32);

    /// Whether `entry` is this block's live entry.
    fn is_live(&self, stamp: u32) -> bool {
        self.linked() && self.stamp() == stamp
    }
}

/// The evictable blocks in LRU order. Methods that need other blocks' links take the metadata
/// of all blocks, indexed by block id.
#[derive(Debug, Default)]
pub(crate) struct Lru {
    queue: VecDeque<Entry>,
    len: u32,
}

impl Lru {
    /// Blocks in the order.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Appends `block` as the most recently used; `slot_hint` is the map tag whose slot its
    /// eviction will touch (`None`: it is not in the map). It must not be in the order.
    pub(crate) fn push_back<M: Linked>(
        &mut self,
        blocks: &mut [M],
        block: BlockId,
        slot_hint: Option<u32>,
    ) {
        let tag = slot_hint.unwrap_or(NO_SLOT);
        let meta = &mut blocks[block as usize];
        debug_assert!(!meta.linked(), "block {block} already in the LRU order");
        let stamp = meta.stamp().wrapping_add(1);
        meta.set_stamp(stamp);
        meta.set_linked(true);
        self.len += 1;
        self.queue.push_back(Entry { tag, block, stamp });
        self.compact_if_stale(blocks);
    }

    /// Takes the block of `meta` out of the order, if it is in it.
    pub(crate) fn unlink(&mut self, meta: &mut impl Linked) {
        if meta.linked() {
            meta.set_linked(false);
            self.len -= 1;
        }
    }

    /// Removes and returns the least recently used block.
    pub(crate) fn pop_front<M: Linked>(&mut self, blocks: &mut [M]) -> Option<BlockId> {
        while let Some(e) = self.queue.pop_front() {
            let meta = &mut blocks[e.block as usize];
            if meta.is_live(e.stamp) {
                meta.set_linked(false);
                self.len -= 1;
                self.compact_if_stale(blocks);
                return Some(e.block);
            }
        }
        None
    }

    /// The block and map tag (if any) `ahead` entries behind the queue's front (live or
    /// stale), to prefetch.
    pub(crate) fn front_ahead(&self, ahead: usize) -> Option<(BlockId, Option<u32>)> {
        self.queue
            .get(ahead)
            .map(|e| (e.block, (e.tag != NO_SLOT).then_some(e.tag)))
    }

    /// Drops stale entries once they outnumber the live ones.
    fn compact_if_stale<M: Linked>(&mut self, blocks: &[M]) {
        if self.queue.len() > 2 * self.len as usize + 64 {
            self.queue
                .retain(|e| blocks[e.block as usize].is_live(e.stamp));
        }
    }

    /// Blocks from least to most recently used.
    #[cfg(test)]
    pub(crate) fn iter<'a, M: Linked>(
        &'a self,
        blocks: &'a [M],
    ) -> impl Iterator<Item = BlockId> + 'a {
        self.queue
            .iter()
            .filter(|e| blocks[e.block as usize].is_live(e.stamp))
            .map(|e| e.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, Default)]
    struct LruLink {
        stamp: u32,
        linked: bool,
    }

    impl Linked for LruLink {
        fn linked(&self) -> bool {
            self.linked
        }
        fn set_linked(&mut self, linked: bool) {
            self.linked = linked;
        }
        fn stamp(&self) -> u32 {
            self.stamp
        }
        fn set_stamp(&mut self, stamp: u32) {
            self.stamp = stamp;
        }
    }

    #[test]
    fn push_pop_unlink_keep_order() {
        let mut links = vec![LruLink::default(); 8];
        let mut lru = Lru::default();
        for b in [3, 1, 4, 5] {
            lru.push_back(&mut links, b, Some(b));
        }
        assert_eq!(lru.iter(&links).collect::<Vec<_>>(), vec![3, 1, 4, 5]);
        lru.unlink(&mut links[4]);
        lru.unlink(&mut links[4]); // not linked any more: no-op
        assert!(!links[4].linked);
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.pop_front(&mut links), Some(3));
        lru.unlink(&mut links[5]);
        assert_eq!(lru.iter(&links).collect::<Vec<_>>(), vec![1]);
        assert_eq!(lru.pop_front(&mut links), Some(1));
        assert_eq!(lru.pop_front(&mut links), None);
        lru.push_back(&mut links, 4, Some(4));
        assert_eq!(lru.iter(&links).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn a_revived_block_pushed_again_is_not_popped_twice() {
        let mut links = vec![LruLink::default(); 4];
        let mut lru = Lru::default();
        lru.push_back(&mut links, 0, Some(0));
        lru.push_back(&mut links, 1, Some(1));
        lru.unlink(&mut links[0]); // revived by a prefix hit ...
        lru.push_back(&mut links, 0, Some(0)); // ... and released again: now the most recent
        assert_eq!(lru.pop_front(&mut links), Some(1));
        assert_eq!(lru.pop_front(&mut links), Some(0));
        assert_eq!(lru.pop_front(&mut links), None);
        assert_eq!(lru.len(), 0);
    }

    #[test]
    fn stale_entries_are_compacted_away() {
        let mut links = vec![LruLink::default(); 2];
        let mut lru = Lru::default();
        lru.push_back(&mut links, 1, Some(1));
        for _ in 0..10_000 {
            lru.push_back(&mut links, 0, Some(0));
            lru.unlink(&mut links[0]);
            // Pushing compacts: the queue never holds more than about twice the most blocks
            // that were ever evictable at once (two here).
            assert!(lru.queue.len() <= 2 * 2 + 65, "{}", lru.queue.len());
        }
        lru.push_back(&mut links, 0, Some(0));
        assert_eq!(lru.pop_front(&mut links), Some(1));
        assert_eq!(lru.pop_front(&mut links), Some(0));
    }
}

//! Intrusive doubly linked list over block ids: O(1) push, pop and unlink, no allocation after
//! construction. Holds the evictable blocks (cached, unreferenced), least recently used first.

use crate::types::BlockId;

const NIL: u32 = u32::MAX;

/// LRU order of evictable blocks.
#[derive(Debug)]
pub(crate) struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
    len: u32,
}

impl Lru {
    /// An empty list able to hold blocks `0..capacity`.
    pub(crate) fn new(capacity: u32) -> Self {
        let n = capacity as usize;
        Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            linked: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    /// Blocks in the list.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Whether `block` is in the list.
    #[cfg(test)]
    pub(crate) fn contains(&self, block: BlockId) -> bool {
        self.linked[block as usize]
    }

    /// Appends `block` as the most recently used. It must not be in the list.
    pub(crate) fn push_back(&mut self, block: BlockId) {
        let b = block as usize;
        debug_assert!(!self.linked[b], "block {block} already in the LRU list");
        self.prev[b] = self.tail;
        self.next[b] = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.next[self.tail as usize] = block;
        }
        self.tail = block;
        self.linked[b] = true;
        self.len += 1;
    }

    /// Removes and returns the least recently used block.
    pub(crate) fn pop_front(&mut self) -> Option<BlockId> {
        if self.head == NIL {
            return None;
        }
        let block = self.head;
        self.unlink(block);
        Some(block)
    }

    /// Removes `block` if it is in the list.
    pub(crate) fn unlink(&mut self, block: BlockId) {
        let b = block as usize;
        if !self.linked[b] {
            return;
        }
        let (p, n) = (self.prev[b], self.next[b]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b] = NIL;
        self.next[b] = NIL;
        self.linked[b] = false;
        self.len -= 1;
    }

    /// Blocks from least to most recently used.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let b = cur;
            cur = self.next[b as usize];
            Some(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_unlink_keep_order() {
        let mut lru = Lru::new(8);
        for b in [3, 1, 4, 5] {
            lru.push_back(b);
        }
        assert_eq!(lru.iter().collect::<Vec<_>>(), vec![3, 1, 4, 5]);
        lru.unlink(4);
        lru.unlink(4); // not linked any more: no-op
        assert!(!lru.contains(4));
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.pop_front(), Some(3));
        lru.unlink(5);
        assert_eq!(lru.iter().collect::<Vec<_>>(), vec![1]);
        assert_eq!(lru.pop_front(), Some(1));
        assert_eq!(lru.pop_front(), None);
        lru.push_back(4);
        assert_eq!(lru.iter().collect::<Vec<_>>(), vec![4]);
    }
}

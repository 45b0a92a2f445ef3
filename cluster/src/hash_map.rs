//! Maps keyed by block hashes. Block hashes are already uniform 64-bit xxh3 outputs, so they
//! serve as their own hash: rehashing them with SipHash only costs time on the router's lookup
//! path and on every commit and eviction in a worker's KV pool.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::BlockHash;

/// Hasher that passes a `u64` key through unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockHashHasher(u64);

impl Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are meant; this keeps the hasher correct for anything else.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Builds [`BlockHashHasher`]s.
pub type BlockHashBuild = BuildHasherDefault<BlockHashHasher>;

/// A map from block hashes to `V`.
pub type BlockHashMap<V> = HashMap<BlockHash, V, BlockHashBuild>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_their_own_hash() {
        let mut h = BlockHashHasher::default();
        h.write_u64(0xdead_beef);
        assert_eq!(h.finish(), 0xdead_beef);
        let mut m: BlockHashMap<u32> = BlockHashMap::default();
        m.insert(7, 1);
        assert_eq!(m.get(&7), Some(&1));
    }
}

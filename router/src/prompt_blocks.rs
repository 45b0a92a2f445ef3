//! A prompt's chained block hashes as routing reads them.
//!
//! The router's lookup ([`PrefixIndex::lookup_pair`](crate::prefix_index::PrefixIndex::lookup_pair))
//! computes the hashes as its walk reaches them and stops a few blocks past the last one any
//! worker holds, so a prompt that no worker caches costs a few blocks of hashing, not all of
//! them (an 8k-token prompt is 512). The rest is computed only where something needs every
//! hash: a worker whose event stream is down, whose cache the approximate index estimates from
//! the prompts it was sent.

use dolphin_cluster::{BlockHash, BlockHashes};

/// The hashes of one prompt's full blocks: those computed so far, and the means to compute the
/// rest.
#[derive(Debug)]
pub struct PromptBlocks<'t, 'h> {
    rest: BlockHashes<'t>,
    hashes: &'h mut Vec<BlockHash>,
    total: usize,
}

impl<'t, 'h> PromptBlocks<'t, 'h> {
    /// The blocks of `tokens` (full blocks of `block_size`, the first named from `root`:
    /// [`dolphin_cluster::ROOT_SEED`] or a cache salt's root), none computed yet; `hashes` is a
    /// reusable buffer, cleared here.
    pub fn new(
        root: u64,
        tokens: &'t [u32],
        block_size: usize,
        hashes: &'h mut Vec<BlockHash>,
    ) -> Self {
        hashes.clear();
        let rest = BlockHashes::new(root, tokens, block_size);
        Self {
            total: rest.len(),
            rest,
            hashes,
        }
    }

    /// Full blocks in the prompt, whether hashed yet or not.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The hashes computed so far (the leading blocks), and the iterator and buffer a walk
    /// extends them with.
    pub fn parts(&mut self) -> (&mut BlockHashes<'t>, &mut Vec<BlockHash>) {
        (&mut self.rest, self.hashes)
    }

    /// Every block's hash (computing those not yet computed).
    pub fn all(&mut self) -> &[BlockHash] {
        self.hashes.extend(&mut self.rest);
        self.hashes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_equals_hashing_at_once_wherever_a_walk_stopped() {
        let tokens: Vec<u32> = (0..100).collect();
        let root = dolphin_cluster::salted_root("tenant");
        let mut expected = Vec::new();
        dolphin_cluster::block_hashes_from(root, &tokens, 16, &mut expected);
        for taken in 0..=expected.len() + 1 {
            let mut buf = vec![7];
            let mut blocks = PromptBlocks::new(root, &tokens, 16, &mut buf);
            assert_eq!(blocks.total(), 6);
            let (rest, hashes) = blocks.parts();
            hashes.extend(rest.take(taken));
            assert_eq!(blocks.all(), expected.as_slice());
        }
        let mut buf = Vec::new();
        assert_eq!(PromptBlocks::new(root, &tokens, 0, &mut buf).total(), 0);
    }
}

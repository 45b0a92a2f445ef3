//! Chained block hashing: the one function the router and the workers share to name KV blocks.
//!
//! Block `i` of a prompt hashes the little-endian bytes of its `block_size` tokens with xxh3,
//! seeded by the hash of block `i - 1` (the first block by [`ROOT_SEED`]). A block's hash
//! therefore names the whole prefix ending with it: two prompts share hash `i` only if they share
//! their first `(i + 1) * block_size` tokens. Only full blocks are hashed; a trailing partial
//! block is never cached, so it has no name.
//!
//! The router hashes every prompt (an 8k-token prompt is 512 blocks), so this is a hot path: no
//! allocation, and each block's bytes are hashed in one shot where they lie (little-endian
//! machines) or from a stack buffer (about 3x faster than xxh3's streaming state, which derives
//! a secret per seed).

use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

use crate::BlockHash;

/// Seed of the first block's hash ("dolphin1" in ASCII). Changing it renames every cached block
/// in a cluster, so it is part of the wire contract.
pub const ROOT_SEED: u64 = 0x646f_6c70_6869_6e31;

/// The seed of a salted request's first block (vLLM's `cache_salt`): the salt's xxh3 under
/// [`ROOT_SEED`]. Its blocks' names differ from every unsalted prompt's and every other salt's,
/// so requests share cached KV (and learn from its timing) only with the same salt. An empty
/// salt is no salt.
pub fn salted_root(salt: &str) -> u64 {
    if salt.is_empty() {
        return ROOT_SEED;
    }
    xxh3_64_with_seed(salt.as_bytes(), ROOT_SEED)
}

/// Tokens assembled per one-shot hash; larger blocks are fed to the streaming hasher in pieces of
/// this size (same result: xxh3's streaming and one-shot forms agree).
const STACK_TOKENS: usize = 64;

/// Hash of one block given the hash of the block before it (`None` for the first block).
pub fn chain_hash(parent: Option<BlockHash>, block_tokens: &[u32]) -> BlockHash {
    chain_hash_from(ROOT_SEED, parent, block_tokens)
}

/// [`chain_hash`] where the first block is seeded by `root` ([`salted_root`]).
pub fn chain_hash_from(root: u64, parent: Option<BlockHash>, block_tokens: &[u32]) -> BlockHash {
    let seed = parent.unwrap_or(root);
    // Where the machine is little-endian the bytes are the tokens' own: hashed in place. (Copied
    // 4 bytes at a time into a buffer that xxh3 then read 8 bytes at a time, each load waited
    // for two stores it could not forward from.)
    if cfg!(target_endian = "little") {
        return xxh3_64_with_seed(bytemuck::cast_slice(block_tokens), seed);
    }
    copied_hash(seed, block_tokens)
}

/// The block's tokens converted to little-endian bytes in a stack buffer, then hashed: the
/// definition on any machine, the path a big-endian one takes.
fn copied_hash(seed: u64, block_tokens: &[u32]) -> BlockHash {
    let mut buf = [0u8; STACK_TOKENS * 4];
    if block_tokens.len() <= STACK_TOKENS {
        let n = fill_le(&mut buf, block_tokens);
        return xxh3_64_with_seed(&buf[..n], seed);
    }
    let mut hasher = Xxh3::with_seed(seed);
    for piece in block_tokens.chunks(STACK_TOKENS) {
        let n = fill_le(&mut buf, piece);
        hasher.update(&buf[..n]);
    }
    hasher.digest()
}

/// Hashes of every full block of `tokens`, in order. `block_size` 0 has no blocks.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len().checked_div(block_size).unwrap_or(0));
    block_hashes_into(tokens, block_size, &mut out);
    out
}

/// Like [`block_hashes`], but replaces the contents of `out`, so a caller that reuses one vector
/// hashes without allocating once it has grown to the longest prompt.
pub fn block_hashes_into(tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    block_hashes_from(ROOT_SEED, tokens, block_size, out);
}

/// [`block_hashes_into`] where the first block is seeded by `root` ([`salted_root`]).
pub fn block_hashes_from(root: u64, tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    out.clear();
    out.extend(BlockHashes::new(root, tokens, block_size));
}

/// The chained hashes of a prompt's full blocks, one at a time: a walk that stops where no
/// worker holds the prompt any further hashes no further (the router's lookup,
/// `PrefixIndex::lookup_pair`), and can resume later where it needs every hash.
#[derive(Clone, Debug)]
pub struct BlockHashes<'a> {
    root: u64,
    parent: Option<BlockHash>,
    blocks: std::slice::ChunksExact<'a, u32>,
}

impl<'a> BlockHashes<'a> {
    /// The hashes of `tokens`' full blocks of `block_size` tokens, the first seeded by `root`
    /// ([`ROOT_SEED`] or a [`salted_root`]). `block_size` 0 has no blocks.
    pub fn new(root: u64, tokens: &'a [u32], block_size: usize) -> Self {
        let tokens = if block_size == 0 { &[][..] } else { tokens };
        Self {
            root,
            parent: None,
            blocks: tokens.chunks_exact(block_size.max(1)),
        }
    }
}

impl Iterator for BlockHashes<'_> {
    type Item = BlockHash;

    #[inline]
    fn next(&mut self) -> Option<BlockHash> {
        let hash = chain_hash_from(self.root, self.parent, self.blocks.next()?);
        self.parent = Some(hash);
        Some(hash)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.blocks.size_hint()
    }
}

impl ExactSizeIterator for BlockHashes<'_> {}

/// Writes `tokens` as little-endian bytes at the start of `buf`; returns the byte count.
/// `tokens` must fit (`tokens.len() <= STACK_TOKENS`).
fn fill_le(buf: &mut [u8; STACK_TOKENS * 4], tokens: &[u32]) -> usize {
    for (dst, token) in buf.chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&token.to_le_bytes());
    }
    tokens.len() * 4
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The definition, written the slow obvious way: the fast path must agree with it.
    fn reference(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
        let mut seed = ROOT_SEED;
        tokens
            .chunks_exact(block_size)
            .map(|block| {
                let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
                seed = xxh3_64_with_seed(&bytes, seed);
                seed
            })
            .collect()
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        let tokens: Vec<u32> = (0..40).collect();
        assert_eq!(block_hashes(&tokens, 16).len(), 2);
        assert_eq!(block_hashes(&tokens[..15], 16).len(), 0);
        assert_eq!(block_hashes(&tokens[..32], 16), block_hashes(&tokens, 16));
        assert!(block_hashes(&[], 16).is_empty());
    }

    #[test]
    fn zero_block_size_has_no_blocks() {
        assert!(block_hashes(&[1, 2, 3], 0).is_empty());
    }

    #[test]
    fn first_block_uses_root_seed_and_chains() {
        let tokens: Vec<u32> = (100..132).collect();
        let hashes = block_hashes(&tokens, 16);
        assert_eq!(hashes[0], chain_hash(None, &tokens[..16]));
        assert_eq!(hashes[1], chain_hash(Some(hashes[0]), &tokens[16..]));
        assert_eq!(hashes, reference(&tokens, 16));
    }

    #[test]
    fn a_salt_renames_every_block() {
        let tokens: Vec<u32> = (100..148).collect();
        let plain = block_hashes(&tokens, 16);
        let mut salted = Vec::new();
        block_hashes_from(salted_root("tenant-a"), &tokens, 16, &mut salted);
        assert!(
            plain.iter().all(|h| !salted.contains(h)),
            "{plain:?} {salted:?}"
        );
        let mut other = Vec::new();
        block_hashes_from(salted_root("tenant-b"), &tokens, 16, &mut other);
        assert!(salted.iter().all(|h| !other.contains(h)));
        // The chain is the same chain from another first seed.
        assert_eq!(salted[1], chain_hash(Some(salted[0]), &tokens[16..32]));
        assert_eq!(
            salted[0],
            chain_hash_from(salted_root("tenant-a"), None, &tokens[..16])
        );
        // No salt is the unsalted root.
        let mut empty = Vec::new();
        block_hashes_from(salted_root(""), &tokens, 16, &mut empty);
        assert_eq!(empty, plain);
    }

    #[test]
    fn known_value_is_stable() {
        // Pins the wire format: a change here renames every cached block in a running cluster.
        let block: Vec<u32> = (0..16).collect();
        let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            chain_hash(None, &block),
            xxh3_64_with_seed(&bytes, 0x646f_6c70_6869_6e31)
        );
    }

    #[test]
    fn large_blocks_use_the_streaming_path_with_the_same_result() {
        let tokens: Vec<u32> = (0..1000).map(|i| i * 7919).collect();
        for block_size in [63, 64, 65, 128, 200, 333] {
            assert_eq!(
                block_hashes(&tokens, block_size),
                reference(&tokens, block_size)
            );
        }
    }

    #[test]
    fn in_place_and_copied_bytes_hash_alike() {
        let tokens: Vec<u32> = (0..1000u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        for len in [0, 1, 16, 60, 64, 65, 200, 1000] {
            assert_eq!(
                chain_hash(Some(7), &tokens[..len]),
                copied_hash(7, &tokens[..len]),
                "{len} tokens"
            );
        }
    }

    #[test]
    fn order_within_a_block_matters() {
        assert_ne!(chain_hash(None, &[1, 2]), chain_hash(None, &[2, 1]));
    }

    proptest! {
        #[test]
        fn fast_path_matches_definition(
            tokens in prop::collection::vec(any::<u32>(), 0..600),
            block_size in 1usize..100,
        ) {
            prop_assert_eq!(block_hashes(&tokens, block_size), reference(&tokens, block_size));
        }

        #[test]
        fn into_equals_allocating_form(
            tokens in prop::collection::vec(any::<u32>(), 0..400),
            block_size in 1usize..40,
            stale in prop::collection::vec(any::<u64>(), 0..10),
        ) {
            let mut out = stale;
            block_hashes_into(&tokens, block_size, &mut out);
            prop_assert_eq!(out, block_hashes(&tokens, block_size));
        }

        #[test]
        fn a_change_in_block_i_changes_hashes_from_i_on(
            tokens in prop::collection::vec(any::<u32>(), 16..400),
            block_size in 1usize..17,
            pos_seed in any::<usize>(),
            delta in 1u32..,
        ) {
            let full = tokens.len() / block_size * block_size;
            prop_assume!(full > 0);
            let pos = pos_seed % full;
            let mut changed = tokens.clone();
            changed[pos] = changed[pos].wrapping_add(delta);
            let before = block_hashes(&tokens, block_size);
            let after = block_hashes(&changed, block_size);
            let i = pos / block_size;
            prop_assert_eq!(&before[..i], &after[..i]);
            for j in i..before.len() {
                prop_assert_ne!(before[j], after[j], "block {} of {}", j, before.len());
            }
        }

        #[test]
        fn same_prefix_gives_same_leading_hashes(
            prefix in prop::collection::vec(any::<u32>(), 0..200),
            tail_a in prop::collection::vec(any::<u32>(), 0..100),
            tail_b in prop::collection::vec(any::<u32>(), 0..100),
            block_size in 1usize..17,
        ) {
            let a: Vec<u32> = prefix.iter().chain(&tail_a).copied().collect();
            let b: Vec<u32> = prefix.iter().chain(&tail_b).copied().collect();
            let shared = prefix.len() / block_size;
            let (ha, hb) = (block_hashes(&a, block_size), block_hashes(&b, block_size));
            prop_assert_eq!(&ha[..shared], &hb[..shared]);
        }
    }
}

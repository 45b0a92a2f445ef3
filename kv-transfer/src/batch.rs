//! How the sender cuts a transfer into vectored writes.
//!
//! A block's frame checksum comes from the checksum its exporter took ([`KvBlock::crc`]), with
//! the transfer id and index folded in: the sender never reads a payload itself, only the
//! kernel's copy into the socket does. (Before, the sender hashed each batch right before
//! writing it, a pass over blocks that by then had left the caches: 12% of the transport's
//! throughput on the AVX2-only host of 2026-12-04. Hashing on another thread cost more wakeups
//! than it saved on 2 cores.)

use std::ops::Range;

use dolphin_kv_block::KvBlock;

use crate::TransferId;
use crate::frame::block_checksum_of;

/// Most blocks per vectored write (two slices each; Linux takes 1024 slices per call).
pub(crate) const BATCH_BLOCKS: usize = 32;
/// Payload bytes per vectored write (at least one block, whatever its size).
pub(crate) const BATCH_BYTES: usize = 256 << 10;

/// The blocks of the batch that starts at block `start` (empty only for an empty transfer).
pub(crate) fn batch_at(blocks: &[KvBlock], start: usize) -> Range<usize> {
    let mut stop = start;
    let mut bytes = 0;
    while stop < blocks.len()
        && stop - start < BATCH_BLOCKS
        && (stop == start || bytes + blocks[stop].len() <= BATCH_BYTES)
    {
        bytes += blocks[stop].len();
        stop += 1;
    }
    start..stop
}

/// Checksums of `blocks`, the first of which has index `first` in the transfer.
pub(crate) fn checksums(
    id: TransferId,
    first: usize,
    blocks: &[KvBlock],
) -> impl Iterator<Item = u32> {
    blocks
        .iter()
        .enumerate()
        // Lossless: indexes are below the block count, which the caller checked fits in u32.
        .map(move |(k, b)| block_checksum_of(id, (first + k) as u32, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::block_checksum;

    fn sized(lens: &[usize]) -> Vec<KvBlock> {
        lens.iter().map(|&n| KvBlock::from(vec![7u8; n])).collect()
    }

    #[test]
    fn batches_respect_both_limits_and_cover_everything() {
        let blocks = sized(&[0; 70]);
        assert_eq!(batch_at(&blocks, 0), 0..BATCH_BLOCKS);
        assert_eq!(batch_at(&blocks, 64), 64..70);
        let big = sized(&[200 << 10, 50 << 10, 10 << 10, 2 << 20, 1]);
        assert_eq!(batch_at(&big, 0), 0..2);
        assert_eq!(batch_at(&big, 2), 2..3);
        // A block over the byte budget still forms a batch of its own.
        assert_eq!(batch_at(&big, 3), 3..4);
        assert_eq!(batch_at(&big, 4), 4..5);
        assert_eq!(batch_at(&[], 0), 0..0);
    }

    #[test]
    fn checksums_carry_the_transfer_index() {
        let blocks = sized(&[10, 20, 30]);
        let sums: Vec<u32> = checksums(5, 1, &blocks[1..]).collect();
        assert_eq!(
            sums,
            vec![
                block_checksum(5, 1, blocks[1].bytes()),
                block_checksum(5, 2, blocks[2].bytes())
            ]
        );
    }
}

//! How the sender cuts a transfer into vectored writes.
//!
//! A batch's checksums are computed right before the batch is written, so the batch should fit
//! in a core's L2 cache: the checksum pass then pulls the blocks in from memory and the kernel's
//! copy into the socket reads them from cache. Computing checksums ahead on another thread was
//! measured too: it freed the sending thread but cost more wakeups than it saved on this 2-core
//! host under load, so checksums stay inline.

use std::ops::Range;

use bytes::Bytes;

use crate::TransferId;
use crate::frame::block_checksum;

/// Most blocks per vectored write (two slices each; Linux takes 1024 slices per call).
pub(crate) const BATCH_BLOCKS: usize = 32;
/// Payload bytes per vectored write (at least one block, whatever its size).
pub(crate) const BATCH_BYTES: usize = 256 << 10;

/// The blocks of the batch that starts at block `start` (empty only for an empty transfer).
pub(crate) fn batch_at(blocks: &[Bytes], start: usize) -> Range<usize> {
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
pub(crate) fn checksums(id: TransferId, first: usize, blocks: &[Bytes]) -> Vec<u32> {
    blocks
        .iter()
        .enumerate()
        // Lossless: indexes are below the block count, which the caller checked fits in u32.
        .map(|(k, b)| block_checksum(id, (first + k) as u32, b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(lens: &[usize]) -> Vec<Bytes> {
        lens.iter().map(|&n| Bytes::from(vec![7u8; n])).collect()
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
        let sums = checksums(5, 1, &blocks[1..]);
        assert_eq!(
            sums,
            vec![
                block_checksum(5, 1, &blocks[1]),
                block_checksum(5, 2, &blocks[2])
            ]
        );
    }
}

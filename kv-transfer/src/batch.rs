//! How the sender cuts a transfer into vectored writes, and computes each batch's checksums one
//! batch ahead, on a blocking thread, while the previous batch is being written.
//!
//! Why ahead of time: the checksum is the one pass over the payload that the sender adds to a
//! plain socket write, and the blocks usually come cold from memory. Measured on 512 KiB blocks,
//! computing it inline cost the sending thread a quarter more time than the write alone; computed
//! on another core it overlaps the write and the sending thread only copies.

use std::ops::Range;

use bytes::Bytes;
use tokio::task::JoinHandle;

use crate::TransferId;
use crate::frame::block_checksum;

/// Most blocks per vectored write (two slices each; Linux takes 1024 slices per call).
pub(crate) const BATCH_BLOCKS: usize = 32;
/// Payload bytes per vectored write (at least one block, whatever its size).
const BATCH_BYTES: usize = 1 << 20;
/// Batches smaller than this are checksummed inline: handing them to another thread would cost
/// more than the checksum.
const OFFLOAD_BYTES: usize = 256 << 10;

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
    stop = stop.max(start);
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

/// A batch's checksums, possibly still being computed on a blocking thread.
#[derive(Debug)]
pub(crate) enum PendingChecksums {
    Ready(Vec<u32>),
    Running {
        job: JoinHandle<Vec<u32>>,
        range: Range<usize>,
    },
}

impl PendingChecksums {
    /// Starts computing the checksums of `range`, off this thread when the batch is large.
    pub(crate) fn start(id: TransferId, blocks: &[Bytes], range: Range<usize>) -> Self {
        let bytes: usize = blocks[range.clone()].iter().map(Bytes::len).sum();
        if bytes < OFFLOAD_BYTES {
            return Self::Ready(checksums(id, range.start, &blocks[range]));
        }
        // Cloning `Bytes` only bumps reference counts.
        let owned = blocks[range.clone()].to_vec();
        let first = range.start;
        let job = tokio::task::spawn_blocking(move || checksums(id, first, &owned));
        Self::Running { job, range }
    }

    /// The checksums, once computed.
    pub(crate) async fn wait(self, id: TransferId, blocks: &[Bytes]) -> Vec<u32> {
        match self {
            Self::Ready(sums) => sums,
            Self::Running { job, range } => match job.await {
                Ok(sums) => sums,
                // The runtime is shutting down (or the job panicked): compute them here.
                Err(_) => checksums(id, range.start, &blocks[range]),
            },
        }
    }
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
        let big = sized(&[600 << 10, 300 << 10, 300 << 10, 2 << 20, 1]);
        assert_eq!(batch_at(&big, 0), 0..2);
        assert_eq!(batch_at(&big, 2), 2..3);
        // A block over the byte budget still forms a batch of its own.
        assert_eq!(batch_at(&big, 3), 3..4);
        assert_eq!(batch_at(&big, 4), 4..5);
        assert_eq!(batch_at(&[], 0), 0..0);
    }

    #[tokio::test]
    async fn offloaded_checksums_equal_inline_ones() {
        let blocks: Vec<Bytes> = (0..6u8).map(|i| Bytes::from(vec![i; 200 << 10])).collect();
        let range = 2..6;
        let pending = PendingChecksums::start(9, &blocks, range.clone());
        assert!(matches!(pending, PendingChecksums::Running { .. }));
        let got = pending.wait(9, &blocks).await;
        assert_eq!(got, checksums(9, range.start, &blocks[range]));
        assert_eq!(got[0], block_checksum(9, 2, &blocks[2]));
    }
}

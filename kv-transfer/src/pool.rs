//! Recycling of large block buffers on the receiver.
//!
//! Every received block needs a fresh buffer of its size. Allocating them from the system
//! allocator page-faults on every block: glibc serves them from memory it just returned to the
//! kernel (the heap shrinks each time the decode worker drops a batch of blocks), and the kernel
//! zeroes each page again. Measured on 1 GiB of 512 KiB blocks: 290k extra page faults and a
//! fifth of the receiver's time. So the receiver keeps a handle to each large block it hands out;
//! once the consumer has dropped its copy, the handle is the only one left and the buffer can be
//! taken back whole, without a copy, for a later block of a similar size.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

/// Blocks smaller than this come from the allocator: it handles them well, and tracking them
/// would cost more than it saves.
pub(crate) const MIN_POOLED: usize = 64 << 10;
/// Most buffers tracked at once.
const MAX_ENTRIES: usize = 256;
/// Most bytes tracked at once (in use or idle): bounds the memory the pool can keep alive.
const MAX_BYTES: usize = 256 << 20;

/// Large block buffers, in use by consumers or idle, oldest first.
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    tracked: VecDeque<Bytes>,
    bytes: usize,
}

impl BufferPool {
    /// An empty buffer with room for exactly `len` bytes, or for between `len` and `2 * len`
    /// when a buffer the consumer has finished with is reused.
    pub(crate) fn take(&self, len: usize) -> BytesMut {
        if len >= MIN_POOLED {
            let mut inner = self.inner.lock();
            // Newest first: the buffer the consumer released last is the likeliest to still
            // be in cache, and the kernel's copy into a cached buffer is twice as fast.
            let found = inner
                .tracked
                .iter()
                .rposition(|b| (len..=2 * len).contains(&b.len()) && b.is_unique());
            if let Some(b) = found.and_then(|i| inner.tracked.remove(i)) {
                inner.bytes -= b.len();
                drop(inner);
                // Unique: nobody else can have cloned it since the check.
                if let Ok(mut buf) = b.try_into_mut() {
                    buf.clear();
                    if buf.capacity() >= len {
                        return buf;
                    }
                }
            }
        }
        BytesMut::with_capacity(len)
    }

    /// Remembers a block just handed to a consumer, to reuse its buffer once they drop it.
    pub(crate) fn track(&self, block: &Bytes) {
        if block.len() < MIN_POOLED {
            return;
        }
        let mut inner = self.inner.lock();
        inner.bytes += block.len();
        inner.tracked.push_back(block.clone());
        while inner.tracked.len() > MAX_ENTRIES || inner.bytes > MAX_BYTES {
            // Forgetting a block still in use frees nothing; an idle one is freed.
            match inner.tracked.pop_front() {
                Some(old) => inner.bytes -= old.len(),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn filled(pool: &BufferPool, len: usize, byte: u8) -> Bytes {
        let mut buf = pool.take(len);
        assert!(buf.is_empty() && buf.capacity() >= len);
        buf.put_bytes(byte, len);
        let block = buf.freeze();
        pool.track(&block);
        block
    }

    #[test]
    fn buffers_come_back_once_the_consumer_drops_them() {
        let pool = BufferPool::default();
        let a = filled(&pool, MIN_POOLED, 1);
        let a_ptr = a.as_ptr();
        // Still held by the consumer: a new buffer is allocated.
        let b = filled(&pool, MIN_POOLED, 2);
        assert_ne!(b.as_ptr(), a_ptr);
        assert!(
            a.iter().all(|&x| x == 1),
            "a live block is never overwritten"
        );
        drop(a);
        let c = filled(&pool, MIN_POOLED, 3);
        assert_eq!(c.as_ptr(), a_ptr, "the dropped buffer is reused");
        assert!(c.iter().all(|&x| x == 3));
        assert!(b.iter().all(|&x| x == 2));
    }

    #[test]
    fn sizes_must_be_close_and_small_blocks_are_not_pooled() {
        let pool = BufferPool::default();
        drop(filled(&pool, 4 * MIN_POOLED, 1));
        // Too large a buffer for this block: not reused.
        assert_eq!(pool.take(MIN_POOLED).capacity(), MIN_POOLED);
        drop(filled(&pool, 100, 1));
        assert_eq!(pool.inner.lock().tracked.len(), 1);
    }

    #[test]
    fn tracked_bytes_are_bounded() {
        let pool = BufferPool::default();
        let held: Vec<_> = (0..(MAX_BYTES / MIN_POOLED + 10))
            .map(|_| filled(&pool, MIN_POOLED, 0))
            .collect();
        let inner = pool.inner.lock();
        assert!(inner.bytes <= MAX_BYTES && inner.tracked.len() <= MAX_ENTRIES);
        assert_eq!(
            inner.bytes,
            inner.tracked.iter().map(Bytes::len).sum::<usize>()
        );
        drop(held);
    }
}

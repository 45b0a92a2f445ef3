//! Reused buffers for exported KV blocks. A SmolLM2 block is 737 KB: allocated fresh for every
//! export, each one came from the kernel zeroed and page by page, and export ran at the speed of
//! those page faults (1.3 GB/s against 3.1 GB/s into warm memory). An exported block is handed
//! out as [`Bytes`] that return their buffer here when the last reference drops (after the
//! socket took it), up to a bound on the bytes kept idle.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Idle buffers kept for export: at most `keep_bytes` of capacity.
#[derive(Debug)]
pub(crate) struct ExportBuffers {
    free: Mutex<Idle>,
    keep_bytes: usize,
}

#[derive(Debug, Default)]
struct Idle {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl ExportBuffers {
    /// A pool that keeps at most `keep_bytes` of idle capacity.
    pub fn new(keep_bytes: usize) -> Arc<ExportBuffers> {
        Arc::new(ExportBuffers {
            free: Mutex::new(Idle::default()),
            keep_bytes,
        })
    }

    /// An empty buffer with room for `len` bytes: an idle one if one is large enough.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut idle = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = idle.buffers.iter().rposition(|b| b.capacity() >= len) {
            let buf = idle.buffers.swap_remove(at);
            idle.bytes -= buf.capacity();
            return buf;
        }
        drop(idle);
        Vec::with_capacity(len)
    }

    /// `buf` as `Bytes` that give it back to `self` when the last of them drops.
    pub fn seal(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Lent {
            buf,
            home: Arc::clone(self),
        })
    }

    /// Keeps `buf` for a later export, if the bound allows.
    fn give_back(&self, mut buf: Vec<u8>) {
        let mut idle = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if idle.bytes + buf.capacity() <= self.keep_bytes {
            buf.clear();
            idle.bytes += buf.capacity();
            idle.buffers.push(buf);
        }
    }

    /// Capacity held idle now.
    #[cfg(test)]
    pub fn idle_bytes(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

/// An exported block's buffer, on loan from its pool.
struct Lent {
    buf: Vec<u8>,
    home: Arc<ExportBuffers>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.home.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_block_lends_its_buffer_to_the_next_export() {
        let pool = ExportBuffers::new(1 << 20);
        let mut buf = pool.take(1000);
        buf.extend_from_slice(&[7u8; 1000]);
        let first = buf.as_ptr();
        let block = pool.seal(buf);
        let copy = block.clone();
        drop(block);
        assert_eq!(pool.idle_bytes(), 0, "still referenced");
        assert_eq!(&copy[..3], &[7, 7, 7]);
        drop(copy);
        assert!(pool.idle_bytes() >= 1000);
        let again = pool.take(600);
        assert_eq!(again.as_ptr(), first, "the same memory");
        assert!(again.is_empty());
        assert_eq!(pool.idle_bytes(), 0);
        // Larger than any idle buffer: a new one.
        drop(pool.seal(again));
        assert!(pool.take(5000).capacity() >= 5000);
    }

    #[test]
    fn idle_capacity_stays_within_its_bound() {
        let pool = ExportBuffers::new(2500);
        let blocks: Vec<Bytes> = (0..4)
            .map(|_| {
                let mut b = pool.take(1000);
                b.resize(1000, 1);
                pool.seal(b)
            })
            .collect();
        drop(blocks);
        let idle = pool.idle_bytes();
        assert!((1000..=2500).contains(&idle), "{idle}");
    }
}

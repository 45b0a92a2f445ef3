//! One exported KV block: its bytes and the CRC-32 (IEEE) of them.
//!
//! The engine takes the checksum right after it copies a block out of its KV memory, while the
//! bytes are still in the core's cache (CRC-32 runs at about 25 GB/s on cached bytes here, 15
//! GB/s when they must come from memory, which is where a sender finds a block it is handed
//! later). The KV transfer then folds the transfer id and block index into that checksum
//! without reading the bytes again (`dolphin_kv_transfer::frame::block_checksum_of`), and the
//! receiver checks the bytes as they arrive. A block is checked end to end: from the engine's
//! export to the decode worker's import, not only across the socket.

use std::fmt;
use std::ops::Deref;

use bytes::Bytes;

/// The bytes of one exported KV block and their CRC-32.
#[derive(Clone, PartialEq, Eq)]
pub struct KvBlock {
    bytes: Bytes,
    crc: u32,
}

impl KvBlock {
    /// `bytes` with their checksum, computed here: call it where the bytes were just written.
    pub fn new(bytes: Bytes) -> Self {
        let crc = crc32fast::hash(&bytes);
        Self { bytes, crc }
    }

    /// The block's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The block's bytes, without the checksum.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// CRC-32 (IEEE, as `crc32fast::hash`) of [`bytes`](Self::bytes).
    pub fn crc(&self) -> u32 {
        self.crc
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the block holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl From<Bytes> for KvBlock {
    fn from(bytes: Bytes) -> Self {
        Self::new(bytes)
    }
}

impl From<Vec<u8>> for KvBlock {
    fn from(bytes: Vec<u8>) -> Self {
        Self::new(Bytes::from(bytes))
    }
}

impl From<&'static [u8]> for KvBlock {
    fn from(bytes: &'static [u8]) -> Self {
        Self::new(Bytes::from_static(bytes))
    }
}

impl Deref for KvBlock {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for KvBlock {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for KvBlock {
    // A block is up to megabytes: its length and checksum say which one it is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvBlock")
            .field("len", &self.bytes.len())
            .field("crc", &format_args!("{:08x}", self.crc))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_crc32_ieee() {
        // The standard check value of CRC-32/ISO-HDLC.
        let b = KvBlock::from(&b"123456789"[..]);
        assert_eq!(b.crc(), 0xcbf4_3926);
        assert_eq!(b.len(), 9);
        assert_eq!(KvBlock::from(Vec::new()).crc(), 0);
    }

    #[test]
    fn debug_names_length_and_checksum_not_bytes() {
        let b = KvBlock::from(vec![7u8; 1 << 20]);
        let s = format!("{b:?}");
        assert!(s.starts_with("KvBlock { len: 1048576, crc: "), "{s}");
        assert!(s.len() < 64, "{s}");
    }
}

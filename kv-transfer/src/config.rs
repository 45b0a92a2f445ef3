//! Transport settings shared by [`KvSender`](crate::KvSender) and [`KvReceiver`](crate::KvReceiver).

use std::time::Duration;

/// Timeouts and limits of the KV transport.
///
/// Both ends of a link should use the same values: the sender refuses blocks the receiver would
/// reject, and drops pooled connections before the receiver's idle timeout closes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferConfig {
    /// Longest wait for progress on one socket operation (connect, one read, one write) and for a
    /// consumer to take a block. A peer that stalls longer fails the transfer.
    pub io_timeout: Duration,
    /// Largest block payload accepted or sent, in bytes. Bounds what a peer can make the receiver
    /// allocate per connection.
    pub max_block_bytes: u32,
    /// Capacity of a slot's block channel. A full channel stops the receiver reading the socket,
    /// so a slow consumer slows the sender instead of growing memory.
    pub channel_blocks: usize,
    /// How long the receiver keeps a connection open with no transfer on it. The sender discards
    /// pooled connections idle for more than half of this, so it rarely meets a closed one.
    pub idle_timeout: Duration,
}

impl Default for TransferConfig {
    fn default() -> Self {
        Self {
            io_timeout: Duration::from_secs(10),
            // A 16-token block of a 72B model (320 KiB per token) is 5 MiB; leave headroom.
            max_block_bytes: 64 << 20,
            channel_blocks: 16,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

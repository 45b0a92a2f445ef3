//! Moving KV cache blocks from a prefill worker to a decode worker: over TCP everywhere, over
//! NCCL between GPUs (feature `nccl`, [`nccl`]); both behind [`KvTransport`].
//!
//! The decode worker runs a [`KvReceiver`] and announces each transfer it waits for with
//! [`KvReceiver::expect`]; the prefill worker pushes the blocks with [`KvSender::send`], which
//! returns once the receiver acknowledged that every block arrived intact. The wire format is
//! described in [`frame`].
//!
//! Guarantees:
//! - every payload is checksummed (CRC-32 over transfer id, index and bytes), from the
//!   checksum its exporter took ([`KvBlock`]) to the receiver's check of the bytes it read;
//! - a transfer id is delivered at most once; unknown or rejected transfers are drained and
//!   answered with an error ack, so the connection stays usable;
//! - memory is bounded: a block longer than `max_block_bytes` is refused before allocation, and
//!   blocks reach the decode worker through a bounded channel, so a slow consumer slows the
//!   sender's socket instead of queueing bytes;
//! - every connect, read and write has a progress timeout.

mod batch;
pub mod config;
pub mod error;
pub mod frame;
mod io;
mod link;
pub mod metrics;
#[cfg(feature = "nccl")]
pub mod nccl;
mod pool;
mod receiver;
mod sender;
mod serve;
mod slot;
mod transport;

pub use config::TransferConfig;
pub use dolphin_kv_block::KvBlock;
pub use error::TransferError;
pub use frame::AckCode;
pub use receiver::KvReceiver;
pub use sender::{KvSender, SendStats};
pub use slot::TransferSlot;
pub use transport::{KvTransport, SendFuture};

/// Identifies one transfer between a prefill and a decode worker (chosen by the decode worker).
pub type TransferId = u64;

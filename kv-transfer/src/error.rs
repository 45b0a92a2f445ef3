//! Errors of the KV transport, on both ends.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::TransferId;
use crate::frame::{AckCode, FrameError};

/// Why a transfer, a connection or a bind failed.
///
/// Cloneable (I/O causes are shared) because one failure is reported to the decode worker's
/// slot and to the connection's own log.
#[derive(Clone, Debug, thiserror::Error)]
pub enum TransferError {
    /// The receiver could not listen on its address.
    #[error("cannot bind KV receiver on {addr}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: Arc<io::Error>,
    },
    /// The sender could not reach the receiver.
    #[error("cannot connect to KV receiver at {target}")]
    Connect {
        /// Target as given to `send`.
        target: String,
        /// Cause (refused, unreachable, unresolvable).
        #[source]
        source: Arc<io::Error>,
    },
    /// The TLS configuration cannot serve or dial (no certificate, no CA).
    #[error("KV transport TLS configuration")]
    Tls(#[source] Arc<dolphin_tls::TlsError>),
    /// A socket operation made no progress within the configured time.
    #[error("KV transport timed out after {after:?} during {op}")]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// The limit that passed.
        after: Duration,
    },
    /// A socket operation failed.
    #[error("KV transport I/O error during {op}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Cause.
        #[source]
        source: Arc<io::Error>,
    },
    /// The peer closed the connection in the middle of a frame or before an answer.
    #[error("KV peer closed the connection during {op}")]
    Closed {
        /// What was being done.
        op: &'static str,
    },
    /// The peer sent bytes that are not a valid frame.
    #[error("malformed KV frame")]
    Frame(#[from] FrameError),
    /// The peer sent a valid frame that does not belong here (wrong transfer, order or count).
    #[error("unexpected KV frame in transfer {id}: {detail}")]
    UnexpectedFrame {
        /// Transfer being handled.
        id: TransferId,
        /// What was wrong.
        detail: &'static str,
    },
    /// The peer speaks another protocol version.
    #[error("KV protocol version mismatch: we speak {ours}, the peer {theirs}")]
    VersionMismatch {
        /// Our version.
        ours: u16,
        /// The peer's version.
        theirs: u16,
    },
    /// A block handed to `send` is larger than `max_block_bytes` (checked before connecting).
    #[error("block {index} has {len} bytes, over the limit of {max}")]
    BlockTooLarge {
        /// Position of the block in the transfer.
        index: usize,
        /// Its length.
        len: usize,
        /// The configured limit.
        max: u32,
    },
    /// More blocks than the frame format can count.
    #[error("{n} blocks do not fit in one transfer")]
    TooManyBlocks {
        /// Blocks handed to `send`.
        n: usize,
    },
    /// A block's checksum did not match its payload (receiver side).
    #[error("checksum mismatch in block {index} of transfer {id}")]
    ChecksumMismatch {
        /// Transfer.
        id: TransferId,
        /// Block index within the transfer.
        index: u32,
    },
    /// The sender announced a different number of blocks than `expect` was told.
    #[error("transfer {id}: expected {expected} blocks, the sender announced {announced}")]
    BlockCountMismatch {
        /// Transfer.
        id: TransferId,
        /// Blocks passed to `expect`.
        expected: u32,
        /// Blocks in the sender's begin frame.
        announced: u32,
    },
    /// The receiver answered the transfer with an error code (sender side).
    #[error("KV receiver refused transfer {id}: {code} (block {index})")]
    Refused {
        /// Transfer.
        id: TransferId,
        /// The receiver's reason.
        code: AckCode,
        /// Block the failure refers to, where it refers to one (else 0).
        index: u32,
    },
    /// `expect` was called again for the same id; this older slot gets nothing.
    #[error("transfer {id} was announced again; this slot is superseded")]
    Superseded {
        /// Transfer.
        id: TransferId,
    },
    /// The transfer ended before completing: its connection broke or the receiver shut down.
    #[error("transfer {id} aborted before completion")]
    Aborted {
        /// Transfer.
        id: TransferId,
    },
    /// A CUDA or NCCL call failed, or NCCL cannot run here (feature `nccl`).
    #[error("NCCL {op}: {detail}")]
    Nccl {
        /// What was being done.
        op: &'static str,
        /// The library's error.
        detail: String,
    },
    /// A streamed transfer's source stopped (the prefill failed or was cancelled) before it
    /// produced every block it announced; the connection is dropped, so the receiver sees the
    /// transfer break and never a short one.
    #[error("transfer {id}: its source ended after {sent} of {expected} blocks")]
    SourceEnded {
        /// Transfer.
        id: TransferId,
        /// Blocks sent.
        sent: u32,
        /// Blocks announced.
        expected: u32,
    },
}

impl TransferError {
    /// The failure's class as a metric label (a fixed set).
    pub fn cause(&self) -> &'static str {
        match self {
            Self::Bind { .. } => "bind",
            Self::Connect { .. } => "connect",
            Self::Tls(_) => "tls",
            Self::Timeout { .. } => "timeout",
            Self::Io { .. } => "io",
            Self::Closed { .. } => "closed",
            Self::Frame(_) | Self::UnexpectedFrame { .. } | Self::VersionMismatch { .. } => {
                "protocol"
            }
            Self::BlockTooLarge { .. } | Self::TooManyBlocks { .. } => "too_large",
            Self::ChecksumMismatch { .. } => "checksum",
            Self::BlockCountMismatch { .. } => "block_count",
            Self::Refused { .. } => "refused",
            Self::Superseded { .. } => "superseded",
            Self::Aborted { .. } => "aborted",
            Self::Nccl { .. } => "nccl",
            Self::SourceEnded { .. } => "source_ended",
        }
    }

    /// Wraps an I/O error from the operation `op`.
    pub(crate) fn io(op: &'static str, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::UnexpectedEof {
            Self::Closed { op }
        } else {
            Self::Io {
                op,
                source: Arc::new(source),
            }
        }
    }

    /// The code (and block index) a receiver answers with before closing a connection on this
    /// error, if any. Errors that leave the byte stream unusable but still let us speak get a
    /// code; I/O failures and timeouts get none (the peer is gone or stuck).
    pub(crate) fn fatal_ack(&self) -> Option<(AckCode, u32)> {
        match self {
            Self::Frame(FrameError::TooLarge { index, .. }) => {
                Some((AckCode::FrameTooLarge, *index))
            }
            Self::Frame(FrameError::TrailerTooLarge { .. }) => {
                Some((AckCode::FrameTooLarge, crate::frame::TRAILER_INDEX))
            }
            Self::Frame(_) | Self::UnexpectedFrame { .. } => Some((AckCode::Malformed, 0)),
            _ => None,
        }
    }

    /// Whether the sender may retry the transfer on a fresh connection: the failure was a broken
    /// socket, which a pooled connection closed by the receiver in the meantime also gives.
    pub(crate) fn is_broken_connection(&self) -> bool {
        matches!(self, Self::Io { .. } | Self::Closed { .. })
    }
}

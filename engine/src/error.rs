//! Engine errors.

use crate::types::SeqId;

/// Boxed cause of a backend failure (candle, CUDA, I/O, ...).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an engine call failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request can never be served as asked: empty prompt, `max_tokens` 0, a token outside
    /// the vocabulary, prompt plus `max_tokens` beyond the context or the pool, a duplicate
    /// request id, or a call that does not fit the sequence's state.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The waiting queue is full; retry later or elsewhere.
    #[error("waiting queue is full")]
    QueueFull,
    /// No live sequence has this id.
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    /// Imported KV bytes do not match what the block must hold (corrupt or misplaced).
    #[error("corrupt KV for sequence {seq}, block {index}: {detail}")]
    CorruptKv {
        /// The reservation.
        seq: SeqId,
        /// Block index relative to the first non-cached block.
        index: u32,
        /// What did not match.
        detail: String,
    },
    /// The request was cancelled before it produced a result.
    #[error("request cancelled")]
    Cancelled,
    /// The engine cannot start with this configuration.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The engine has stopped.
    #[error("engine shut down")]
    Shutdown,
    /// The model backend failed.
    #[error("backend failed")]
    Backend(#[source] BackendError),
}

/// Failure inside a [`crate::Backend`].
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Imported bytes are not what the block must hold.
    #[error("KV content mismatch: {0}")]
    Corrupt(String),
    /// A call the backend cannot honour (unknown sequence, wrong sizes).
    #[error("{0}")]
    Invalid(String),
    /// Compute failed.
    #[error("compute failed")]
    Compute(#[source] BoxError),
}

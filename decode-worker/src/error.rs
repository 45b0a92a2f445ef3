//! Why a decode worker could not start or stopped abnormally.

use dolphin_kv_transfer::TransferError;
use dolphin_worker_common::WorkerError;

/// Start-up and run failures of the decode worker.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A failure common to every worker.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The KV transfer listener could not be bound.
    #[error("cannot start the KV transfer listener")]
    KvListener(#[source] TransferError),
}

impl DecodeError {
    /// The process exit code: 64 for bad configuration, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Worker(err) => err.exit_code(),
            Self::KvListener(_) => 1,
        }
    }
}

impl From<dolphin_worker_common::ConfigError> for DecodeError {
    fn from(err: dolphin_worker_common::ConfigError) -> Self {
        Self::Worker(err.into())
    }
}

impl dolphin_worker_common::ExitStatus for DecodeError {
    fn exit_code(&self) -> u8 {
        DecodeError::exit_code(self)
    }
}

//! Why a workload could not be loaded or described.

use std::path::PathBuf;

/// Why a workload could not be loaded, or a workload or arrival string not understood.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A trace file could not be read.
    #[error("reading {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said (in the message, so it is not chained as a source as well).
        error: std::io::Error,
    },
    /// A row of a trace file is malformed.
    #[error("{}:{line}: {reason}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The row's line number, 1-based.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A bad `--workload` or `--arrivals` string.
    #[error("{0}")]
    Spec(String),
    /// A workload with no requests.
    #[error("no requests: {0}")]
    Empty(String),
}

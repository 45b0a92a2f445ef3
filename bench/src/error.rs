//! Errors of the benchmark helpers.

use std::path::PathBuf;

/// Why a benchmark helper failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file or pipe operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A release binary is not where the benchmark looks for it.
    #[error("binary {0} not found (build it: cargo build --release --bins)")]
    MissingBinary(PathBuf),
    /// A child process exited or closed stdout before printing its `DOLPHIN_READY` line.
    #[error("{name} did not become ready: {detail}")]
    NotReady {
        /// The process.
        name: String,
        /// What happened instead (see its log file).
        detail: String,
    },
    /// A `DOLPHIN_READY` line or a `/proc` file that does not parse.
    #[error("cannot parse {what}: {detail}")]
    Parse {
        /// What was parsed.
        what: String,
        /// Why it failed.
        detail: String,
    },
    /// A JSON value that cannot be encoded.
    #[error("cannot encode JSON")]
    Json(#[from] serde_json::Error),
    /// The benchmark's setup did not come up as expected.
    #[error("setup: {0}")]
    Setup(String),
    /// A simulator experiment could not run (learning, a table, the simulator).
    #[error("experiment: {0}")]
    Experiment(String),
    /// An HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(String),
    /// Starting, supervising or stopping a child process failed (dolphinctl's supervisor).
    #[error(transparent)]
    Process(#[from] dolphinctl::CtlError),
    /// A gRPC call failed (boxed: a status is large).
    #[error("gRPC {}: {}", .0.code(), .0.message())]
    Rpc(Box<tonic::Status>),
}

impl BenchError {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
        let what = what.into();
        move |source| BenchError::Io { what, source }
    }
}

//! The errors of dolphinctl's library: each says which process or endpoint failed and keeps the
//! cause, so `main` can print a useful chain.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::ready::ReadyParseError;

/// Everything dolphinctl's commands can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// A Dolphin binary is not where dolphinctl looks for it.
    #[error(
        "binary {} not found; build the binaries first (`cargo build --release --bins`) or pass --bin-dir",
        path.display()
    )]
    BinaryMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// `--engine candle`: the model file is not there.
    #[error(
        "model file {} not found; fetch SmolLM2 with scripts/fetch-model.sh or pass --model-path",
        path.display()
    )]
    ModelMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The log directory or a log file could not be created.
    #[error("cannot write logs under {}", path.display())]
    Log {
        /// The directory or file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The operating system refused to start a process.
    #[error("cannot start {name} ({})", program.display())]
    Spawn {
        /// Name of the process in dolphinctl's output.
        name: String,
        /// The program run.
        program: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A process exited before printing its readiness line.
    #[error("{name} exited before it was ready ({status}); its last output:\n{tail}")]
    ExitedBeforeReady {
        /// Name of the process.
        name: String,
        /// How it ended.
        status: ExitStatus,
        /// Its last lines of output.
        tail: String,
    },
    /// A process did not become ready in time.
    #[error("{name} printed no DOLPHIN_READY line within {timeout:?}; its last output:\n{tail}")]
    ReadyTimeout {
        /// Name of the process.
        name: String,
        /// How long dolphinctl waited.
        timeout: Duration,
        /// Its last lines of output.
        tail: String,
    },
    /// A readiness line was malformed.
    #[error("{name} printed a bad readiness line")]
    ReadyParse {
        /// Name of the process.
        name: String,
        /// The parse error.
        #[source]
        source: ReadyParseError,
    },
    /// The readiness line was already waited for.
    #[error("{name}'s readiness line was already consumed")]
    ReadyTaken {
        /// Name of the process.
        name: String,
    },
    /// A readiness line lacked an address dolphinctl needs.
    #[error("{name} announced no {field} in its DOLPHIN_READY line")]
    ReadyMissingField {
        /// Name of the process.
        name: String,
        /// The missing field.
        field: &'static str,
    },
    /// The router did not list every worker of the local cluster in time.
    #[error(
        "the router did not list all {expected} workers as live within {timeout:?} (last seen: {seen}); see the router's log"
    )]
    WorkersNotSeen {
        /// Workers started.
        expected: usize,
        /// How long dolphinctl waited.
        timeout: Duration,
        /// What the router last reported (or why asking failed).
        seen: String,
    },
    /// Waiting for a child or reading its output failed.
    #[error("lost track of {name}")]
    Wait {
        /// Name of the process.
        name: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Installing a signal handler failed.
    #[error("cannot install a signal handler")]
    Signal(#[source] std::io::Error),
    /// The router URL is not a valid endpoint.
    #[error("invalid router URL {url:?}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why tonic rejected it.
        #[source]
        source: tonic::transport::Error,
    },
    /// The TLS settings cannot work (files, or an `https://` URL without `--tls-ca`).
    #[error("TLS: {0}")]
    Tls(String),
    /// The router could not be reached.
    #[error("cannot connect to the router at {url}")]
    Connect {
        /// The URL dialled.
        url: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The router answered a call with an error status.
    #[error("the router rejected {call}: {}: {}", status.code(), status.message())]
    Rpc {
        /// The call ("ListWorkers", "Generate").
        call: &'static str,
        /// The status (boxed: it is large).
        status: Box<tonic::Status>,
    },
    /// A tables or classifier command failed (bad file, bad table, learning failed).
    #[error(transparent)]
    Tables(#[from] crate::tables::TablesError),
    /// A drained worker still ran requests when the wait was over.
    #[error("{worker} still runs {running} request(s) after {waited:?} of draining")]
    DrainTimeout {
        /// The worker's address.
        worker: String,
        /// Requests still running.
        running: u32,
        /// How long we waited.
        waited: std::time::Duration,
    },
    /// Writing the command's output failed (closed pipe, full disk).
    #[error("cannot write output")]
    Output(#[source] std::io::Error),
    /// A `dolphinctl handoff` command failed.
    #[error(transparent)]
    Handoff(Box<crate::handoff::HandoffError>),
}

impl CtlError {
    /// Wraps a gRPC status returned by `call`.
    pub fn rpc(call: &'static str, status: tonic::Status) -> Self {
        Self::Rpc {
            call,
            status: Box::new(status),
        }
    }
}

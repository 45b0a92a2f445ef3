//! What discovery tells the router, and how discovery fails.

use std::path::PathBuf;

use crate::worker::{WorkerId, WorkerRecord};

/// A change in cluster membership, as seen by the router.
///
/// `Up` is an upsert: it arrives for a new worker and again when a known worker re-registers or
/// changes its record. `Down` arrives once a worker has left (its record was deleted or its lease
/// expired).
#[derive(Clone, Debug, PartialEq)]
pub enum MembershipEvent {
    /// The worker is (still) live with this record.
    Up(WorkerRecord),
    /// The worker is gone.
    Down(WorkerId),
}

/// Why registration, watching or loading a static membership failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// An etcd request failed (unreachable, refused, lease not found...).
    #[error("etcd request failed")]
    Etcd(#[from] etcd_client::Error),
    /// An etcd request got no answer in time (etcd down or partitioned).
    #[error("etcd did not answer `{op}` in time")]
    Timeout {
        /// The request that timed out.
        op: &'static str,
    },
    /// Another live process holds this worker's key: two workers share one id.
    #[error("worker key {key} is already registered by another process")]
    AlreadyRegistered {
        /// The contested etcd key.
        key: String,
    },
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file or etcd value is not the expected JSON.
    #[error("cannot parse {what}")]
    Parse {
        /// What was being parsed: a path or an etcd key.
        what: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A static membership names the same worker twice.
    #[error("worker id {0} appears more than once")]
    DuplicateWorker(WorkerId),
    /// The configuration cannot work (no endpoints, non-positive TTL...).
    #[error("invalid discovery configuration: {0}")]
    InvalidConfig(String),
}

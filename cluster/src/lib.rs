//! Shared vocabulary of a Dolphin cluster: worker ids and roles, chained block hashing, etcd and
//! static discovery, telemetry.
//!
//! The router and both worker kinds depend on this crate, so everything here is the single
//! definition of a cluster-wide fact: how a prompt's blocks are hashed, where a worker is
//! registered in etcd, what a worker record looks like.

pub mod advertise;
mod backoff;
pub mod block_hash;
pub mod block_map;
pub mod discovery;
pub mod etcd;
pub mod hash_map;
pub mod hot_metrics;
pub mod keys;
pub mod layers;
pub mod otel;
pub mod prefetch;
pub mod signal;
pub mod static_discovery;
pub mod telemetry;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod worker;

/// Hash of one full KV block, chained over every block before it (see [`block_hash`]).
pub type BlockHash = u64;

/// `err: cause: cause...` on one line, so a log line, a gRPC status or a CLI error keeps what
/// `#[source]` chains carry.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Tokens per KV block unless a worker is configured otherwise.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

pub use advertise::{Advertise, AdvertiseError, advertised};
pub use block_hash::{
    BlockHashes, ROOT_SEED, block_hashes, block_hashes_from, block_hashes_into, chain_hash,
    chain_hash_from, salted_root,
};
pub use block_map::BlockMap;
pub use discovery::{DiscoveryError, MembershipEvent};
pub use etcd::{EtcdConfig, EtcdTls, Registration, watch_workers};
pub use hash_map::{BlockHashBuild, BlockHashHasher, BlockHashMap};
pub use keys::{responses_prefix, tables_prefix, worker_key, workers_prefix};
pub use static_discovery::{load_static_file, static_workers};
pub use telemetry::{
    init_metrics, init_tracing, nodelay_incoming, serve_metrics, serve_metrics_on,
};
pub use worker::{BUILD_VERSION, KvCompat, KvMismatch, Role, UnknownRole, WorkerId, WorkerRecord};

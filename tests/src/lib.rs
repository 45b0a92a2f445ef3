//! End-to-end test harness for Dolphin: start etcd (`dolphin-cluster`'s `test-util` helper) and
//! the real binaries (from the cargo target
//! dir), talk to them over gRPC and HTTP, and kill everything when a test ends. On failure every
//! process's output is printed.
//!
//! The binaries must be built first: `cargo build --workspace --bins` (scripts/test.sh does it).

pub mod binaries;
pub mod cluster;
pub mod grpc;
pub mod http;
pub mod netns;
pub mod wait;

pub use cluster::{ClusterConfig, Node, TestCluster};
pub use dolphin_cluster::testing::EtcdServer;

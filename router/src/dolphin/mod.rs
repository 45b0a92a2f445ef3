//! DolphinRouting (DESIGN.md sections 1 and 7): local or remote prefill read from a learned,
//! clustered one-bit table, per P/D split.
//!
//! Per request: the [`admission`] sketch feeds the output-length [`classifier`], whose class's
//! representative length completes the four features; [`routing::DolphinRouting`] finds the
//! table of the live [`split`], standardizes the features and reads the bit of their cluster
//! ([`assign`]). Tables ([`table`]) and the classifier live in a [`store`] (etcd, or memory
//! without etcd) and are hot-swapped. Workers whose event stream is down are estimated with the
//! [`approx`] index. Everything on the request path is allocation-free and lock-light; training
//! lives offline in the `dolphin-learn` crate.

pub mod admin;
pub mod admission;
pub mod approx;
pub mod assign;
pub mod classifier;
pub mod online;
pub mod online_service;
pub mod routing;
pub mod split;
pub mod store;
pub mod store_etcd;
pub mod table;
pub mod trust;

pub use admission::Admission;
pub use assign::CompiledTable;
pub use classifier::{OutputClassifier, OutputPrediction};
pub use online::{Explorer, OnlineConfig, OnlineLearner};
pub use routing::{DolphinRouting, LoadedTable};
pub use split::Split;
pub use store::{MemoryStore, StoreError, StoreSnapshot, TableStore};
pub use store_etcd::EtcdStore;
pub use table::{Reward, RoutingTable, TableError};
pub use trust::{ClusterEvidence, Distrust, TrustConfig};

#[cfg(test)]
mod tests;

#![warn(missing_docs)]
//! Dolphin's cluster simulator: a discrete-event simulation of a prefill/decode-disaggregated
//! cluster that reuses the real code (DESIGN.md sections 1, 6 and 8).
//!
//! - Routing is the router's: worker selection, the four features, the output classifier, the
//!   policies and compiled routing tables (`cluster.rs`). Which worker caches how much of a
//!   prompt is read from the pools themselves, which is what the router's
//!   [`PrefixIndex`](dolphin_router::prefix_index::PrefixIndex) holds when every cache event
//!   reaches it at once, as here ([`PrefixLookup`]; the index itself is one setting away).
//! - Every worker is the engine's scheduling policy over the engine's own
//!   [`KvPool`](dolphin_engine::KvPool) (prefix cache with LRU eviction), timed by a
//!   [`SimProfile`](dolphin_engine::SimProfile): continuous batching with chunked prefill, where
//!   a mixed step costs prefill plus decode time (`worker.rs`).
//! - Remote prefill adds the prefill worker's queue and compute and the KV transfer
//!   (`bytes per token x uncached tokens / link bandwidth`).
//! - Workloads come from `dolphin_workload` ([`SimRequest::from_workload`]); [`SimCluster::run`]
//!   replays them at their arrival times, [`SimCluster::run_closed`] in closed loop (a fixed
//!   number in flight); [`SimReport::outcomes`] turns a run into the
//!   [`RequestOutcome`](dolphin_workload::RequestOutcome)s a live replay produces, for
//!   `dolphin_workload::Summary::of`.
//!
//! ```no_run
//! use dolphin_engine::SimProfile;
//! use dolphin_sim::{SimCluster, SimClusterConfig, SimRequest, Slo};
//!
//! let profile = SimProfile::builtin("qwen72b-h20").expect("shipped profile");
//! let mut sim = SimCluster::new(SimClusterConfig::new(1, 1, profile)).expect("valid");
//! let tokens: Vec<u32> = (0..4096).collect();
//! let req = SimRequest::from_tokens(0.0, &tokens, 128, Slo::new(5000.0, 250.0), 16);
//! let report = sim.run(&[req]).expect("fits");
//! println!("TTFT {} ms, attainment {}", report.ttft.p50, report.attainment);
//! ```
//!
//! The router sees load as the live one does: every worker reports it every
//! `load_interval_ms` (100 ms, the router's default), and between reports the router adds only
//! its own count of prompts in flight on decode workers (it keeps none for prefill workers).
//!
//! Simplifications, each small against the timings modelled: KV transfers do not contend for
//! the link; blocks of generated tokens are not cached (there is no token content to hash);
//! queues are not bounded (no request is refused with `QueueFull`).
//!
//! One run is single-threaded and deterministic for a given seed; the event queue is a binary
//! heap of small `Copy` events, and workers reuse their sequence slots and block tables, so the
//! steady state allocates nothing (with [`PrefixLookup::RouterIndex`], the pools' cache-event
//! vectors).

mod cluster;
mod config;
mod event;
mod report;
mod request;
mod source;
mod worker;

pub use cluster::SimCluster;
pub use config::{
    DEFAULT_LOAD_INTERVAL_MS, PrefixLookup, SchedulerModel, SimClusterConfig, SimError,
};
pub use dolphin_workload::{RequestKind, Slo};
pub use report::{ClusterAttainment, FlipRecord, OnlineRun, Percentiles, RequestRecord, SimReport};
pub use request::SimRequest;

#[cfg(test)]
mod tests;

#![warn(missing_docs)]
//! Workloads for Dolphin's replay, table learning and simulator (DESIGN.md sections 1 and 8),
//! and the summary every replay reports, whatever it ran on.
//!
//! - A [`Workload`] is a list of [`WorkloadRequest`]s. A prompt is described by **hash ids**, as
//!   in the Mooncake trace: id `i` stands for [`Workload::tokens_per_id`] tokens of content, so
//!   two prompts that share a leading run of ids share that prefix. [`Workload::prompt_tokens`]
//!   expands a prompt into token ids deterministically (the same id always gives the same
//!   tokens); the simulator hashes ids directly without expanding them.
//! - Sources: the Mooncake JSONL and Azure CSV traces ([`trace`]) and synthetic mixes modelled
//!   on the DolphinRouting paper's workloads ([`synthetic`]).
//! - Arrivals ([`Arrivals`]): the trace's timestamps (time-scaled), Poisson at a rate, or
//!   closed-loop at a concurrency (saturated load).
//! - [`Summary`]: P50/P90/P99 of TTFT, TPOT and e2e, SLO attainment overall, per routing-table
//!   cluster and per request kind, and throughput, computed from [`RequestOutcome`]s.

mod arrival;
mod error;
mod expand;
mod outcome;
mod request;
mod spec;
pub mod stats;
mod summary;
pub mod synthetic;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod trace;

pub use arrival::Arrivals;
pub use error::WorkloadError;
pub use expand::expand_prompt;
pub use outcome::{RequestOutcome, Slo, cluster_json as outcome_cluster_json};
pub use request::{RequestKind, Workload, WorkloadRequest};
pub use spec::{WorkloadSource, WorkloadSpec};
pub use summary::{ClusterAttainment, KindSummary, Percentiles, Summary};

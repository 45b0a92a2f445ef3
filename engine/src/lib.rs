#![warn(missing_docs)]
//! Dolphin's model runtime: scheduler with continuous batching and chunked prefill, paged KV
//! pool with prefix cache, simulated and real backends.
//!
//! Workers hold an `Arc<dyn Engine>`. [`Scheduler`] implements it over any [`Backend`] (the
//! model-specific compute); [`sim::sim_engine`] builds one over the simulated backend.

mod backend;
mod engine;
mod error;
pub mod kv_pool;
mod scheduler;
pub mod sim;
mod types;

pub use backend::{Backend, BackendInfo, Batch, BatchEntry, ImportBlock, SeqStart};
pub use engine::Engine;
pub use error::{BackendError, BoxError, EngineError};
pub use kv_pool::KvPool;
pub use scheduler::{Scheduler, SchedulerConfig};
pub use sim::{SimConfig, SimProfile, sim_engine};
pub use types::{
    BlockId, EngineInfo, FinishReason, KvEvent, LoadSnapshot, OutputStream, PrefillOutput,
    Reservation, Sampling, SeqId, SeqOutput, SeqRequest, SeqUsage,
};

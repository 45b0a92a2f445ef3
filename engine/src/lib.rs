#![warn(missing_docs)]
//! Dolphin's model runtime: scheduler with continuous batching and chunked prefill, paged KV
//! pool with prefix cache, simulated and real backends.
//!
//! Workers hold an `Arc<dyn Engine>`. [`Scheduler`] implements it over any [`Backend`] (the
//! model-specific compute); [`sim::sim_engine`] builds one over the simulated backend, and
//! `candle::candle_engine` (cargo feature `candle`) one over a real llama model.

mod backend;
#[cfg(feature = "candle")]
pub mod candle;
mod drive;
mod engine;
mod error;
pub mod kv_pool;
pub mod metrics;
pub mod profile_fit;
mod scheduler;
pub mod sim;
mod types;

pub use backend::{Backend, Batch, BatchEntry, ImportBlock, KvBlocks, SeqStart};
#[cfg(feature = "candle")]
pub use candle::{CandleConfig, candle_backend, candle_engine};
pub use dolphin_kv_block::KvBlock;
pub use drive::{DriveStart, DrivenEnd, DrivenToken, SeqDriver, Steer};
pub use engine::Engine;
pub use error::{BackendError, BoxError, EngineError};
pub use kv_pool::KvPool;
pub use scheduler::policy;
pub use scheduler::{
    BatchWait, LinkModel, Lockstep, Scheduler, SchedulerConfig, SchedulingPolicy, StepProfile,
};
pub use sim::{SimConfig, SimProfile, sim_backend, sim_engine};
pub use types::{
    BlockId, EngineInfo, FinishReason, Format, Generated, HandoffChoice, KvEvent, LoadSnapshot,
    LogitRules, MAX_TOP_LOGPROBS, ModelTokens, OutputStream, PrefillOutput, Reservation, Sampled,
    Sampling, SeqId, SeqOutput, SeqRequest, SeqUsage, TokenLogprobs, TokenStats,
};

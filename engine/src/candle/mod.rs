//! The real-model engine: llama-architecture GGUF models (SmolLM2 and kin) on candle's tensor
//! ops, under the shared scheduler and KV pool.
//!
//! - `model`: our own llama forward pass over a ragged batch (all sequences' new tokens in one
//!   activation for the linear layers, attention per sequence), so the KV layout is ours.
//! - `kv_store`: the paged KV memory behind the pool's block ids, and the block export format.
//! - `attention`: per-sequence attention over paged KV (a deterministic CPU kernel; tensor ops
//!   on other devices).
//! - `weights`: loading, re-quantization (Q8_0 by default) and padding for candle's fast kernels.
//! - `sampler`: greedy, temperature, top-k, top-p, seeded.
//! - [`configure_threads`]: compute threads (`threads` setting or `DOLPHIN_THREADS`).
//!
//! The scheduler's loop runs model steps inline on its own task (without holding the scheduler's
//! lock, so requests and imports are served meanwhile): [`candle_engine`] therefore gives it a
//! dedicated thread rather than a Tokio worker. Loading takes seconds (call it from
//! `spawn_blocking` or before starting the runtime).

mod attention;
mod backend;
mod config;
mod error;
mod export_buffers;
mod kv_store;
mod linear;
mod model;
mod params;
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod q4;
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod q8;
mod sampler;
mod threads;
mod vocab;
mod weights;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use backend::{CandleBackend, CandleBlocks};
pub use config::{
    CandleConfig, DEFAULT_KV_BYTES, DeviceKind, MatmulKernel, Padding, ParseConfigError,
    WeightFormat,
};
pub use error::LoadError;
pub use params::LlamaParams;
pub use threads::{DEFAULT_THREADS, THREADS_ENV, configure_threads};
pub use vocab::token_space_of;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::scheduler::{Scheduler, SchedulerConfig};

/// Loads the model and starts a scheduler over it on a dedicated thread.
pub fn candle_engine(cfg: CandleConfig) -> Result<Arc<dyn Engine>, EngineError> {
    Ok(candle_scheduler(cfg)?)
}

/// Like [`candle_engine`], keeping the concrete type.
pub fn candle_scheduler(cfg: CandleConfig) -> Result<Arc<Scheduler<CandleBackend>>, EngineError> {
    let backend = candle_backend(&cfg)?;
    let sched = SchedulerConfig {
        max_batched_tokens: cfg.max_batched_tokens,
        prefill_chunk_tokens: cfg.prefill_chunk_tokens,
        mixed_prefill_tokens: cfg.mixed_prefill_tokens,
        max_waiting: cfg.max_waiting,
        policy: cfg.policy,
        ..SchedulerConfig::default()
    };
    // Scheduler::spawn uses the current Tokio runtime when there is one; called from a fresh
    // thread it starts its own: model steps then never block the caller's runtime workers.
    std::thread::scope(|s| {
        s.spawn(move || Scheduler::spawn(backend, sched))
            .join()
            .unwrap_or_else(|_| Err(EngineError::Config("scheduler start panicked".into())))
    })
}

/// Sets the compute threads and loads the model of `cfg`: the backend alone, without a
/// scheduler (to drive step by step, as [`crate::profile_fit::measure`] does).
pub fn candle_backend(cfg: &CandleConfig) -> Result<CandleBackend, EngineError> {
    let threads = configure_threads(cfg.threads)?;
    let backend = CandleBackend::load(cfg)
        .map_err(|e| EngineError::Config(dolphin_cluster::error_chain(&e)))?;
    tracing::info!(threads, "candle engine starting");
    Ok(backend)
}

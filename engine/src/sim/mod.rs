//! The simulated engine: the real scheduler and KV pool over [`SimBackend`], whose step times
//! come from a [`SimProfile`] and whose KV bytes and tokens are deterministic (see `content`).

mod backend;
pub mod content;
mod profile;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use backend::{SimBackend, SimBlocks};
pub use profile::{DecodeCost, PrefillCost, ProfileError, SimProfile, line_time};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::scheduler::{LinkModel, Scheduler, SchedulerConfig};
use crate::types::EngineInfo;

/// Everything a simulated engine is made of.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Timing and KV size.
    pub profile: SimProfile,
    /// Served model name.
    pub model: String,
    /// Multiplies step durations; 0 = no delay at all.
    pub time_scale: f64,
    /// Multiplies the profile's KV bytes per token for what is exported and moved (at least 1
    /// byte per token).
    pub byte_scale: f64,
    /// Blocks in the pool.
    pub total_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Tokens per step.
    pub max_batched_tokens: u32,
    /// Most prefill tokens of one sequence per step (0: no cap); the profile's by default.
    pub prefill_chunk_tokens: u32,
    /// Most prefill tokens in a step that also decodes (0: no cap); the profile's by default.
    pub mixed_prefill_tokens: u32,
    /// Requests that may wait for admission.
    pub max_waiting: u32,
    /// The order requests are admitted and prefilled in.
    pub policy: crate::SchedulingPolicy,
    /// Token ids are below this (at least 4: ids 0..=2 are special, 3.. printable).
    pub vocab_size: u32,
    /// Longest prompt plus output.
    pub context_length: u32,
}

impl SimConfig {
    /// Defaults around `profile`: real time, 1/1000 of the bytes, 8192 blocks of 16 tokens,
    /// 2048 tokens per step, 256 waiting, the router's sim tokenizer's 355 ids (so any text it
    /// tokenizes is accepted; generated tokens stay printable), 32k context.
    pub fn new(profile: SimProfile) -> Self {
        Self {
            prefill_chunk_tokens: profile.prefill_chunk_tokens,
            mixed_prefill_tokens: profile.mixed_prefill_tokens,
            profile,
            model: "sim-model".into(),
            time_scale: 1.0,
            byte_scale: 0.001,
            total_blocks: 8192,
            block_size: dolphin_cluster::DEFAULT_BLOCK_SIZE as u32,
            max_batched_tokens: 2048,
            max_waiting: 256,
            policy: crate::SchedulingPolicy::Fcfs,
            vocab_size: 355,
            context_length: 32768,
        }
    }

    /// KV bytes per token as exported: the profile's, scaled, at least 1.
    pub fn wire_bytes_per_token(&self) -> u64 {
        ((self.profile.kv_bytes_per_token as f64 * self.byte_scale).round() as u64).max(1)
    }

    fn validate(&self) -> Result<(), EngineError> {
        let bad = |msg: &str| Err(EngineError::Config(msg.to_string()));
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return bad("time_scale must be finite and not negative");
        }
        if !(self.byte_scale.is_finite() && self.byte_scale > 0.0) {
            return bad("byte_scale must be finite and positive");
        }
        if self.vocab_size < 4 {
            return bad("vocab_size must be at least 4");
        }
        if self.context_length == 0 {
            return bad("context_length must be at least 1");
        }
        Ok(())
    }
}

/// Builds the sim backend and starts a scheduler over it (on the current Tokio runtime, or a
/// dedicated thread when there is none).
pub fn sim_engine(cfg: SimConfig) -> Result<Arc<dyn Engine>, EngineError> {
    Ok(sim_scheduler(cfg)?)
}

/// Like [`sim_engine`], keeping the concrete type.
pub fn sim_scheduler(cfg: SimConfig) -> Result<Arc<Scheduler<SimBackend>>, EngineError> {
    let backend = sim_backend(&cfg)?;
    // Imported KV is charged the profile's bytes over the profile's link, as the simulator
    // charges it: the scaled-down bytes that really cross would cost almost nothing.
    let link = (cfg.time_scale > 0.0).then_some(LinkModel {
        bytes_per_token: cfg.profile.kv_bytes_per_token,
        gbps: cfg.profile.link_gbps,
        time_scale: cfg.time_scale,
    });
    let sched = SchedulerConfig {
        max_batched_tokens: cfg.max_batched_tokens,
        prefill_chunk_tokens: cfg.prefill_chunk_tokens,
        mixed_prefill_tokens: cfg.mixed_prefill_tokens,
        max_waiting: cfg.max_waiting,
        policy: cfg.policy,
        link,
        ..SchedulerConfig::default()
    };
    Scheduler::spawn(backend, sched)
}

/// The sim backend alone, without a scheduler (to drive step by step, as
/// [`crate::profile_fit::measure`] does).
pub fn sim_backend(cfg: &SimConfig) -> Result<SimBackend, EngineError> {
    cfg.validate()?;
    let info = EngineInfo {
        model: cfg.model.clone(),
        engine: "sim",
        block_size: cfg.block_size,
        total_blocks: cfg.total_blocks,
        kv_bytes_per_token: cfg.wire_bytes_per_token(),
        kv_layout: format!("sim/bytes_per_token={}", cfg.wire_bytes_per_token()),
        context_length: cfg.context_length,
        vocab_size: cfg.vocab_size,
        eos_token_id: Some(content::EOS_TOKEN),
        step_limits: None,
    };
    Ok(SimBackend::new(info, cfg.profile.clone(), cfg.time_scale))
}

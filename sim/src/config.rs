//! The simulated cluster's configuration and its validation.

use dolphin_engine::SimProfile;
use dolphin_engine::policy::StepLimits;
use dolphin_router::dolphin::{CompiledTable, OutputClassifier};
use dolphin_router::policy::Policy;
use dolphin_router::prefix_index::MAX_POOL_WORKERS;

use crate::request::SimRequest;

/// The router's default load report interval (`--load-interval-ms`), ms.
pub const DEFAULT_LOAD_INTERVAL_MS: f64 = 100.0;

/// Why a cluster cannot be simulated.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A configuration value is out of range.
    #[error("invalid simulator configuration: {0}")]
    Config(String),
    /// A request can never run on this cluster.
    #[error("request {index}: {reason}")]
    Request {
        /// Position of the request in the input.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// Whose scheduling the simulated engines follow, where the engines differ. Both find a
/// prompt's prefix-cache hit at admission and again before its first chunk, and cache blocks as
/// they are scheduled, so a prompt scheduled after another in the same step shares the prefix
/// that one computes (vLLM's scheduling, and Dolphin's engine's since it does the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulerModel {
    /// Dolphin's engine: an idle engine starts a step on the first request that arrives.
    #[default]
    Dolphin,
    /// vLLM's, as Dynamo's mocker replays a trace: requests that arrive at one instant enter
    /// the same step.
    Vllm,
}

/// Where the simulated router reads how much of a prompt each worker caches. Every cache event
/// reaches the router's index the instant it happens here, so the index always holds exactly
/// what the pools cache, and both answer every lookup alike (a test pins it); they differ in
/// cost only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefixLookup {
    /// Each pool is asked directly: no index to keep, so a block stored or evicted costs one
    /// map operation instead of two (the index's upkeep was a quarter of a large run's time),
    /// and a lookup walks each holding worker's map instead of one shared one. The simulator
    /// also uses what it knows of the whole workload: a prompt block no other request shares
    /// can never be found, so it is cached without entering its pool's map
    /// (`KvPool::commit_many_unindexed`) and no lookup walks that far.
    #[default]
    Pools,
    /// The router's own [`PrefixIndex`](dolphin_router::prefix_index::PrefixIndex) per pool,
    /// fed by the workers' cache events, as the live router keeps it; every block is findable,
    /// as in the engine (the reference the fast path is checked against).
    RouterIndex,
}

/// Everything a simulated cluster is made of.
#[derive(Clone, Debug)]
pub struct SimClusterConfig {
    /// Prefill workers.
    pub prefill: u32,
    /// Decode workers (at least 1).
    pub decode: u32,
    /// Step timing and KV bytes per token of every worker.
    pub profile: SimProfile,
    /// Tokens per KV block (the engines' and the router's block size).
    pub block_size: u32,
    /// KV blocks per worker.
    pub total_blocks: u32,
    /// Tokens per engine step (decode tokens plus prefill chunk tokens).
    pub max_batched_tokens: u32,
    /// Most prefill tokens of one sequence per step (0: no cap); the profile's by default.
    pub prefill_chunk_tokens: u32,
    /// Most prefill tokens in a step that also decodes (0: no cap); the profile's by default.
    pub mixed_prefill_tokens: u32,
    /// Bandwidth of the prefill -> decode link, Gb/s (the profile's by default).
    pub link_gbps: f64,
    /// Weight of uncached blocks against load in worker selection (the router's default is 1).
    pub overlap_weight: f64,
    /// How often every worker reports its load to the router, ms (the router's
    /// `--load-interval-ms`, 100 by default). Between reports the router knows a worker's load
    /// only from its latest report, plus, on decode workers, the prompts it sent there itself.
    /// 0: the router sees every change at once.
    pub load_interval_ms: f64,
    /// The prefill policy. `Policy::Dolphin` reads `table` (its fallback decides without one).
    pub policy: Policy,
    /// A routing table: decides under `Policy::Dolphin`, and under any policy names each
    /// request's cluster in the records (for per-cluster attainment).
    pub table: Option<CompiledTable>,
    /// The output-length classifier (the fourth feature).
    pub classifier: OutputClassifier,
    /// Seed of the tie-breaking random generator in worker selection.
    pub seed: u64,
    /// Whose scheduling the engines follow (Dolphin's engine's by default).
    pub scheduler: SchedulerModel,
    /// Where the router reads the workers' cached prefixes (the pools themselves by default).
    pub prefix_lookup: PrefixLookup,
}

impl SimClusterConfig {
    /// A cluster of `prefill` + `decode` workers timed by `profile`, with the engine's defaults
    /// (blocks of 16 tokens, 8192 blocks, 2048 tokens per step), the profile's link, the
    /// router's overlap weight 1 and load reports every 100 ms, the prior classifier,
    /// always-local.
    pub fn new(prefill: u32, decode: u32, profile: SimProfile) -> Self {
        SimClusterConfig {
            prefill,
            decode,
            link_gbps: profile.link_gbps,
            prefill_chunk_tokens: profile.prefill_chunk_tokens,
            mixed_prefill_tokens: profile.mixed_prefill_tokens,
            profile,
            block_size: dolphin_cluster::DEFAULT_BLOCK_SIZE as u32,
            total_blocks: 8192,
            max_batched_tokens: 2048,
            overlap_weight: 1.0,
            load_interval_ms: DEFAULT_LOAD_INTERVAL_MS,
            policy: Policy::AlwaysLocal,
            table: None,
            classifier: OutputClassifier::prior(),
            seed: 1,
            scheduler: SchedulerModel::Dolphin,
            prefix_lookup: PrefixLookup::Pools,
        }
    }

    /// The engines' step limits.
    pub(crate) fn step_limits(&self) -> StepLimits {
        StepLimits {
            max_batched_tokens: self.max_batched_tokens,
            prefill_chunk_tokens: self.prefill_chunk_tokens,
            mixed_prefill_tokens: self.mixed_prefill_tokens,
        }
    }

    /// KV blocks that hold `tokens` tokens.
    pub(crate) fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.block_size))
    }

    pub(crate) fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Config(m));
        if self.decode == 0 {
            return bad("at least one decode worker is needed".into());
        }
        let most = MAX_POOL_WORKERS as u32;
        if self.prefill > most || self.decode > most {
            return bad(format!("at most {most} workers per pool"));
        }
        if self.block_size == 0 || self.total_blocks == 0 || self.max_batched_tokens == 0 {
            return bad(
                "block_size, total_blocks and max_batched_tokens must be at least 1".into(),
            );
        }
        if !(self.link_gbps.is_finite() && self.link_gbps > 0.0) {
            return bad(format!(
                "link_gbps must be positive, got {}",
                self.link_gbps
            ));
        }
        if !(self.load_interval_ms.is_finite() && self.load_interval_ms >= 0.0) {
            return bad(format!(
                "load_interval_ms must be finite and not negative, got {}",
                self.load_interval_ms
            ));
        }
        if !(self.overlap_weight.is_finite() && self.overlap_weight >= 0.0) {
            return bad(format!(
                "overlap_weight must be finite and not negative, got {}",
                self.overlap_weight
            ));
        }
        Ok(())
    }

    /// Refuses requests that could never run here: empty prompt or output, more block hashes
    /// than full blocks, more KV than a worker holds, or (when `arrivals` is set: open-loop
    /// runs) an arrival time that is not a finite time from 0.
    pub(crate) fn check_requests(
        &self,
        reqs: &[SimRequest],
        arrivals: bool,
    ) -> Result<(), SimError> {
        for (index, r) in reqs.iter().enumerate() {
            let bad = |reason: String| Err(SimError::Request { index, reason });
            if r.prompt_len == 0 || r.output_len == 0 {
                return bad("prompt and output need at least one token".into());
            }
            if r.hashes.len() as u32 > r.prompt_len / self.block_size {
                return bad("more block hashes than full blocks in the prompt".into());
            }
            let need = self.blocks_for(u64::from(r.prompt_len) + u64::from(r.output_len) - 1);
            if need > u64::from(self.total_blocks) {
                return bad(format!(
                    "needs {need} KV blocks, a worker has {}",
                    self.total_blocks
                ));
            }
            if arrivals && !(r.arrival_ms.is_finite() && r.arrival_ms >= 0.0) {
                return bad(format!("arrival {} ms is not a time", r.arrival_ms));
            }
        }
        Ok(())
    }
}

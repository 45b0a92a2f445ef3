//! The routing benchmark's workload: long prompts, and what every worker of both pools holds in
//! its prefix cache.
//!
//! The prompts share a system prefix that every worker has cached (as in a deployment where one
//! system prompt fronts all traffic). Beyond it, each prompt is partly cached on a few workers of
//! each pool, to a random depth, as if earlier turns of the same conversation had run there.
//! Every worker also holds many unrelated blocks (chains of other prompts), so the index is as
//! large as a busy pool's. Loads differ per worker so selection weighs cache against load.
//! Everything derives from one seed: runs are repeatable.

use std::collections::HashSet;

use dolphin_cluster::{BlockHash, block_hashes};
use rand::rngs::SmallRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Token ids the sim tokenizer gives printable text (what real prompts look like to it).
const TOKEN_RANGE: std::ops::RangeInclusive<u32> = 3..=98;

/// Shape of the workload.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadConfig {
    /// Tokens per prompt.
    pub prompt_tokens: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Workers in each pool.
    pub workers_per_pool: usize,
    /// Distinct prompts the benchmark cycles through.
    pub prompts: usize,
    /// Leading tokens all prompts share and every worker holds.
    pub shared_prefix_tokens: usize,
    /// Most workers per pool holding a deeper prefix of one prompt (0..=this, uniformly).
    pub max_holders_per_prompt: usize,
    /// Blocks of unrelated prompts in each pool, spread evenly over its workers.
    pub unrelated_blocks_per_pool: usize,
    /// Seed of everything random.
    pub seed: u64,
}

/// The command-line settings both decision benchmarks (`routing_decision`, `dolphin_decision`)
/// take: how long to time, and the workload's size.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct DecisionArgs {
    /// Timed decisions per policy (per stage, where stages are timed).
    #[arg(long, default_value_t = 100_000)]
    pub iterations: usize,
    /// Untimed decisions before timing.
    #[arg(long, default_value_t = 10_000)]
    pub warmup: usize,
    /// Tokens per prompt.
    #[arg(long, default_value_t = 8192)]
    pub prompt_tokens: usize,
    /// Workers per pool.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Distinct prompts cycled through.
    #[arg(long, default_value_t = 64)]
    pub prompts: usize,
    /// Unrelated cached blocks per pool.
    #[arg(long, default_value_t = 100_000)]
    pub unrelated_blocks: usize,
}

impl DecisionArgs {
    /// The workload these settings describe (the rest at its defaults).
    pub fn workload(&self) -> WorkloadConfig {
        WorkloadConfig {
            prompt_tokens: self.prompt_tokens,
            workers_per_pool: self.workers,
            prompts: self.prompts,
            unrelated_blocks_per_pool: self.unrelated_blocks,
            ..WorkloadConfig::default()
        }
    }
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            prompt_tokens: 8192,
            block_size: 16,
            workers_per_pool: 16,
            prompts: 64,
            shared_prefix_tokens: 512,
            max_holders_per_prompt: 3,
            unrelated_blocks_per_pool: 100_000,
            seed: 0x0d01_f1a5,
        }
    }
}

/// Load figures one worker reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WorkerLoad {
    /// Tokens held by running requests.
    pub active_tokens: u64,
    /// Queued requests.
    pub waiting: u32,
}

/// What one worker holds.
#[derive(Clone, Debug, Default)]
pub struct WorkerContents {
    /// Cached blocks as chains of block hashes in prompt order (one stored event each).
    pub chains: Vec<Vec<BlockHash>>,
    /// Its load report.
    pub load: WorkerLoad,
}

impl WorkerContents {
    /// Distinct blocks held (what the router's index should count for this worker).
    pub fn distinct_blocks(&self) -> usize {
        self.chains.iter().flatten().collect::<HashSet<_>>().len()
    }
}

/// The generated workload.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The prompts, as token ids.
    pub prompts: Vec<Vec<u32>>,
    /// As many prompts of the same length that no worker holds any block of (not even the
    /// shared prefix): a new conversation.
    pub unseen: Vec<Vec<u32>>,
    /// Per prefill worker, in pool order.
    pub prefill: Vec<WorkerContents>,
    /// Per decode worker, in pool order.
    pub decode: Vec<WorkerContents>,
}

fn random_tokens(rng: &mut SmallRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(TOKEN_RANGE)).collect()
}

/// Builds the workload for `cfg`.
pub fn build(cfg: &WorkloadConfig) -> Workload {
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let shared = random_tokens(&mut rng, cfg.shared_prefix_tokens.min(cfg.prompt_tokens));
    let prompts: Vec<Vec<u32>> = (0..cfg.prompts)
        .map(|_| {
            let mut p = shared.clone();
            p.extend(random_tokens(&mut rng, cfg.prompt_tokens - shared.len()));
            p
        })
        .collect();
    let prompt_hashes: Vec<Vec<BlockHash>> = prompts
        .iter()
        .map(|p| block_hashes(p, cfg.block_size))
        .collect();
    let shared_blocks = shared.len() / cfg.block_size.max(1);
    let pool = |rng: &mut SmallRng| -> Vec<WorkerContents> {
        let n = cfg.workers_per_pool;
        let mut workers: Vec<WorkerContents> = (0..n)
            .map(|_| WorkerContents {
                chains: Vec::new(),
                load: WorkerLoad {
                    active_tokens: rng.random_range(0..=32_768),
                    waiting: rng.random_range(0..=3),
                },
            })
            .collect();
        for hashes in &prompt_hashes {
            // Everyone holds the shared prefix; a few hold a deeper, random-length prefix.
            for w in workers.iter_mut() {
                w.chains.push(hashes[..shared_blocks].to_vec());
            }
            let holders = rng.random_range(0..=cfg.max_holders_per_prompt.min(n));
            for slot in sample(rng, n, holders) {
                let depth = rng.random_range(shared_blocks.max(1)..=hashes.len());
                workers[slot].chains.push(hashes[..depth].to_vec());
            }
        }
        let per_worker = cfg.unrelated_blocks_per_pool / n.max(1);
        for w in workers.iter_mut() {
            let mut left = per_worker;
            while left > 0 {
                let blocks = rng.random_range(16..=256).min(left);
                let doc = random_tokens(rng, blocks * cfg.block_size);
                w.chains.push(block_hashes(&doc, cfg.block_size));
                left -= blocks;
            }
        }
        workers
    };
    let prefill = pool(&mut rng);
    let decode = pool(&mut rng);
    let unseen = (0..cfg.prompts)
        .map(|_| random_tokens(&mut rng, cfg.prompt_tokens))
        .collect();
    Workload {
        prompts,
        unseen,
        prefill,
        decode,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> WorkloadConfig {
        WorkloadConfig {
            prompt_tokens: 256,
            workers_per_pool: 4,
            prompts: 5,
            shared_prefix_tokens: 64,
            unrelated_blocks_per_pool: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn shapes_follow_the_config() {
        let cfg = small();
        let w = build(&cfg);
        assert_eq!(w.prompts.len(), 5);
        assert!(w.prompts.iter().all(|p| p.len() == 256));
        assert!(w.prompts.iter().all(|p| p[..64] == w.prompts[0][..64]));
        assert_eq!((w.prefill.len(), w.decode.len()), (4, 4));
        let shared = &block_hashes(&w.prompts[0], 16)[..4];
        for worker in w.prefill.iter().chain(&w.decode) {
            // Holds the shared prefix, and at least its share of unrelated blocks.
            assert!(worker.chains.iter().any(|c| c[..] == *shared));
            assert!(worker.distinct_blocks() >= 4 + 250);
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let a = build(&small());
        let b = build(&small());
        assert_eq!(a.prompts, b.prompts);
        assert_eq!(a.decode[2].chains, b.decode[2].chains);
        assert_eq!(a.prefill[1].load, b.prefill[1].load);
    }
}

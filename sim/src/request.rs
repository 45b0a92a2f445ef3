//! Simulated requests: arrival time, prompt (as chained block hashes), output length and SLO.
//!
//! Prompts are kept as block hashes rather than tokens: 100,000 prompts of 8k tokens would be
//! 3 GB of token ids, while their hashes (one per 16-token block) are 16 times smaller, and
//! hashes are all the prefix caches and the router's index ever look at.

use dolphin_cluster::{BlockHash, block_hashes_into, chain_hash};
use dolphin_router::dolphin::Admission;
use dolphin_router::dolphin::admission::HEAD_TOKENS;
use dolphin_workload::{RequestKind, Slo, Workload};

/// One request of a simulated workload.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRequest {
    /// When it reaches the router, ms from the start of the run.
    pub arrival_ms: f64,
    /// Prompt length in tokens.
    pub prompt_len: u32,
    /// Chained hashes of the prompt's full blocks (at the cluster's block size).
    pub hashes: Vec<BlockHash>,
    /// Output tokens it generates (the simulated model never stops early).
    pub output_len: u32,
    /// What the output classifier sees (its `max_tokens` is the request's limit).
    pub admission: Admission,
    /// Its latency targets.
    pub slo: Slo,
    /// Where it comes from (summaries break attainment down by kind).
    pub kind: RequestKind,
}

impl SimRequest {
    /// Sets the `max_tokens` the router sees at admission to the request's workload cap
    /// ([`RequestKind::max_tokens_cap`], at least the output so no answer is cut short) instead
    /// of its output length. The simulated engines still end it at `output_len`, which the
    /// router never sees: what a client that caps its answers sends.
    pub fn cap_max_tokens(&mut self) {
        self.admission.max_tokens = self.kind.max_tokens_cap().max(self.output_len);
    }

    /// A request for a prompt given as tokens, hashed into blocks of `block_size` exactly as
    /// the router hashes it; `max_tokens` = `output_len`. Its kind is [`RequestKind::Arxiv`]
    /// (a prompt of its own); [`with_kind`](Self::with_kind) changes it.
    pub fn from_tokens(
        arrival_ms: f64,
        tokens: &[u32],
        output_len: u32,
        slo: Slo,
        block_size: u32,
    ) -> Self {
        let mut hashes = Vec::with_capacity(tokens.len() / block_size.max(1) as usize);
        block_hashes_into(tokens, block_size as usize, &mut hashes);
        SimRequest {
            arrival_ms,
            prompt_len: tokens.len() as u32,
            hashes,
            output_len,
            admission: Admission::new(tokens, output_len),
            slo,
            kind: RequestKind::Arxiv,
        }
    }

    /// A request whose prompt is described by hash ids (as in Mooncake traces): id `i` stands for
    /// `tokens_per_id` tokens of content, so prompts sharing leading ids share that prefix.
    /// Each id expands into `tokens_per_id / block_size` chained block hashes (deterministic in
    /// the id and the position, so sharing behaves as with real tokens), or, where ids are
    /// smaller than a block, each block hashes the run of ids it covers; the prompt is
    /// `prompt_len` tokens long (its last id may be partly used). Its kind is
    /// [`RequestKind::Mooncake`] (the trace hash ids come from); [`with_kind`](Self::with_kind)
    /// changes it.
    pub fn from_hash_ids(
        arrival_ms: f64,
        ids: &[u64],
        tokens_per_id: u32,
        prompt_len: u32,
        output_len: u32,
        slo: Slo,
        block_size: u32,
    ) -> Self {
        let bs = block_size.max(1);
        let full_blocks = (prompt_len / bs) as usize;
        let mut hashes = Vec::with_capacity(full_blocks);
        let mut parent = None;
        if tokens_per_id >= bs {
            let per_id = tokens_per_id / bs;
            'ids: for &id in ids {
                for sub in 0..per_id {
                    if hashes.len() == full_blocks {
                        break 'ids;
                    }
                    let h = chain_hash(parent, &[id as u32, (id >> 32) as u32, sub]);
                    hashes.push(h);
                    parent = Some(h);
                }
            }
        } else {
            // Ids smaller than a block (Qwen-Bailian's 16 tokens under larger blocks): a block
            // is the run of ids it covers, so prompts share a block only if they share all of
            // them. A last, partial run is content of this prompt alone (below).
            let per_block = bs.div_ceil(tokens_per_id.max(1)) as usize;
            let mut words = Vec::with_capacity(2 * per_block);
            for run in ids.chunks_exact(per_block).take(full_blocks) {
                words.clear();
                words.extend(run.iter().flat_map(|&id| [id as u32, (id >> 32) as u32]));
                let h = chain_hash(parent, &words);
                hashes.push(h);
                parent = Some(h);
            }
        }
        // Ids that cover less than the prompt: the rest is content of its own.
        let tail_seed = ids.last().copied().unwrap_or(0) ^ u64::from(prompt_len);
        while hashes.len() < full_blocks {
            let i = hashes.len() as u32;
            let h = chain_hash(parent, &[tail_seed as u32, (tail_seed >> 32) as u32, i]);
            hashes.push(h);
            parent = Some(h);
        }
        let first = ids.first().copied().unwrap_or(0);
        SimRequest {
            arrival_ms,
            prompt_len,
            hashes,
            output_len,
            admission: Admission {
                isl: prompt_len,
                max_tokens: output_len,
                prefix_hash: chain_hash(None, &[first as u32, (first >> 32) as u32]),
                head: [0; HEAD_TOKENS],
                head_len: 0,
            },
            slo,
            kind: RequestKind::Mooncake,
        }
    }

    /// The same request, of kind `kind`.
    pub fn with_kind(mut self, kind: RequestKind) -> Self {
        self.kind = kind;
        self
    }

    /// Every request of `w`, in order, through [`from_hash_ids`](Self::from_hash_ids) with the
    /// workload's `tokens_per_id`, keeping each request's arrival and kind; all with `slo`.
    pub fn from_workload(w: &Workload, slo: Slo, block_size: u32) -> Vec<SimRequest> {
        w.requests
            .iter()
            .map(|r| {
                SimRequest::from_hash_ids(
                    r.arrival_ms,
                    &r.hash_ids,
                    w.tokens_per_id,
                    r.prompt_len,
                    r.output_len,
                    slo,
                    block_size,
                )
                .with_kind(r.kind)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_prompts_hash_like_the_router() {
        let tokens: Vec<u32> = (0..40).collect();
        let r = SimRequest::from_tokens(0.0, &tokens, 8, Slo::new(1.0, 1.0), 16);
        assert_eq!(r.hashes, dolphin_cluster::block_hashes(&tokens, 16));
        assert_eq!(r.prompt_len, 40);
        assert_eq!(r.admission.isl, 40);
    }

    #[test]
    fn hash_ids_share_exactly_the_shared_ids() {
        let slo = Slo::new(1.0, 1.0);
        let a = SimRequest::from_hash_ids(0.0, &[7, 8, 9], 512, 1536, 4, slo, 16);
        let b = SimRequest::from_hash_ids(0.0, &[7, 8, 10], 512, 1500, 4, slo, 16);
        assert_eq!(a.hashes.len(), 96);
        assert_eq!(b.hashes.len(), 93);
        let shared = a.hashes.iter().zip(&b.hashes).take_while(|(x, y)| x == y);
        assert_eq!(shared.count(), 64);
        // Ids shorter than the prompt still give every full block a hash.
        let c = SimRequest::from_hash_ids(0.0, &[7], 512, 1024, 4, slo, 16);
        assert_eq!(c.hashes.len(), 64);
        assert_eq!(c.hashes[..32], a.hashes[..32]);
        assert_ne!(c.hashes[32], a.hashes[32]);
    }

    #[test]
    fn ids_smaller_than_a_block_share_a_block_only_when_all_its_ids_are_shared() {
        let slo = Slo::new(1.0, 1.0);
        // Ids of 8 tokens, blocks of 16: a block is two ids.
        let a = SimRequest::from_hash_ids(0.0, &[1, 2, 3, 4, 5], 8, 40, 4, slo, 16);
        let b = SimRequest::from_hash_ids(0.0, &[1, 2, 3, 9, 5], 8, 40, 4, slo, 16);
        assert_eq!((a.hashes.len(), b.hashes.len()), (2, 2));
        assert_eq!(a.hashes[0], b.hashes[0]);
        assert_ne!(a.hashes[1], b.hashes[1], "id 4 differs in the second block");
        // Fewer ids than the prompt: full blocks past them are the prompt's own.
        let c = SimRequest::from_hash_ids(0.0, &[1, 2, 3], 8, 48, 4, slo, 16);
        let d = SimRequest::from_hash_ids(0.0, &[1, 2, 3], 8, 48, 4, slo, 16);
        assert_eq!(c.hashes.len(), 3);
        assert_eq!(c.hashes[0], a.hashes[0]);
        assert_ne!(c.hashes[1], a.hashes[1]);
        assert_eq!(c.hashes, d.hashes, "deterministic");
    }
}

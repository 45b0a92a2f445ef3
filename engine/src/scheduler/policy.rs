//! The scheduler's policy as pure functions, apart from its locks, backends and clocks: what
//! enters the next step ([`compose_step`]) and how much of a prompt a prefix-cache hit may
//! cover at admission ([`max_cached_blocks`]).
//!
//! The scheduler applies them to its sequences (`step.rs`, `state.rs`); the simulator
//! (`dolphin-sim`) applies the same functions to its simulated sequences, in simulated time, so
//! the two batch alike by construction.

/// What a running sequence has left to compute before its next sampled token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    /// Whether it is decoding: one token per step.
    pub decoding: bool,
    /// Tokens it may compute now (a decode: 1; a prefill or catch-up: what is left of it).
    pub tokens: u32,
}

/// A step being filled: the scheduler's batch, or the simulator's.
pub trait StepBuilder<Id> {
    /// What sequence `id` wants from the step; `None` (gone, or nothing to compute) leaves it
    /// out.
    fn want(&self, id: Id) -> Option<Want>;

    /// Puts the next `tokens` of `id`'s work into the step. `false` when it cannot (no KV block
    /// for them): then it stays out and costs no budget.
    fn take(&mut self, id: Id, tokens: u32) -> bool;

    /// Called for each sequence, in order, just before its multi-token work is weighed: a
    /// builder that finds prefix-cache hits when a prompt is first scheduled (vLLM's way, which
    /// the simulator can model) extends the prompt's hit here, with what the sequences before
    /// it in this step cache. Nothing by default.
    fn prepare(&mut self, _id: Id) {}
}

/// What entered a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    /// Decoding sequences (one token each).
    pub decodes: u32,
    /// Tokens of multi-token work (prefill chunks, catch-ups).
    pub chunk_tokens: u32,
}

/// How much one step may compute: the engine's scheduling settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLimits {
    /// Tokens per step: decodes plus prefill chunks (vLLM's `max_num_batched_tokens`).
    pub max_batched_tokens: u32,
    /// Most tokens of one sequence's multi-token work in a step, 0 for no cap beyond the
    /// budget (vLLM's `long_prefill_token_threshold`): a long prompt then leaves room for
    /// others in every step instead of filling it.
    pub prefill_chunk_tokens: u32,
    /// Most multi-token work in a step that also decodes, 0 for no cap beyond the budget: how
    /// long a local prefill may stall the decodes it runs beside (the TTFT/TPOT trade).
    pub mixed_prefill_tokens: u32,
}

impl StepLimits {
    /// `max_batched_tokens` per step, no other cap.
    pub const fn new(max_batched_tokens: u32) -> Self {
        Self {
            max_batched_tokens,
            prefill_chunk_tokens: 0,
            mixed_prefill_tokens: 0,
        }
    }
}

/// Composes one step (continuous batching with chunked prefill): every decoding sequence
/// computes its one token, whatever the budget; then multi-token work fills what is left of
/// `max_batched_tokens` (at most `mixed_prefill_tokens` of it when the step decodes), in
/// admission order (`running`'s), each sequence at most `prefill_chunk_tokens` of it, the last
/// one entering with a partial chunk. A prompt longer than the budget is therefore spread over
/// steps, and several short ones share a step.
pub fn compose_step<Id: Copy>(
    running: &[Id],
    limits: StepLimits,
    step: &mut impl StepBuilder<Id>,
) -> StepShape {
    let mut budget = limits.max_batched_tokens;
    let mut shape = StepShape::default();
    for &id in running {
        if step.want(id).is_some_and(|w| w.decoding && w.tokens > 0) && step.take(id, 1) {
            shape.decodes += 1;
            budget = budget.saturating_sub(1);
        }
    }
    if shape.decodes > 0 && limits.mixed_prefill_tokens > 0 {
        budget = budget.min(limits.mixed_prefill_tokens);
    }
    let per_seq = match limits.prefill_chunk_tokens {
        0 => u32::MAX,
        n => n,
    };
    for &id in running {
        if budget == 0 {
            break;
        }
        step.prepare(id);
        let Some(want) = step.want(id).filter(|w| !w.decoding && w.tokens > 0) else {
            continue;
        };
        let n = want.tokens.min(budget).min(per_seq);
        if step.take(id, n) {
            shape.chunk_tokens += n;
            budget -= n;
        }
    }
    shape
}

/// KV blocks of `block_size` tokens a step's attention reads, given where each of its entries'
/// context ends (positions before it plus the new tokens): every entry reads its whole
/// context, so a prefix block shared by eight sequences counts eight times, though memory holds
/// it once. What timing models charge decode by.
pub fn blocks_read(context_ends: impl IntoIterator<Item = u32>, block_size: u32) -> u32 {
    let bs = block_size.max(1);
    context_ends.into_iter().map(|end| end.div_ceil(bs)).sum()
}

/// (new prompt token, earlier token) pairs of a step's prompt chunks, given each chunk's
/// tokens and the tokens computed before it: the attention over earlier context that a
/// profile's `prefill_ms.tc` charges. The engine's `Batch` and the simulator both count it here.
pub fn prefill_context_pairs(chunks: impl IntoIterator<Item = (u32, u32)>) -> u64 {
    chunks
        .into_iter()
        .map(|(tokens, before)| u64::from(tokens) * u64::from(before))
        .sum()
}

/// The most prompt blocks a prefix-cache hit may cover at admission: the full blocks before the
/// prompt's last token, and no more than the prompt's block hashes. At least one prompt token
/// is always computed, because computing it yields the first output token.
pub fn max_cached_blocks(prompt_len: u32, block_size: u32, hashed_blocks: usize) -> usize {
    ((prompt_len.saturating_sub(1) / block_size.max(1)) as usize).min(hashed_blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequences by index: `(decoding, tokens)`, and whether a take may fail.
    struct Fake {
        wants: Vec<Option<Want>>,
        refuse: Vec<usize>,
        taken: Vec<(usize, u32)>,
        /// `prepare` shrinks a sequence's work to this (a prefix hit found late).
        late_hits: Vec<(usize, u32)>,
        prepared: Vec<usize>,
    }

    impl StepBuilder<usize> for Fake {
        fn want(&self, id: usize) -> Option<Want> {
            self.wants[id]
        }

        fn take(&mut self, id: usize, tokens: u32) -> bool {
            if self.refuse.contains(&id) {
                return false;
            }
            self.taken.push((id, tokens));
            true
        }

        fn prepare(&mut self, id: usize) {
            self.prepared.push(id);
            if let Some(&(_, left)) = self.late_hits.iter().find(|h| h.0 == id)
                && let Some(w) = self.wants[id].as_mut()
            {
                w.tokens = left;
            }
        }
    }

    fn fake(wants: &[(bool, u32)]) -> Fake {
        Fake {
            wants: wants
                .iter()
                .map(|&(decoding, tokens)| Some(Want { decoding, tokens }))
                .collect(),
            refuse: Vec::new(),
            taken: Vec::new(),
            late_hits: Vec::new(),
            prepared: Vec::new(),
        }
    }

    #[test]
    fn work_is_weighed_after_prepare_in_admission_order_while_budget_lasts() {
        // The second prompt finds a late hit that leaves it 20 tokens: the third then fits.
        let mut f = fake(&[
            (true, 1),
            (false, 100),
            (false, 300),
            (false, 50),
            (false, 10),
        ]);
        f.late_hits.push((2, 20));
        compose_step(&[0, 1, 2, 3, 4], StepLimits::new(171), &mut f);
        assert_eq!(f.taken, vec![(0, 1), (1, 100), (2, 20), (3, 50)]);
        // The decode is prepared too (a builder skips it); the budget ran out before the last.
        assert_eq!(f.prepared, vec![0, 1, 2, 3]);
    }

    #[test]
    fn decodes_first_then_chunks_in_admission_order_within_the_budget() {
        // Two prefills of 300 and 500 around two decodes, a 512-token budget.
        let mut f = fake(&[(false, 300), (true, 1), (false, 500), (true, 1)]);
        let shape = compose_step(&[0, 1, 2, 3], StepLimits::new(512), &mut f);
        assert_eq!(f.taken, vec![(1, 1), (3, 1), (0, 300), (2, 210)]);
        assert_eq!(
            shape,
            StepShape {
                decodes: 2,
                chunk_tokens: 510
            }
        );
    }

    #[test]
    fn decodes_enter_even_past_the_budget() {
        let mut f = fake(&[(true, 1), (true, 1), (true, 1), (false, 100)]);
        let shape = compose_step(&[0, 1, 2, 3], StepLimits::new(2), &mut f);
        assert_eq!(shape.decodes, 3);
        assert_eq!(shape.chunk_tokens, 0, "no budget left for the prefill");
    }

    #[test]
    fn refused_and_empty_work_costs_nothing() {
        let mut f = fake(&[(false, 100), (false, 0), (false, 100)]);
        f.wants.push(None);
        f.refuse.push(0);
        let shape = compose_step(&[0, 1, 2, 3], StepLimits::new(150), &mut f);
        assert_eq!(f.taken, vec![(2, 100)]);
        assert_eq!(shape.chunk_tokens, 100);
    }

    #[test]
    fn the_chunk_cap_spreads_a_long_prompt_and_the_mixed_cap_guards_decodes() {
        // A 3000-token prompt beside a 100-token one, 2048-token budget, 1024-token chunks.
        let limits = StepLimits {
            prefill_chunk_tokens: 1024,
            ..StepLimits::new(2048)
        };
        let mut f = fake(&[(false, 3000), (false, 100)]);
        compose_step(&[0, 1], limits, &mut f);
        assert_eq!(f.taken, vec![(0, 1024), (1, 100)]);
        // With two decodes in the step, at most 256 prefill tokens join them.
        let limits = StepLimits {
            mixed_prefill_tokens: 256,
            ..limits
        };
        let mut f = fake(&[(true, 1), (false, 3000), (true, 1), (false, 100)]);
        let shape = compose_step(&[0, 1, 2, 3], limits, &mut f);
        assert_eq!(f.taken, vec![(0, 1), (2, 1), (1, 256)]);
        assert_eq!(shape.chunk_tokens, 256);
        // Without decodes the mixed cap does not apply.
        let mut f = fake(&[(false, 3000)]);
        compose_step(&[0], limits, &mut f);
        assert_eq!(f.taken, vec![(0, 1024)]);
    }

    #[test]
    fn a_cache_hit_never_covers_the_last_prompt_token() {
        assert_eq!(
            max_cached_blocks(32, 16, 2),
            1,
            "two full blocks: the last is computed"
        );
        assert_eq!(max_cached_blocks(33, 16, 2), 2);
        assert_eq!(max_cached_blocks(33, 16, 1), 1, "no more than the hashes");
        assert_eq!(max_cached_blocks(1, 16, 0), 0);
        assert_eq!(max_cached_blocks(0, 16, 0), 0);
    }
}

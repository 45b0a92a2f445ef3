//! Timing a backend's steps over a grid of shapes: prefill chunks of several sizes (at the start
//! of a prompt and after a cached prefix), decode steps of several batch sizes at several KV
//! occupancies, and mixed steps. The backend is driven directly, one step at a time, with batches
//! built here, so each measurement is exactly one shape.
//!
//! A decode sequence's context is never computed: it is started as if its prompt's KV were
//! already in its blocks (as after an import), so a step at 5,000 tokens of context costs one
//! step, not 5,000 tokens of prefill first. What the blocks hold does not change how long the
//! step takes, only which token comes out. Every sequence of a step gets blocks of its own, as in
//! a running engine; the pool is never over-committed.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Batch, SeqStart};
use crate::error::BackendError;
use crate::types::{BlockId, Sampled, Sampling, SeqId};

/// The shapes to time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FitGrid {
    /// Prompt tokens of the pure prefill steps (one sequence, from position 0).
    pub prefill_tokens: Vec<u32>,
    /// Cached context before a prefill chunk of `context_chunk` tokens (shows what the
    /// profile's prefill cost, a function of the chunk alone, leaves out).
    pub prefill_context: Vec<u32>,
    /// Chunk size of the prefill-after-context steps.
    pub context_chunk: u32,
    /// Sequences of the pure decode steps.
    pub decode_batches: Vec<u32>,
    /// KV occupancies of the decode steps: blocks read over blocks in the pool.
    pub occupancies: Vec<f64>,
    /// Mixed steps: (prefill chunk tokens, decoding sequences), at the middle occupancy.
    pub mixed: Vec<(u32, u32)>,
    /// Timed runs per shape (the median is kept).
    pub reps: u32,
    /// Untimed runs per shape before (caches, allocator, thread pool).
    pub warmup: u32,
}

impl Default for FitGrid {
    /// Prefill 16 to 2048 tokens, context 0 to 4096 before a 256-token chunk, decode batches 1
    /// to 16 at 5% to 100% occupancy, four mixed shapes; 5 timed runs after 1 untimed.
    fn default() -> Self {
        Self {
            prefill_tokens: vec![16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048],
            prefill_context: vec![0, 512, 1024, 2048, 4096],
            context_chunk: 256,
            decode_batches: vec![1, 2, 4, 8, 16],
            occupancies: vec![0.05, 0.25, 0.5, 0.75, 1.0],
            mixed: vec![(64, 4), (256, 4), (256, 16), (512, 8)],
            reps: 5,
            warmup: 1,
        }
    }
}

/// The shape of one timed step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepShape {
    /// One sequence's prompt chunk of `tokens` after `context` cached tokens.
    Prefill {
        /// New prompt tokens.
        tokens: u32,
        /// Tokens before them whose KV is already there.
        context: u32,
    },
    /// `batch` sequences decoding one token each, reading `blocks_read` KV blocks in all.
    Decode {
        /// Decoding sequences.
        batch: u32,
        /// Context tokens of each.
        context: u32,
        /// KV blocks the step reads.
        blocks_read: u32,
    },
    /// A prefill chunk from position 0 beside `batch` decodes.
    Mixed {
        /// New prompt tokens.
        tokens: u32,
        /// Decoding sequences.
        batch: u32,
        /// Context tokens of each decoding sequence.
        context: u32,
        /// KV blocks the step reads (the chunk's included, as the scheduler counts them).
        blocks_read: u32,
    },
}

/// One shape's timing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSample {
    /// What ran.
    #[serde(flatten)]
    pub shape: StepShape,
    /// Median step time, ms.
    pub ms: f64,
    /// Every timed run, ms.
    pub runs_ms: Vec<f64>,
}

/// Times `grid`'s shapes on `backend`, calling `progress` after each. A step's time is the
/// simulated time the backend reports, or its wall time when it reports none (a real backend).
/// Shapes that do not fit the pool or the context are skipped.
pub fn measure<B: Backend>(
    backend: &mut B,
    grid: &FitGrid,
    mut progress: impl FnMut(&StepSample),
) -> Result<Vec<StepSample>, BackendError> {
    let mut bench = Bench::new(backend, grid.reps.max(1), grid.warmup);
    let mut out = Vec::new();
    let mut keep = |s: StepSample, out: &mut Vec<StepSample>| {
        progress(&s);
        out.push(s);
    };
    for &tokens in &grid.prefill_tokens {
        if let Some(s) = bench.prefill(tokens, 0)? {
            keep(s, &mut out);
        }
    }
    for &context in grid.prefill_context.iter().filter(|&&c| c > 0) {
        if let Some(s) = bench.prefill(grid.context_chunk, context)? {
            keep(s, &mut out);
        }
    }
    for &batch in &grid.decode_batches {
        for &occupancy in &grid.occupancies {
            if let Some(s) = bench.mixed(0, batch, occupancy)? {
                keep(s, &mut out);
            }
        }
    }
    let middle = grid
        .occupancies
        .get(grid.occupancies.len() / 2)
        .copied()
        .unwrap_or(0.5);
    for &(tokens, batch) in &grid.mixed {
        if let Some(s) = bench.mixed(tokens, batch, middle)? {
            keep(s, &mut out);
        }
    }
    Ok(out)
}

/// Builds and times steps on one backend.
struct Bench<'a, B: Backend> {
    backend: &'a mut B,
    reps: u32,
    warmup: u32,
    block_size: u32,
    total_blocks: u32,
    context_length: u32,
    vocab: u32,
    next_seq: SeqId,
    sampling: Sampling,
    batch: Batch,
    /// Per sequence of the step being built: (id, prompt, table).
    seqs: Vec<(SeqId, Vec<u32>, Vec<BlockId>)>,
}

impl<'a, B: Backend> Bench<'a, B> {
    fn new(backend: &'a mut B, reps: u32, warmup: u32) -> Self {
        let info = backend.info();
        Self {
            block_size: info.block_size.max(1),
            total_blocks: info.total_blocks,
            context_length: info.context_length,
            vocab: info.vocab_size,
            backend,
            reps,
            warmup,
            next_seq: 1 << 40,
            sampling: Sampling::default(),
            batch: Batch::default(),
            seqs: Vec::new(),
        }
    }

    /// A prefill chunk of `tokens` after `context` cached tokens.
    fn prefill(&mut self, tokens: u32, context: u32) -> Result<Option<StepSample>, BackendError> {
        let end = context + tokens;
        if tokens == 0
            || end > self.context_length
            || end.div_ceil(self.block_size) > self.total_blocks
        {
            return Ok(None);
        }
        let shape = StepShape::Prefill { tokens, context };
        self.time(shape, |b| b.add_seq(end))
    }

    /// `batch` decodes at `occupancy` (each sequence's context sized so that the step reads
    /// that share of the pool), with a prefill chunk of `tokens` from position 0 beside them
    /// when `tokens` > 0.
    fn mixed(
        &mut self,
        tokens: u32,
        batch: u32,
        occupancy: f64,
    ) -> Result<Option<StepSample>, BackendError> {
        let chunk_blocks = tokens.div_ceil(self.block_size);
        let budget = (occupancy * f64::from(self.total_blocks)).floor() as u32;
        let per_seq = budget.saturating_sub(chunk_blocks) / batch.max(1);
        if batch == 0 || per_seq == 0 {
            return Ok(None);
        }
        // Each context plus its new token fills `per_seq` blocks exactly.
        let context = (per_seq * self.block_size - 1).min(self.context_length.saturating_sub(1));
        if context == 0 || tokens > self.context_length {
            return Ok(None);
        }
        let blocks_read = batch * (context + 1).div_ceil(self.block_size) + chunk_blocks;
        let shape = if tokens == 0 {
            StepShape::Decode {
                batch,
                context,
                blocks_read,
            }
        } else {
            StepShape::Mixed {
                tokens,
                batch,
                context,
                blocks_read,
            }
        };
        self.time(shape, |b| {
            for _ in 0..batch {
                b.add_seq(context + 1);
            }
            if tokens > 0 {
                b.add_seq(tokens);
            }
        })
    }

    /// Queues a sequence of `len` tokens with blocks of its own ([`entry_position`] says
    /// which of them the step computes).
    fn add_seq(&mut self, len: u32) {
        let used: u32 = self.seqs.iter().map(|(_, _, t)| t.len() as u32).sum();
        let blocks = len.div_ceil(self.block_size);
        let table: Vec<BlockId> = (used..used + blocks).collect();
        let vocab = self.vocab.max(4);
        let seq = self.next_seq;
        self.next_seq += 1;
        // Ids spread over the vocabulary, away from the low special ids.
        let prompt = (0..len)
            .map(|i| {
                3 + (seq as u32)
                    .wrapping_mul(31)
                    .wrapping_add(i.wrapping_mul(7919))
                    % (vocab - 3)
            })
            .collect();
        self.seqs.push((seq, prompt, table));
    }

    /// Runs `build` (which queues the step's sequences with [`Bench::add_seq`]), then warms up
    /// and times the step.
    fn time(
        &mut self,
        shape: StepShape,
        build: impl Fn(&mut Self),
    ) -> Result<Option<StepSample>, BackendError> {
        let mut runs = Vec::with_capacity(self.reps as usize);
        for run in 0..self.warmup + self.reps {
            self.seqs.clear();
            build(self);
            let ms = self.run_once(shape)?;
            if run >= self.warmup {
                runs.push(ms);
            }
        }
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let ms = sorted[sorted.len() / 2];
        Ok(Some(StepSample {
            shape,
            ms,
            runs_ms: runs,
        }))
    }

    /// Starts the queued sequences, runs one step over them, releases them; the step's ms.
    fn run_once(&mut self, shape: StepShape) -> Result<f64, BackendError> {
        self.batch.clear();
        let seqs = std::mem::take(&mut self.seqs);
        let result = self.step(&seqs, shape);
        for (seq, _, _) in &seqs {
            self.backend.release(*seq);
        }
        self.seqs = seqs;
        result
    }

    fn step(
        &mut self,
        seqs: &[(SeqId, Vec<u32>, Vec<BlockId>)],
        shape: StepShape,
    ) -> Result<f64, BackendError> {
        for (i, (seq, prompt, table)) in seqs.iter().enumerate() {
            let (position, prompt_len) = entry_position(shape, i, seqs.len(), prompt.len() as u32);
            self.backend.start(SeqStart {
                seq: *seq,
                sampling: &self.sampling,
                prompt: &prompt[..prompt_len as usize],
                output: &[],
                table,
                computed: position.min(prompt_len),
                stats: false,
            })?;
            self.batch.push(
                *seq,
                position,
                prompt_len,
                &prompt[position as usize..],
                table,
                true,
            );
        }
        self.batch.kv_blocks_read = self.batch.context_blocks(self.block_size);
        self.batch.kv_blocks_total = self.total_blocks;
        let mut sampled: Vec<Option<Sampled>> = vec![None; self.batch.len()];
        let started = Instant::now();
        let simulated = self.backend.step(&self.batch, &mut sampled)?;
        let wall = started.elapsed();
        let took = if simulated.is_zero() { wall } else { simulated };
        Ok(took.as_secs_f64() * 1e3)
    }
}

/// Where entry `i` of a step of `shape` starts, and its prompt length: decodes have a prompt of
/// their context and one generated token at position `context`; a prefill chunk starts after
/// its cached context (0 in a mixed step, whose chunk is the last entry).
fn entry_position(shape: StepShape, i: usize, n: usize, len: u32) -> (u32, u32) {
    match shape {
        StepShape::Prefill { context, .. } => (context, len),
        StepShape::Decode { context, .. } => (context, context),
        StepShape::Mixed { context, .. } if i + 1 < n => (context, context),
        StepShape::Mixed { .. } => (0, len),
    }
}

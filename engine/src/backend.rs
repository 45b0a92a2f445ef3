//! The `Backend` trait: model-specific compute under the shared scheduler and KV pool.
//!
//! The scheduler owns the request lifecycle and the block pool (which block holds which tokens,
//! the prefix cache); a backend owns the KV memory behind the block ids and the model. Per step
//! the scheduler hands the backend a [`Batch`]: for each sequence its new tokens (a prefill chunk
//! or one decode token), its position and its whole block table; the backend writes the KV of
//! those tokens into the blocks and samples a token for each sequence that finished its prompt or
//! decoded. Blocks move between engines through the backend's [`KvBlocks`], which the scheduler
//! uses while a step runs.
//!
//! Who writes which block while a step runs (the rule that makes running `step` outside the
//! scheduler's lock safe): the step writes only the blocks its entries' new tokens land in, which
//! belong to that one sequence and are not yet in the prefix cache; an import writes only blocks
//! of a reservation (a sequence awaiting KV, never in a batch); and no block named by the running
//! batch returns to the free list before the step returns, even when its sequence is cancelled
//! meanwhile. So concurrent writers never share a block, and nothing a step reads is rewritten.
//! Exports read blocks whose KV is complete (a prefilled prompt), which no one writes any more.

use std::fmt::Debug;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dolphin_cluster::BlockHash;

use crate::error::BackendError;
use crate::types::{BlockId, EngineInfo, Sampled, Sampling, SeqId};

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    /// The sequence.
    pub seq: SeqId,
    /// Position of the first new token (tokens before it already have KV in the table).
    pub position: u32,
    /// Prompt length: new tokens at positions below it are prefill, the rest decode.
    pub prompt_len: u32,
    /// Whether the backend must sample a token for this sequence (its prompt completes in this
    /// step, or it decodes).
    pub sample: bool,
    tokens: Range<usize>,
    table: Range<usize>,
}

impl BatchEntry {
    /// Number of new tokens.
    pub fn len(&self) -> u32 {
        (self.tokens.end - self.tokens.start) as u32
    }

    /// Whether the entry has no new tokens (never true in a scheduled batch).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether the new tokens are prompt tokens.
    pub fn is_prefill(&self) -> bool {
        self.position < self.prompt_len
    }

    /// Tokens past the first of a multi-token entry after the prompt: a handoff's catch-up
    /// (tokens another model wrote, appended here in one chunk).
    pub fn catch_up_tokens(&self) -> u32 {
        if self.is_prefill() {
            0
        } else {
            self.len().saturating_sub(1)
        }
    }
}

/// The work of one step. Buffers are reused from step to step (no allocation once warm).
#[derive(Debug, Default)]
pub struct Batch {
    entries: Vec<BatchEntry>,
    tokens: Vec<u32>,
    tables: Vec<BlockId>,
    /// KV blocks the step's attention reads: each entry's context up to its last new token,
    /// counted per sequence (a prefix block shared by eight sequences is read eight times,
    /// though memory holds it once). Timing models charge decode by it.
    pub kv_blocks_read: u32,
    /// Blocks in the pool.
    pub kv_blocks_total: u32,
}

impl Batch {
    /// Empties the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.tokens.clear();
        self.tables.clear();
        self.kv_blocks_read = 0;
    }

    /// Adds a sequence's share.
    pub fn push(
        &mut self,
        seq: SeqId,
        position: u32,
        prompt_len: u32,
        tokens: &[u32],
        table: &[BlockId],
        sample: bool,
    ) {
        let t0 = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        let b0 = self.tables.len();
        self.tables.extend_from_slice(table);
        self.entries.push(BatchEntry {
            seq,
            position,
            prompt_len,
            sample,
            tokens: t0..self.tokens.len(),
            table: b0..self.tables.len(),
        });
    }

    /// Entries in scheduling order (decodes first, then prefill chunks).
    pub fn entries(&self) -> &[BatchEntry] {
        &self.entries
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the step has no work.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// New tokens in the step, over all entries.
    pub fn token_count(&self) -> u32 {
        self.tokens.len() as u32
    }

    /// New tokens of an entry.
    pub fn tokens(&self, entry: &BatchEntry) -> &[u32] {
        &self.tokens[entry.tokens.clone()]
    }

    /// Block table of an entry's sequence: block `i` holds positions `[i * bs, (i + 1) * bs)`.
    pub fn table(&self, entry: &BatchEntry) -> &[BlockId] {
        &self.tables[entry.table.clone()]
    }

    /// Prompt tokens in this step (the prefill cost driver).
    pub fn prefill_tokens(&self) -> u32 {
        self.entries
            .iter()
            .filter(|e| e.is_prefill())
            .map(BatchEntry::len)
            .sum()
    }

    /// (new prompt token, earlier context token) pairs of the step's prompt chunks: each chunk's
    /// tokens times the tokens computed before it ([`crate::SimProfile::prefill_context_ms`]).
    pub fn prefill_context_pairs(&self) -> u64 {
        crate::policy::prefill_context_pairs(
            self.entries
                .iter()
                .filter(|e| e.is_prefill())
                .map(|e| (e.len(), e.position)),
        )
    }

    /// KV blocks of `block_size` tokens that the entries' attention reads: positions
    /// `[0, position + new tokens)` of each entry ([`crate::policy::blocks_read`]).
    pub fn context_blocks(&self, block_size: u32) -> u32 {
        crate::policy::blocks_read(
            self.entries.iter().map(|e| e.position + e.len()),
            block_size,
        )
    }

    /// Sequences decoding in this step (a catch-up chunk counts as one).
    pub fn decode_seqs(&self) -> u32 {
        self.entries.iter().filter(|e| !e.is_prefill()).count() as u32
    }

    /// Catch-up tokens of handoffs in this step, beyond one per sequence.
    pub fn catch_up_tokens(&self) -> u32 {
        self.entries.iter().map(BatchEntry::catch_up_tokens).sum()
    }
}

/// Where a sequence's KV stands when it starts computing.
#[derive(Debug)]
pub struct SeqStart<'a> {
    /// The sequence.
    pub seq: SeqId,
    /// How to sample.
    pub sampling: &'a Sampling,
    /// Its prompt.
    pub prompt: &'a [u32],
    /// Tokens it has generated so far (a resumed or handed-over sequence has some); those at
    /// positions below `computed` are never fed to a step again.
    pub output: &'a [u32],
    /// Blocks allocated so far (at least those covering `computed` tokens).
    pub table: &'a [BlockId],
    /// Leading prompt tokens whose KV is already in the table: a prefix-cache hit (a block
    /// boundary), or the whole prompt once imported from a prefill worker.
    pub computed: u32,
    /// Whether sampled tokens need their distribution's statistics ([`crate::TokenStats`]):
    /// set for sequences a handoff algorithm routes.
    pub stats: bool,
}

/// A block received from another engine.
#[derive(Debug)]
pub struct ImportBlock<'a> {
    /// The receiving sequence.
    pub seq: SeqId,
    /// Block index within the sequence (absolute, not relative to the cached prefix).
    pub index: u32,
    /// Block to write.
    pub block: BlockId,
    /// Chained hash of the block before it (`None` for block 0).
    pub parent: Option<BlockHash>,
    /// The block's tokens (fewer than the block size for a prompt's trailing partial block).
    pub tokens: &'a [u32],
}

/// A backend's KV memory as the scheduler reaches it from any thread, also while a step runs
/// (see the module docs for which blocks may be touched then). Implementations synchronize their
/// memory internally.
pub trait KvBlocks: Debug + Send + Sync + 'static {
    /// Bytes of block `block`, the `index`-th of its sequence, holding `filled` tokens.
    fn export_block(&self, block: BlockId, index: u32, filled: u32) -> Result<Bytes, BackendError>;

    /// Writes received bytes into a block after checking them.
    fn import_block(&self, import: ImportBlock<'_>, data: &[u8]) -> Result<(), BackendError>;
}

/// Model-specific compute under the shared scheduler. The scheduler's loop owns the backend and
/// calls it from one thread, without holding the scheduler's lock during `step`, so requests,
/// cancels, imports and load reports proceed while a step computes. `start` and `release` are
/// deferred to the loop (called between steps, in order). A backend whose compute blocks for
/// long should run where it does not stall the async runtime's other tasks.
pub trait Backend: Send + 'static {
    /// The KV memory, shared with the scheduler for block export and import.
    type Blocks: KvBlocks;

    /// Fixed facts, including the pool geometry the scheduler must use.
    fn info(&self) -> &EngineInfo;

    /// A handle on the KV memory (taken once, when the scheduler starts).
    fn blocks(&self) -> Arc<Self::Blocks>;

    /// A sequence enters compute (after admission, or after its prompt KV was imported); called
    /// before the first step that includes it.
    fn start(&mut self, start: SeqStart<'_>) -> Result<(), BackendError>;

    /// Runs one step: writes the KV of every entry's new tokens and sets `sampled[i]` for every
    /// entry with `sample` set (`sampled` has one slot per entry, all `None` on entry), with
    /// statistics for sequences started with `stats`. Returns
    /// how long the step takes in simulated time: the scheduler publishes the results that much
    /// after the step started (zero for a backend that computes for real).
    fn step(
        &mut self,
        batch: &Batch,
        sampled: &mut [Option<Sampled>],
    ) -> Result<Duration, BackendError>;

    /// Sequences of the last step that failed alone (their slot in `sampled` left `None`),
    /// with why: a request whose output format cannot go on. The rest of the step stands.
    fn take_failures(&mut self, failed: &mut Vec<(SeqId, BackendError)>) {
        let _ = failed;
    }

    /// The sequence is gone; drop any per-sequence state. (A sequence may be released without
    /// having been started.)
    fn release(&mut self, seq: SeqId);
}

//! `SimBackend`: timing from a profile instead of compute, deterministic KV and tokens.
//!
//! The "KV memory" of a block is one hash: the chained hash of every token up to the block's
//! last filled one (what a real block's content depends on), plus its fill. Its bytes are the
//! stream of `block_seed(chain, index)`, scaled to `bytes_per_token` per token, generated on
//! export and regenerated to verify an import. When a prompt's KV is complete (computed here or
//! imported), the sequence's digest folds the seeds of all its blocks, read from memory, and
//! decoding may start. Each token is a function of the chained hash of every token before it
//! (the last full block's chain, read from memory, and the tokens after it) and its position,
//! as an autoregressive model's greedy choice is a function of its context. So intact remote KV
//! yields exactly the local tokens, KV that is wrong anywhere is rejected on import, and a
//! request continued elsewhere from its prompt plus the tokens it already has (a migration)
//! writes what the uninterrupted run would have.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dolphin_cluster::chain_hash;
use parking_lot::Mutex;

use super::content::{self, EOS_TOKEN};
use super::profile::SimProfile;
use crate::backend::{Backend, Batch, ImportBlock, KvBlocks, SeqStart};
use crate::error::BackendError;
use crate::types::{BlockId, EngineInfo, Sampled, SeqId, TokenLogprobs, TokenStats};

/// What a block "holds".
#[derive(Clone, Copy, Debug, Default)]
struct BlockMem {
    /// Chained hash of the tokens up to the block's last filled one.
    chain: u64,
    /// Tokens filled.
    filled: u32,
}

/// Per-sequence running state.
#[derive(Debug)]
struct SimSeq {
    /// Chain hash of the last full block (`None` before the first).
    parent: Option<u64>,
    /// Tokens of the block being filled.
    partial: Vec<u32>,
    /// Position of the next token it expects to absorb.
    next: u32,
    /// Digest of the prompt's KV, once complete (decoding waits for it).
    digest: Option<u64>,
    /// Mixed into the digest: a seeded sampler with temperature selects its own stream.
    salt: u64,
    /// Whether sampled tokens carry (synthetic) statistics.
    stats: bool,
    /// Alternatives to report log probabilities for (`Sampling::logprobs`).
    logprobs: Option<u32>,
}

/// The simulated KV memory: what each block holds, shared by the backend's steps and the
/// scheduler's exports and imports.
#[derive(Debug)]
pub struct SimBlocks {
    memory: Mutex<Vec<BlockMem>>,
    /// Exported bytes per token.
    bytes_per_token: usize,
}

impl SimBlocks {
    fn mem(&self, block: BlockId) -> Result<BlockMem, BackendError> {
        self.memory
            .lock()
            .get(block as usize)
            .copied()
            .ok_or_else(|| outside(block))
    }

    /// Sets what `block` holds.
    fn write(&self, block: BlockId, chain: u64, filled: u32) -> Result<(), BackendError> {
        let mut memory = self.memory.lock();
        let slot = memory
            .get_mut(block as usize)
            .ok_or_else(|| outside(block))?;
        *slot = BlockMem { chain, filled };
        Ok(())
    }
}

impl KvBlocks for SimBlocks {
    fn export_block(&self, block: BlockId, index: u32, filled: u32) -> Result<Bytes, BackendError> {
        let m = self.mem(block)?;
        if m.filled != filled {
            return Err(BackendError::Invalid(format!(
                "block {block} holds {} tokens, not {filled}",
                m.filled
            )));
        }
        Ok(content::generate(
            content::block_seed(m.chain, index),
            filled as usize * self.bytes_per_token,
        ))
    }

    fn import_block(&self, import: ImportBlock<'_>, data: &[u8]) -> Result<(), BackendError> {
        let chain = chain_hash(import.parent, import.tokens);
        let expected = import.tokens.len() * self.bytes_per_token;
        if data.len() != expected {
            return Err(BackendError::Corrupt(format!(
                "{} bytes, expected {expected}",
                data.len()
            )));
        }
        if let Some(at) = content::first_mismatch(content::block_seed(chain, import.index), data) {
            return Err(BackendError::Corrupt(format!(
                "byte {at} of {expected} differs from block {}'s content",
                import.index
            )));
        }
        self.write(import.block, chain, import.tokens.len() as u32)
    }
}

/// The simulated model.
#[derive(Debug)]
pub struct SimBackend {
    info: EngineInfo,
    profile: SimProfile,
    time_scale: f64,
    blocks: Arc<SimBlocks>,
    seqs: HashMap<SeqId, SimSeq>,
}

impl SimBackend {
    /// A backend with `info`'s geometry, timed by `profile` scaled by `time_scale` (0: no delay).
    /// `info.kv_bytes_per_token` is the exported size of one token's KV.
    pub fn new(info: EngineInfo, profile: SimProfile, time_scale: f64) -> Self {
        let blocks = SimBlocks {
            memory: Mutex::new(vec![BlockMem::default(); info.total_blocks as usize]),
            bytes_per_token: info.kv_bytes_per_token.max(1) as usize,
        };
        Self {
            blocks: Arc::new(blocks),
            seqs: HashMap::new(),
            info,
            profile,
            time_scale,
        }
    }

    fn mem(&self, block: BlockId) -> Result<BlockMem, BackendError> {
        self.blocks.mem(block)
    }

    /// Digest of a prompt of `prompt_len` tokens whose KV is in `table`.
    fn digest(&self, prompt_len: u32, table: &[BlockId]) -> Result<u64, BackendError> {
        let blocks = prompt_len.div_ceil(self.info.block_size) as usize;
        let table = table.get(..blocks).ok_or_else(|| {
            BackendError::Invalid(format!(
                "table has {} of {blocks} prompt blocks",
                table.len()
            ))
        })?;
        table
            .iter()
            .enumerate()
            .try_fold(content::DIGEST_SEED, |d, (i, &b)| {
                Ok(content::digest_step(
                    d,
                    content::block_seed(self.mem(b)?.chain, i as u32),
                ))
            })
    }

    /// Feeds one entry's new tokens into the sequence's blocks.
    fn absorb(
        &mut self,
        seq: SeqId,
        position: u32,
        tokens: &[u32],
        table: &[BlockId],
    ) -> Result<(), BackendError> {
        let bs = self.info.block_size as usize;
        let next = self.seqs.get(&seq).ok_or_else(|| unknown(seq))?.next;
        // A prompt that found more of itself cached after it started (the scheduler looks again
        // before its first chunk) resumes after those blocks: they are full, and written by now
        // (by an earlier step, or by an earlier entry of this one).
        let resumed_parent = if position == next {
            None
        } else if position > next && (position as usize).is_multiple_of(bs) {
            let last = *table
                .get(position as usize / bs - 1)
                .ok_or_else(|| short_table(seq, position as usize))?;
            Some(self.mem(last)?.chain)
        } else {
            return Err(BackendError::Invalid(format!(
                "sequence {seq}: step at position {position}, expected {next}"
            )));
        };
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        if let Some(parent) = resumed_parent {
            s.parent = Some(parent);
            s.partial.clear();
        }
        let mut pos = position as usize;
        for &t in tokens {
            s.partial.push(t);
            pos += 1;
            if s.partial.len() == bs {
                let block = *table
                    .get((pos - 1) / bs)
                    .ok_or_else(|| short_table(seq, pos))?;
                let chain = chain_hash(s.parent, &s.partial);
                self.blocks.write(block, chain, bs as u32)?;
                s.parent = Some(chain);
                s.partial.clear();
            }
        }
        if !s.partial.is_empty() {
            let block = *table.get(pos / bs).ok_or_else(|| short_table(seq, pos))?;
            self.blocks.write(
                block,
                chain_hash(s.parent, &s.partial),
                s.partial.len() as u32,
            )?;
        }
        s.next = pos as u32;
        Ok(())
    }
}

/// Statistics for a simulated token: deterministic in the sequence and position, spread like a
/// small model's (most steps confident, a tail of uncertain ones). Nothing in the sim's tokens
/// depends on them; they exist so routing code runs on the sim engine.
fn synthetic_stats(digest: u64, position: u32) -> TokenStats {
    let v = xxhash_rust::xxh3::xxh3_64_with_seed(&position.to_le_bytes(), digest ^ 0x5354_4154);
    let u = (v >> 11) as f64 / (1u64 << 53) as f64;
    let prob = (1.0 - u * u) as f32;
    TokenStats {
        prob,
        entropy: -prob.ln() * 2.0 + (1.0 - prob) * 3.0,
        margin: (2.0 * prob - 1.0).max(0.0),
    }
}

fn outside(block: BlockId) -> BackendError {
    BackendError::Invalid(format!("block {block} is outside the pool"))
}

fn unknown(seq: SeqId) -> BackendError {
    BackendError::Invalid(format!("sequence {seq} was not started"))
}

fn short_table(seq: SeqId, pos: usize) -> BackendError {
    BackendError::Invalid(format!("sequence {seq}: no block for position {pos}"))
}

impl Backend for SimBackend {
    type Blocks = SimBlocks;

    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn blocks(&self) -> Arc<SimBlocks> {
        self.blocks.clone()
    }

    fn start(&mut self, start: SeqStart<'_>) -> Result<(), BackendError> {
        if let Some(format) = &start.sampling.format {
            // Its tokens are a function of the text: it has no distribution to mask.
            return Err(BackendError::Invalid(format!(
                "the sim engine cannot follow a format ({})",
                format.field()
            )));
        }
        let bs = self.info.block_size as usize;
        let computed = start.computed as usize;
        let full = computed / bs;
        let parent = match full.checked_sub(1) {
            Some(last) => Some(
                self.mem(
                    *start
                        .table
                        .get(last)
                        .ok_or_else(|| short_table(start.seq, computed))?,
                )?
                .chain,
            ),
            None => None,
        };
        let mut partial = Vec::with_capacity(bs);
        partial.extend_from_slice(start.prompt.get(full * bs..computed).unwrap_or_default());
        let prompt_len = start.prompt.len() as u32;
        let digest = if start.computed >= prompt_len {
            Some(self.digest(prompt_len, start.table)?)
        } else {
            None
        };
        let s = &start.sampling;
        let salt = match s.seed {
            Some(seed) if s.temperature > 0.0 => seed,
            _ => 0,
        };
        self.seqs.insert(
            start.seq,
            SimSeq {
                parent,
                partial,
                next: start.computed,
                digest,
                salt,
                stats: start.stats,
                logprobs: s.logprobs,
            },
        );
        Ok(())
    }

    fn step(
        &mut self,
        batch: &Batch,
        sampled: &mut [Option<Sampled>],
    ) -> Result<Duration, BackendError> {
        for (i, entry) in batch.entries().iter().enumerate() {
            let table = batch.table(entry);
            let tokens = batch.tokens(entry);
            let end = entry.position + entry.len();
            if entry.position < entry.prompt_len && end >= entry.prompt_len {
                // The prompt completes in this entry (a catch-up chunk may run past it): its
                // digest is taken from the prompt's blocks before later tokens land in them.
                let (prompt, rest) = tokens.split_at((entry.prompt_len - entry.position) as usize);
                self.absorb(entry.seq, entry.position, prompt, table)?;
                let digest = self.digest(entry.prompt_len, table)?;
                if let Some(s) = self.seqs.get_mut(&entry.seq) {
                    s.digest = Some(digest);
                }
                self.absorb(entry.seq, entry.prompt_len, rest, table)?;
            } else {
                self.absorb(entry.seq, entry.position, tokens, table)?;
            }
            if !entry.sample {
                continue;
            }
            let s = self
                .seqs
                .get(&entry.seq)
                .ok_or_else(|| unknown(entry.seq))?;
            if s.digest.is_none() {
                return Err(BackendError::Invalid(format!(
                    "sequence {} decodes before its prompt",
                    entry.seq
                )));
            }
            // Every token so far: the last full block's chain and the block being filled.
            let context = chain_hash(s.parent, &s.partial) ^ s.salt;
            let token = content::token(
                context,
                end,
                self.info.vocab_size,
                self.profile.eos_probability,
            );
            debug_assert!(token == EOS_TOKEN || token >= content::FIRST_TOKEN);
            let stats = if s.stats {
                synthetic_stats(context, end)
            } else {
                TokenStats::default()
            };
            // A sim token is a function of the text before it: probability 1, the only
            // alternative worth listing.
            let logprobs = s.logprobs.map(|k| {
                Box::new(TokenLogprobs {
                    logprob: 0.0,
                    top: if k > 0 {
                        vec![(token, 0.0)]
                    } else {
                        Vec::new()
                    },
                    rank: 1,
                })
            });
            sampled[i] = Some(Sampled {
                token,
                stats,
                logprobs,
                prompt_logprobs: Vec::new(),
            });
        }
        if self.time_scale == 0.0 {
            return Ok(Duration::ZERO);
        }
        let occupancy = if batch.kv_blocks_total == 0 {
            0.0
        } else {
            f64::from(batch.kv_blocks_read) / f64::from(batch.kv_blocks_total)
        };
        // A handoff's catch-up chunk costs its extra tokens at the prefill rate on top of the
        // decode step it rides in (weights are read once for the whole chunk).
        let ms = self
            .profile
            .step_ms(batch.prefill_tokens(), batch.decode_seqs(), occupancy)
            + self
                .profile
                .prefill_context_ms(batch.prefill_context_pairs())
            + self.profile.prefill_ms.t1 * f64::from(batch.catch_up_tokens());
        Ok(Duration::from_secs_f64(
            (ms * self.time_scale / 1e3).max(0.0),
        ))
    }

    fn release(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }
}

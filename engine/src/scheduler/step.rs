//! One scheduler step, in the lock's phases around the backend's compute: tell the backend of
//! sequences started and released, build the batch (continuous batching with chunked prefill);
//! once the backend returns, free what was released meanwhile; then apply the results (tokens,
//! stop conditions, finished prefills).

use dolphin_kv_block::KvBlock;
use tokio::time::Instant;

use std::collections::{HashMap, HashSet};

use super::policy::{StepBuilder, StepLimits, Want, compose_step};
use super::seq::{Kind, Seq};
use super::state::{Core, commit_blocks, commit_blocks_through, late_hit};
use crate::backend::{Backend, Batch, KvBlocks, SeqStart};
use crate::drive::{DrivenToken, Steer};
use crate::error::{BackendError, EngineError};
use crate::kv_pool::KvPool;
use crate::types::{BlockId, FinishReason, Generated, PrefillOutput, Sampled, SeqId, SeqOutput};

/// How a sequence's step ended, decided while iterating and acted on afterwards.
#[derive(Debug)]
pub(super) enum Done {
    Finished(FinishReason),
    /// The reader dropped its stream.
    Gone,
    /// A prefill-only sequence has its first token: export and reply.
    Prefilled(Sampled),
    Failed(BackendError),
}

impl<B: Backend> Core<B> {
    /// Brings the backend up to date before a step (the loop owns it, so this runs there, with
    /// the lock held): drops the state of released sequences, then starts the sequences admitted
    /// or resumed since. A sequence the backend refuses to start fails.
    pub(super) fn sync_backend(&mut self, backend: &mut B) {
        for id in self.to_release.drain(..) {
            backend.release(id);
        }
        let mut to_start = std::mem::take(&mut self.to_start);
        for id in to_start.drain(..) {
            // Released since it was queued: nothing to start.
            let Some(seq) = self.seqs.get(&id) else {
                continue;
            };
            let started = backend.start(SeqStart {
                seq: id,
                sampling: &seq.sampling,
                prompt: &seq.tokens[..seq.prompt_len as usize],
                output: &seq.tokens[seq.prompt_len as usize..],
                table: &seq.table,
                computed: seq.computed,
                stats: seq.driver().is_some(),
            });
            if let Err(e) = started {
                self.fail(id, e);
            }
        }
        // Keep the buffer (nothing was queued meanwhile: the lock is held).
        self.to_start = to_start;
        self.tidy();
    }

    /// Fills `batch` for the next step by the scheduling policy ([`compose_step`]: every
    /// decoding sequence's one token, then multi-token work, prefill chunks and handoff
    /// catch-ups, in admission order until `max_batched_tokens` is spent). Allocates the blocks
    /// the new tokens land in (from the sequences' reservations).
    pub(super) fn build_batch(
        &mut self,
        batch: &mut Batch,
        failed: &mut Vec<(SeqId, BackendError)>,
    ) {
        batch.clear();
        self.step_commits.clear();
        let mut step = BatchBuilder {
            seqs: &mut self.seqs,
            pool: &mut self.pool,
            batch,
            failed,
            block_size: self.info.block_size,
            // A step that delayed batching may give back unrun must not leave blocks cached
            // before their KV exists, nor prompts counting on them.
            share_in_step: self.cfg.batch_wait.min_batch <= 1,
            step_commits: &mut self.step_commits,
            displaced: Vec::new(),
        };
        let limits = StepLimits {
            max_batched_tokens: self.cfg.max_batched_tokens,
            prefill_chunk_tokens: self.cfg.prefill_chunk_tokens,
            mixed_prefill_tokens: self.cfg.mixed_prefill_tokens,
        };
        compose_step(&self.running, limits, &mut step);
        // The step writes the blocks cached copies displaced: they go back when it returns.
        if !step.displaced.is_empty() {
            self.deferred.push(std::mem::take(&mut step.displaced));
        }
        batch.kv_blocks_read = batch.context_blocks(self.info.block_size);
        batch.kv_blocks_total = self.pool.total();
        for (id, e) in failed.drain(..) {
            self.fail(id, e);
        }
    }

    /// The backend returned from `batch`: blocks of sequences released meanwhile go back to the
    /// pool, and what they make room for is admitted.
    pub(super) fn step_returned(&mut self, batch: &Batch) {
        for entry in batch.entries() {
            if let Some(seq) = self.seqs.get_mut(&entry.seq) {
                seq.in_step = false;
            }
        }
        if self.deferred.is_empty() {
            return;
        }
        for table in self.deferred.drain(..) {
            self.pool.release(&table);
        }
        self.admit_waiting();
    }

    /// The backend failed the step: every sequence in the batch fails (their KV is in an unknown
    /// state). The prompt blocks the step cached when it scheduled them leave the cache, and the
    /// sequences admitted on them meanwhile fail too.
    pub(super) fn step_failed(&mut self, batch: &Batch, error: &BackendError) {
        tracing::warn!(error = %error, seqs = batch.len(), "backend step failed");
        metrics::counter!(crate::metrics::STEP_FAILURES_TOTAL).increment(1);
        let unwritten = std::mem::take(&mut self.step_commits);
        for &b in &unwritten {
            self.pool.forget(b);
        }
        for entry in batch.entries() {
            self.fail(
                entry.seq,
                BackendError::Invalid(format!("step failed: {error}")),
            );
        }
        if !unwritten.is_empty() {
            let unwritten: HashSet<BlockId> = unwritten.into_iter().collect();
            let holders: Vec<SeqId> = self
                .seqs
                .values()
                .filter(|s| s.table.iter().any(|b| unwritten.contains(b)))
                .map(|s| s.id)
                .collect();
            for id in holders {
                self.fail(
                    id,
                    BackendError::Invalid(format!("the step computing its prefix failed: {error}")),
                );
            }
        }
        self.tidy();
    }

    /// Applies a finished step: advances KV, caches newly full blocks, streams sampled tokens,
    /// checks stop conditions, completes prefills. Sequences cancelled while the step ran are
    /// skipped.
    pub(super) fn apply(
        &mut self,
        batch: &Batch,
        sampled: &mut [Option<Sampled>],
        failures: &mut Vec<(SeqId, BackendError)>,
        done: &mut Vec<(SeqId, Done)>,
    ) {
        let bs = self.info.block_size;
        let eos = self.info.eos_token_id;
        for (entry, token) in batch.entries().iter().zip(sampled.iter_mut()) {
            let Some(seq) = self.seqs.get_mut(&entry.seq) else {
                continue;
            };
            seq.computed += entry.len();
            commit_blocks(&mut self.pool, seq, bs);
            if let Err(e) = stream_full_blocks(self.kv.as_ref(), seq, bs) {
                done.push((entry.seq, Done::Failed(e)));
                continue;
            }
            if !entry.sample {
                continue;
            }
            let Some(token) = token.take() else {
                let e = match failures.iter().position(|(id, _)| *id == entry.seq) {
                    Some(i) => failures.swap_remove(i).1,
                    None => BackendError::Invalid("backend sampled no token".into()),
                };
                done.push((entry.seq, Done::Failed(e)));
                continue;
            };
            if let Some(d) = on_token(seq, token, eos) {
                done.push((entry.seq, d));
            }
        }
        failures.clear();
        for (id, d) in done.drain(..) {
            match d {
                Done::Finished(reason) => self.finish(id, reason),
                Done::Gone => {
                    self.release(id);
                }
                Done::Prefilled(first) => self.finish_prefill(id, first),
                Done::Failed(e) => self.fail(id, e),
            }
        }
        self.tidy();
    }

    /// Exports a prefill-only sequence's blocks from `skip_blocks` on (into the reply, or the
    /// rest of them into its stream), replies, and releases it (its full blocks stay in the
    /// prefix cache).
    fn finish_prefill(&mut self, id: SeqId, sampled: Sampled) {
        let bs = self.info.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let Kind::Prefill {
            skip_blocks,
            reply,
            stream,
            exported,
        } = &mut seq.kind
        else {
            return;
        };
        let Some(reply) = reply.take() else { return };
        let blocks_total = seq.prompt_len.div_ceil(bs);
        let first = if stream.is_some() {
            (*exported).max(*skip_blocks)
        } else {
            *skip_blocks
        };
        let mut blocks = Vec::with_capacity((blocks_total - first) as usize);
        let mut result = Ok(());
        for i in first..blocks_total {
            let filled = (seq.prompt_len - i * bs).min(bs);
            match self.kv.export_block(seq.table[i as usize], i, filled) {
                // Checksummed now, while the copy is still in cache.
                Ok(b) => blocks.push(KvBlock::new(b)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if let Some(tx) = stream.take()
            && result.is_ok()
        {
            // A receiver gone is the caller's business: it dropped the transfer.
            for b in blocks.drain(..) {
                let _ = tx.send(b);
            }
        }
        let now = Instant::now();
        let admitted = seq.admitted.unwrap_or(seq.arrived);
        let output = result.map(|()| PrefillOutput {
            first_token: sampled.token,
            first_logprobs: sampled.logprobs,
            cached_tokens: seq.cached_tokens,
            blocks,
            queued: admitted - seq.arrived,
            prefill: now - admitted,
        });
        let _ = reply.send(output.map_err(EngineError::Backend));
        self.release(id);
    }
}

/// Hands a streamed prefill's newly full blocks to its stream (they are never written again: a
/// step writes only past `computed`). The last block waits for `finish_prefill`, full or not,
/// so the stream's end and the first token come together.
fn stream_full_blocks(kv: &dyn KvBlocks, seq: &mut Seq, bs: u32) -> Result<(), BackendError> {
    let Kind::Prefill {
        skip_blocks,
        stream: Some(tx),
        exported,
        ..
    } = &mut seq.kind
    else {
        return Ok(());
    };
    let blocks_total = seq.prompt_len.div_ceil(bs);
    let full = (seq.computed / bs).min(blocks_total.saturating_sub(1));
    let start = (*exported).max(*skip_blocks);
    for i in start..full {
        let b = KvBlock::new(kv.export_block(seq.table[i as usize], i, bs)?);
        if tx.send(b).is_err() {
            // The transfer is gone; the prefill's caller will see it and cancel.
            break;
        }
    }
    *exported = (*exported).max(full);
    Ok(())
}

/// Records a sampled token; returns how the sequence ends, if it does.
fn on_token(seq: &mut Seq, sampled: Sampled, eos: Option<u32>) -> Option<Done> {
    let token = sampled.token;
    match &mut seq.kind {
        Kind::Prefill { .. } => return Some(Done::Prefilled(sampled)),
        Kind::Driven { driver, paused } => {
            let steer = driver.on_token(DrivenToken {
                token,
                stats: Some(sampled.stats),
                logprobs: sampled.logprobs.as_deref(),
                tokens: &seq.tokens,
                prompt_len: seq.prompt_len,
            });
            if steer == Steer::DropAndPause {
                *paused = true;
                return None;
            }
            *paused = steer == Steer::KeepAndPause;
            seq.tokens.push(token);
            seq.generated += 1;
            return seq.stop_reason(token, eos).map(Done::Finished);
        }
        Kind::Generate | Kind::Reserve { .. } => {}
    }
    seq.tokens.push(token);
    seq.generated += 1;
    let Some(out) = &seq.out else {
        return Some(Done::Gone);
    };
    let generated = Generated {
        id: token,
        logprobs: sampled.logprobs,
        prompt_logprobs: sampled.prompt_logprobs,
    };
    if out.try_send(SeqOutput::Token(generated)).is_err() {
        // Closed: the reader is gone. (Full cannot happen: the channel holds every message.)
        return Some(Done::Gone);
    }
    seq.stop_reason(token, eos).map(Done::Finished)
}

/// Allocates blocks until the table covers `tokens` positions.
/// The scheduler's side of [`compose_step`]: its sequences, pool and batch.
struct BatchBuilder<'a> {
    seqs: &'a mut HashMap<SeqId, Seq>,
    pool: &'a mut KvPool,
    batch: &'a mut Batch,
    failed: &'a mut Vec<(SeqId, BackendError)>,
    block_size: u32,
    /// Prompt blocks are cached as they are scheduled, so a prompt after them in the step
    /// shares them (vLLM's way; the backends write every entry's KV before attention reads).
    share_in_step: bool,
    /// The blocks cached that way in this step.
    step_commits: &'a mut Vec<BlockId>,
    /// Blocks of this step's entries that cached copies replaced in their tables (the prompt
    /// computed concurrently): the step still writes them, so they are released after it.
    displaced: Vec<BlockId>,
}

impl StepBuilder<SeqId> for BatchBuilder<'_> {
    fn want(&self, id: SeqId) -> Option<Want> {
        let seq = self.seqs.get(&id)?;
        Some(Want {
            decoding: seq.decoding(),
            tokens: seq.work().tokens,
        })
    }

    fn take(&mut self, id: SeqId, tokens: u32) -> bool {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return false;
        };
        let pos = seq.computed;
        if let Err(e) = ensure_blocks(self.pool, seq, pos + tokens, self.block_size) {
            self.failed.push((id, e));
            return false;
        }
        let work = seq.work();
        let chunk = &seq.tokens[pos as usize..(pos + tokens) as usize];
        let sample = work.sample && tokens == work.tokens;
        self.batch
            .push(id, pos, seq.prompt_len, chunk, &seq.table, sample);
        seq.in_step = true;
        if self.share_in_step && pos < seq.prompt_len {
            let from = seq.committed as usize;
            let through = (pos + tokens).min(seq.prompt_len);
            // The sequence's own blocks, before cached copies displace any: those it caches
            // are unwritten until the step returns (the rest are not cached, and forgetting
            // them after a failed step changes nothing).
            let to = ((through / self.block_size) as usize).clamp(from, seq.table.len());
            self.step_commits.extend_from_slice(&seq.table[from..to]);
            commit_blocks_through(
                self.pool,
                seq,
                self.block_size,
                through,
                &mut self.displaced,
            );
        }
        true
    }

    fn prepare(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            late_hit(self.pool, seq, self.block_size);
        }
    }
}

fn ensure_blocks(
    pool: &mut KvPool,
    seq: &mut Seq,
    tokens: u32,
    bs: u32,
) -> Result<(), BackendError> {
    super::state::take_blocks(pool, seq, tokens.div_ceil(bs))
}

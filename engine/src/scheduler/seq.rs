//! A sequence as the scheduler tracks it.

use std::sync::Arc;

use dolphin_cluster::BlockHash;
use dolphin_kv_block::KvBlock;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::drive::{DrivenEnd, SeqDriver};
use crate::error::EngineError;
use crate::types::{
    BlockId, FinishReason, PrefillOutput, Reservation, Sampling, SeqId, SeqOutput, SeqUsage,
};

/// Where a sequence is in its life.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Queued for admission.
    Waiting,
    /// Admitted through `reserve`: blocks held, KV arriving from a prefill worker.
    /// `imported[i]` is set once relative block `i` has landed.
    AwaitingKv { imported: Vec<bool> },
    /// In the batch: prefilling or decoding.
    Running,
}

/// What the caller wants back.
#[derive(Debug)]
pub(crate) enum Kind {
    /// Stream tokens on `Seq::out` (also a remote sequence after `resume`).
    Generate,
    /// Prefill only: export blocks from `skip_blocks` on and reply once the first token exists.
    Prefill {
        skip_blocks: u32,
        reply: Option<oneshot::Sender<Result<PrefillOutput, EngineError>>>,
        /// Streamed: blocks go here as they become final instead of into the reply.
        stream: Option<tokio::sync::mpsc::UnboundedSender<KvBlock>>,
        /// Streamed: blocks below this index were handed over.
        exported: u32,
    },
    /// Reserve for remote KV: reply at admission.
    Reserve {
        reply: Option<oneshot::Sender<Result<Reservation, EngineError>>>,
    },
    /// A driven sequence: every sampled token goes to the driver, which steers it.
    Driven {
        driver: Arc<dyn SeqDriver>,
        /// Paused: skipped by batches except to compute appended tokens (all but the last).
        paused: bool,
    },
}

/// One request inside the scheduler.
#[derive(Debug)]
pub(crate) struct Seq {
    pub id: SeqId,
    pub request_id: String,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: u32,
    pub sampling: Sampling,
    /// Chained hashes of the full blocks known so far (the prompt's at arrival; generated blocks
    /// are appended as they fill).
    pub hashes: Vec<BlockHash>,
    /// Blocks held, in position order.
    pub table: Vec<BlockId>,
    /// Blocks reserved in the pool and not yet in `table`.
    pub reserved: u32,
    /// Blocks needed in all (prefix hits included), fixed at arrival.
    pub blocks_needed: u32,
    /// Leading blocks already offered to the prefix cache.
    pub committed: u32,
    /// Tokens whose KV is in `table`.
    pub computed: u32,
    /// Prompt tokens found in the prefix cache (at admission, or before the first chunk).
    pub cached_tokens: u32,
    pub generated: u32,
    pub phase: Phase,
    pub kind: Kind,
    /// Output stream (`Generate` from the start; a reserved sequence from `resume`).
    pub out: Option<mpsc::Sender<SeqOutput>>,
    pub arrived: Instant,
    pub admitted: Option<Instant>,
    /// In the batch the backend is computing now: its blocks stay held until the step returns,
    /// even if the sequence is released meanwhile.
    pub in_step: bool,
}

/// Most prompt tokens a step computes for a request that asks for the prompt's log
/// probabilities: each is a row of logits the size of the vocabulary (512 rows of SmolLM2's
/// 49,152 f32 logits are 100 MB).
pub(crate) const PROMPT_SCORING_CHUNK: u32 = 512;

/// What the next step may compute for a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Work {
    /// Tokens that may be computed now.
    pub tokens: u32,
    /// Whether a token is sampled once all of them are.
    pub sample: bool,
}

impl Seq {
    /// Leading prompt blocks the prefix cache may serve: none when the request asks for the
    /// prompt's log probabilities (they need every prompt position computed).
    pub fn cacheable_blocks(&self, block_size: u32) -> usize {
        if self.sampling.prompt_logprobs.is_some() {
            return 0;
        }
        super::policy::max_cached_blocks(self.prompt_len, block_size, self.hashes.len())
    }

    /// Prompt blocks, the trailing partial one included.
    pub fn prompt_blocks(&self, block_size: u32) -> u32 {
        self.prompt_len.div_ceil(block_size)
    }

    /// Whether the prompt's KV is complete (the sequence decodes).
    pub fn prefilled(&self) -> bool {
        self.computed >= self.prompt_len
    }

    /// Tokens known and not yet computed: the prompt's rest while prefilling, the last sampled
    /// token while decoding, a handoff's appended tokens.
    pub fn pending(&self) -> u32 {
        self.tokens.len() as u32 - self.computed
    }

    /// What the next step may compute: every pending token, sampling after the last; a paused
    /// driven sequence computes all but the last pending token and samples nothing.
    pub fn work(&self) -> Work {
        let pending = self.pending();
        match self.kind {
            Kind::Driven { paused: true, .. } => Work {
                tokens: pending.saturating_sub(1),
                sample: false,
            },
            _ if self.sampling.prompt_logprobs.is_some() => {
                // Each position it computes is a row of logits to score: bounded per step.
                let tokens = pending.min(PROMPT_SCORING_CHUNK);
                Work {
                    tokens,
                    sample: tokens == pending,
                }
            }
            _ => Work {
                tokens: pending,
                sample: true,
            },
        }
    }

    /// Whether the sequence decodes: its next step is one token, sampled.
    pub fn decoding(&self) -> bool {
        self.prefilled()
            && self.work()
                == Work {
                    tokens: 1,
                    sample: true,
                }
    }

    /// The driver, for a driven sequence.
    pub fn driver(&self) -> Option<&Arc<dyn SeqDriver>> {
        match &self.kind {
            Kind::Driven { driver, .. } => Some(driver),
            _ => None,
        }
    }

    pub fn usage(&self) -> SeqUsage {
        SeqUsage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated,
            cached_tokens: self.cached_tokens,
            ..SeqUsage::default()
        }
    }

    /// The stop condition the latest generated token meets, if any.
    pub fn stop_reason(&self, token: u32, eos: Option<u32>) -> Option<FinishReason> {
        // The first `min_tokens` tokens are never end tokens (the sampler masks them; an
        // engine that does not sample, the simulated one, must not stop on one either).
        // `generated` counts `token` already.
        let may_stop = self.generated > self.sampling.min_tokens;
        if (may_stop
            && ((!self.sampling.ignore_eos && eos == Some(token))
                || self.sampling.stop_token_ids.contains(&token)))
            || self.sampling.end_after.is_some_and(|n| self.generated >= n)
        {
            Some(FinishReason::Stop)
        } else if self.generated >= self.sampling.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// Whether nobody waits for this sequence's result any more.
    pub fn abandoned(&self) -> bool {
        match &self.kind {
            Kind::Generate => self.out.as_ref().is_none_or(mpsc::Sender::is_closed),
            Kind::Prefill { reply, .. } => reply.as_ref().is_none_or(oneshot::Sender::is_closed),
            Kind::Reserve { reply } => reply.as_ref().is_none_or(oneshot::Sender::is_closed),
            // The driver cancels by request id.
            Kind::Driven { .. } => false,
        }
    }

    /// Tells the caller the sequence ended without a result (cancel, shutdown, failure).
    pub fn fail(&mut self, error: impl FnOnce() -> EngineError, output: SeqOutput) {
        if let Kind::Driven { driver, .. } = &self.kind {
            driver.on_end(match output {
                SeqOutput::Error(msg) => DrivenEnd::Failed(msg),
                _ => DrivenEnd::Cancelled,
            });
            return;
        }
        match &mut self.kind {
            Kind::Prefill { reply, .. } => {
                if let Some(tx) = reply.take() {
                    let _ = tx.send(Err(error()));
                }
            }
            Kind::Reserve { reply } => {
                if let Some(tx) = reply.take() {
                    let _ = tx.send(Err(error()));
                }
            }
            Kind::Generate | Kind::Driven { .. } => {}
        }
        if let Some(out) = self.out.take() {
            let _ = out.try_send(output);
        }
    }
}

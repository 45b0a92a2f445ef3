//! Scheduler state and request lifecycle: validation, the waiting queue, admission control,
//! load. Ending sequences is in `release.rs`, the step in `step.rs`, the remote-KV path in
//! `remote.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use dolphin_cluster::{ROOT_SEED, block_hashes_from, chain_hash_from};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::seq::{Kind, Phase, Seq};
use super::{SchedulerConfig, SchedulingPolicy};
use crate::backend::Backend;
use crate::error::{BackendError, EngineError};
use crate::kv_pool::KvPool;
use crate::metrics as m;
use crate::types::{
    BlockId, EngineInfo, KvEvent, LoadSnapshot, OutputStream, Reservation, SeqId, SeqRequest,
};

/// Everything the scheduler owns, behind one lock. The backend itself is not here: the loop owns
/// it and computes steps without the lock; what the backend must learn meanwhile (sequences to
/// start or release) is queued here for the loop.
#[derive(Debug)]
pub(crate) struct Core<B: Backend> {
    /// The backend's KV memory, for imports and exports (also while a step runs).
    pub(super) kv: Arc<B::Blocks>,
    pub(super) pool: KvPool,
    pub(super) info: EngineInfo,
    pub(super) cfg: SchedulerConfig,
    pub(super) seqs: HashMap<SeqId, Seq>,
    pub(super) by_request: HashMap<String, SeqId>,
    /// Arrival order (FCFS admission), or by priority under the priority policy.
    pub(super) waiting: VecDeque<SeqId>,
    /// Admitted and computing, in admission order, or by priority under the priority policy
    /// (may hold ids released since: see `tidy`).
    pub(super) running: Vec<SeqId>,
    /// Sequences to `start` on the backend before their first step, in order.
    pub(super) to_start: Vec<SeqId>,
    /// Started sequences released since the loop last told the backend.
    pub(super) to_release: Vec<SeqId>,
    /// Block tables of sequences released while in the running step: freed when it returns.
    pub(super) deferred: Vec<Vec<BlockId>>,
    /// Prompt blocks cached when the step being built or run scheduled them, before their KV
    /// exists: taken out of the cache again if that step fails.
    pub(super) step_commits: Vec<BlockId>,
    /// Step times by batch size.
    pub(super) profile: super::StepProfile,
    next_id: SeqId,
    events: broadcast::Sender<KvEvent>,
}

impl<B: Backend> Core<B> {
    pub(super) fn new(
        backend: &B,
        cfg: SchedulerConfig,
        events: broadcast::Sender<KvEvent>,
    ) -> Self {
        let info = backend.info().clone();
        Self {
            pool: KvPool::new(info.total_blocks, info.block_size),
            kv: backend.blocks(),
            info,
            cfg,
            seqs: HashMap::new(),
            by_request: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            to_start: Vec::new(),
            to_release: Vec::new(),
            deferred: Vec::new(),
            step_commits: Vec::new(),
            profile: super::StepProfile::default(),
            next_id: 1,
            events,
        }
    }

    /// Publishes the pool's queued events. Called with the lock held, before it is released, so
    /// a `subscribe` (also under the lock) sees each event exactly once: in its snapshot or later.
    pub(super) fn flush_events(&mut self) {
        for ev in self.pool.drain_events() {
            // An error only means nobody subscribes right now.
            let _ = self.events.send(ev);
        }
    }

    /// Snapshot of the cache plus a receiver of later events.
    pub(super) fn subscribe(&self) -> (Vec<KvEvent>, broadcast::Receiver<KvEvent>) {
        (self.pool.snapshot(), self.events.subscribe())
    }

    /// Blocks a request needs in all: the prompt, plus for decoding every generated token that
    /// gets KV (all but the last).
    fn blocks_needed(&self, req: &SeqRequest, prefill_only: bool) -> u32 {
        let p = req.prompt.len() as u64;
        let kv_tokens = if prefill_only {
            p
        } else {
            p + u64::from(req.sampling.max_tokens) - 1
        };
        kv_tokens.div_ceil(u64::from(self.info.block_size)) as u32
    }

    fn validate(&self, req: &SeqRequest, prefill_only: bool) -> Result<u32, EngineError> {
        let invalid = |msg: String| Err(EngineError::InvalidRequest(msg));
        if req.prompt.is_empty() {
            return invalid("empty prompt".into());
        }
        if req.sampling.max_tokens == 0 {
            return invalid("max_tokens must be at least 1".into());
        }
        if req.sampling.priority != 0 && self.cfg.policy == SchedulingPolicy::Fcfs {
            return invalid(format!(
                "priority {} needs a worker started with --scheduling-policy priority (this one serves in arrival order)",
                req.sampling.priority
            ));
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t >= self.info.vocab_size) {
            return invalid(format!(
                "token {t} is outside the vocabulary of {}",
                self.info.vocab_size
            ));
        }
        let total = req.prompt.len() as u64 + u64::from(req.sampling.max_tokens);
        if total > u64::from(self.info.context_length) {
            return invalid(format!(
                "prompt ({}) plus max_tokens ({}) exceeds the context length {}",
                req.prompt.len(),
                req.sampling.max_tokens,
                self.info.context_length
            ));
        }
        let needed = self.blocks_needed(req, prefill_only);
        if needed > self.pool.total() {
            return invalid(format!(
                "needs {needed} KV blocks, the pool has {}",
                self.pool.total()
            ));
        }
        if self.by_request.contains_key(&req.request_id) {
            return invalid(format!("request id {:?} is already active", req.request_id));
        }
        Ok(needed)
    }

    /// Queues a request and admits what fits. Returns its id and, for `Generate`, its stream.
    pub(super) fn enqueue(
        &mut self,
        req: SeqRequest,
        kind: Kind,
    ) -> Result<(SeqId, Option<OutputStream>), EngineError> {
        let prefill_only = matches!(kind, Kind::Prefill { .. });
        let blocks_needed = self.validate(&req, prefill_only)?;
        if req.sampling.prompt_logprobs.is_some() && !matches!(kind, Kind::Generate) {
            // They come from computing the whole prompt here and go out with the first token: a
            // prefill that ships its KV, a reservation that imports it and a driven sequence
            // (a model group's) have no such stream.
            return Err(EngineError::InvalidRequest(
                "prompt log probabilities are served only where the prompt is prefilled and decoded (generate)"
                    .into(),
            ));
        }
        if let Kind::Prefill { skip_blocks, .. } = kind {
            let blocks = (req.prompt.len() as u32).div_ceil(self.info.block_size);
            if skip_blocks > blocks {
                return Err(EngineError::InvalidRequest(format!(
                    "skip_blocks {skip_blocks} exceeds the prompt's {blocks} blocks"
                )));
            }
        }
        let (out, stream) = match kind {
            // Room for every token plus the final message: the scheduler never waits on a reader.
            Kind::Generate => {
                let (tx, rx) = mpsc::channel(req.sampling.max_tokens as usize + 2);
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut hashes = Vec::with_capacity(req.prompt.len() / self.info.block_size as usize + 1);
        // A salted request's blocks have names of their own (`Sampling::cache_root`).
        let root = req.sampling.cache_root.unwrap_or(ROOT_SEED);
        block_hashes_from(
            root,
            &req.prompt,
            self.info.block_size as usize,
            &mut hashes,
        );
        let seq = Seq {
            id,
            prompt_len: req.prompt.len() as u32,
            request_id: req.request_id,
            tokens: req.prompt,
            sampling: req.sampling,
            hashes,
            table: Vec::with_capacity(blocks_needed as usize),
            reserved: 0,
            blocks_needed,
            committed: 0,
            computed: 0,
            cached_tokens: 0,
            generated: 0,
            phase: Phase::Waiting,
            kind,
            out,
            arrived: Instant::now(),
            admitted: None,
            in_step: false,
        };
        self.by_request.insert(seq.request_id.clone(), id);
        let at = self.queue_position(self.waiting.iter(), seq.sampling.priority);
        self.seqs.insert(id, seq);
        self.waiting.insert(at, id);
        self.admit_waiting();
        if self
            .seqs
            .get(&id)
            .is_some_and(|s| s.phase == Phase::Waiting)
            && self.waiting.len() > self.cfg.max_waiting as usize
        {
            // Still queued and over the bound: refused, whatever its place in line.
            self.waiting.retain(|&w| w != id);
            if let Some(seq) = self.seqs.remove(&id) {
                self.by_request.remove(&seq.request_id);
            }
            return Err(EngineError::QueueFull);
        }
        Ok((id, stream))
    }

    /// Where a request of `priority` goes in `queue` (the waiting queue or the running list):
    /// at the end in arrival order; under the priority policy after every request of its
    /// priority or a lower value, so lower values go first and equals keep arrival order.
    /// Ids already released count as first in line.
    fn queue_position<'a>(
        &self,
        queue: impl ExactSizeIterator<Item = &'a SeqId>,
        priority: i32,
    ) -> usize {
        if self.cfg.policy == SchedulingPolicy::Fcfs {
            return queue.len();
        }
        queue
            .take_while(|id| {
                self.seqs
                    .get(id)
                    .is_none_or(|s| s.sampling.priority <= priority)
            })
            .count()
    }

    /// Adds admitted sequence `id` to the running list, where its priority puts it (the order
    /// steps prefill in; [`queue_position`](Self::queue_position)).
    pub(super) fn start_running(&mut self, id: SeqId) {
        let priority = self.seqs.get(&id).map_or(0, |s| s.sampling.priority);
        let at = self.queue_position(self.running.iter(), priority);
        self.running.insert(at, id);
    }

    /// Admits waiting requests in queue order while the pool can hold them (prompt plus
    /// `max_tokens`, reserved now so no admitted request is ever preempted). Requests whose
    /// caller is gone are dropped.
    pub(super) fn admit_waiting(&mut self) {
        while let Some(&id) = self.waiting.front() {
            if self.seqs.get(&id).is_none_or(Seq::abandoned) {
                self.waiting.pop_front();
                self.release(id);
                continue;
            }
            if !self.try_admit(id) {
                break;
            }
        }
    }

    /// Admits the head of the queue if it fits; false (nothing changed) otherwise.
    fn try_admit(&mut self, id: SeqId) -> bool {
        let bs = self.info.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return false;
        };
        let max_hits = seq.cacheable_blocks(bs);
        let hits = self.pool.match_prefix(&seq.hashes[..max_hits]);
        let new = seq.blocks_needed - hits as u32;
        if !self.pool.admit(&seq.hashes[..hits], new, &mut seq.table) {
            return false;
        }
        self.waiting.pop_front();
        seq.reserved = new;
        seq.cached_tokens = hits as u32 * bs;
        metrics::counter!(m::PREFIX_CACHE_QUERIED_TOKENS_TOTAL)
            .increment(u64::from(seq.prompt_len));
        metrics::counter!(m::PREFIX_CACHE_HIT_TOKENS_TOTAL).increment(u64::from(seq.cached_tokens));
        metrics::histogram!(m::QUEUE_SECONDS).record(seq.arrived.elapsed().as_secs_f64());
        seq.computed = seq.cached_tokens;
        seq.committed = hits as u32;
        seq.admitted = Some(Instant::now());
        tracing::debug!(seq = id, request_id = %seq.request_id, prompt = seq.prompt_len,
            cached_tokens = seq.cached_tokens, blocks = seq.blocks_needed, "admitted");
        let outcome = match seq.kind {
            Kind::Reserve { .. } => Self::admit_reserved(&mut self.pool, seq, bs),
            Kind::Generate | Kind::Prefill { .. } | Kind::Driven { .. } => {
                // The backend learns of it before its first step (the loop owns the backend).
                seq.phase = Phase::Running;
                self.to_start.push(id);
                self.start_running(id);
                Ok(true)
            }
        };
        match outcome {
            Ok(true) => {}
            Ok(false) => {
                // The reserving caller went away.
                self.release(id);
            }
            Err(e) => self.fail(id, e),
        }
        true
    }

    /// A reserved sequence gets every prompt block now (KV will be written into them) and
    /// replies with its reservation. Ok(false) if the caller is gone.
    fn admit_reserved(pool: &mut KvPool, seq: &mut Seq, bs: u32) -> Result<bool, BackendError> {
        let prompt_blocks = seq.prompt_blocks(bs);
        take_blocks(pool, seq, prompt_blocks)?;
        let cached_blocks = seq.committed;
        let expected = prompt_blocks - cached_blocks;
        seq.phase = Phase::AwaitingKv {
            imported: vec![false; expected as usize],
        };
        let reservation = Reservation {
            seq: seq.id,
            cached_blocks,
            blocks_expected: expected,
        };
        Ok(match &mut seq.kind {
            Kind::Reserve { reply } => reply
                .take()
                .is_some_and(|tx| tx.send(Ok(reservation)).is_ok()),
            _ => false,
        })
    }

    pub(super) fn load(&self) -> LoadSnapshot {
        let mut load = LoadSnapshot {
            waiting: self.waiting.len() as u32,
            free_blocks: self.pool.available(),
            total_blocks: self.pool.total(),
            ..LoadSnapshot::default()
        };
        for seq in self.seqs.values() {
            if seq.phase == Phase::Waiting {
                load.queued_prefill_tokens += u64::from(seq.prompt_len);
            } else {
                load.running += 1;
                load.active_tokens += seq.tokens.len() as u64;
                if seq.phase == Phase::Running && !seq.prefilled() {
                    load.queued_prefill_tokens +=
                        u64::from(seq.prompt_len.saturating_sub(seq.computed));
                }
            }
        }
        load
    }
}

/// Offers a sequence's newly full blocks to the prefix cache (prompt blocks and blocks filled
/// by generated tokens alike), hashing generated blocks as they fill. The sequence is in no
/// running step: the blocks that cached copies displace go back to the pool at once.
pub(super) fn commit_blocks(pool: &mut KvPool, seq: &mut Seq, bs: u32) {
    let mut displaced = Vec::new();
    commit_blocks_through(pool, seq, bs, seq.computed, &mut displaced);
    pool.release(&displaced);
}

/// Offers the blocks that the sequence's first `tokens` positions fill to the prefix cache
/// (those past `computed` are being computed by the step that scheduled them). A block whose
/// prompt another sequence computed first gives way to the cached copy (`KvPool::commit_many`)
/// and is appended to `displaced`, still referenced, for the caller to release once no running
/// step writes it.
pub(super) fn commit_blocks_through(
    pool: &mut KvPool,
    seq: &mut Seq,
    bs: u32,
    tokens: u32,
    displaced: &mut Vec<BlockId>,
) {
    let full = (tokens / bs) as usize;
    let from = seq.committed as usize;
    if from >= full {
        return;
    }
    let bs = bs as usize;
    let root = seq.sampling.cache_root.unwrap_or(ROOT_SEED);
    while seq.hashes.len() < full {
        let i = seq.hashes.len();
        let parent = i.checked_sub(1).map(|p| seq.hashes[p]);
        let block = &seq.tokens[i * bs..(i + 1) * bs];
        seq.hashes.push(chain_hash_from(root, parent, block));
    }
    let before = displaced.len();
    pool.commit_many(&mut seq.table[..full], &seq.hashes[..full], from, displaced);
    seq.committed = full as u32;
    if displaced.len() > before {
        metrics::counter!(crate::metrics::KV_BLOCKS_DEDUPLICATED_TOTAL)
            .increment((displaced.len() - before) as u64);
    }
}

/// Looks a prompt up in the prefix cache again before its first chunk, as vLLM's scheduler
/// looks when it first schedules a prompt: blocks cached since the prompt was admitted (by a
/// step since, or by an entry scheduled before it in the step being built, whose KV that step
/// writes before any attention reads it) join its hit, and the blocks it no longer computes
/// leave its reservation. Only a prompt that computes itself (not one awaiting KV or driven by
/// a handoff) and has no block of its own yet. Returns the blocks found.
pub(super) fn late_hit(pool: &mut KvPool, seq: &mut Seq, bs: u32) -> u32 {
    let fresh = seq.phase == Phase::Running
        && matches!(seq.kind, Kind::Generate | Kind::Prefill { .. })
        && seq.table.len() as u32 == seq.committed
        && seq.computed == seq.committed * bs
        && !seq.prefilled();
    if !fresh {
        return 0;
    }
    let from = seq.committed as usize;
    let max_hits = seq.cacheable_blocks(bs);
    if from >= max_hits {
        return 0;
    }
    let n = pool.extend_hit(&seq.hashes[..max_hits], from, &mut seq.table);
    if n == 0 {
        return 0;
    }
    seq.reserved -= n;
    seq.committed += n;
    seq.computed += n * bs;
    seq.cached_tokens += n * bs;
    metrics::counter!(m::PREFIX_CACHE_HIT_TOKENS_TOTAL).increment(u64::from(n * bs));
    n
}

/// Allocates reserved blocks until the sequence's table has `blocks` of them.
pub(super) fn take_blocks(
    pool: &mut KvPool,
    seq: &mut Seq,
    blocks: u32,
) -> Result<(), BackendError> {
    let need = blocks.saturating_sub(seq.table.len() as u32);
    if need > seq.reserved {
        return Err(out_of_reserved(seq.id));
    }
    let got = pool.allocate_many(need, &mut seq.table);
    seq.reserved -= got;
    if got < need {
        return Err(out_of_reserved(seq.id));
    }
    Ok(())
}

/// The pool refused a block the sequence had reserved: a scheduler bug, reported as a backend
/// failure of that one sequence rather than a panic.
pub(super) fn out_of_reserved(id: SeqId) -> BackendError {
    BackendError::Invalid(format!("sequence {id}: pool has no reserved block left"))
}

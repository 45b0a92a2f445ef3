//! Scheduler tests over a recording backend: batching policy, admission, queue bound, cancel,
//! stop conditions, cache events. Time is Tokio's paused clock: each step lasts `STEP` virtual
//! milliseconds, so interleavings are deterministic and nothing depends on the machine's speed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dolphin_cluster::block_hashes;
use parking_lot::Mutex;

use super::*;
use crate::backend::{Batch, ImportBlock, KvBlocks, SeqStart};
use crate::error::BackendError;
use crate::types::{BlockId, EngineInfo, FinishReason, Sampling, SeqOutput, SeqUsage};

const STEP: Duration = Duration::from_millis(10);
const EOS: u32 = 2;

/// One step as the backend saw it: (seq, position, new tokens, sample) per entry.
type StepLog = Vec<(SeqId, u32, u32, bool)>;

/// Tokens are `3 + position % 90` (EOS at `eos_at`); records every step.
#[derive(Debug)]
struct Recorder {
    info: EngineInfo,
    log: Arc<Mutex<Vec<StepLog>>>,
    eos_at: Option<u32>,
    /// Fails its first step (nothing is computed).
    fail_first: bool,
}

/// The recorder's KV memory: exports carry the block index, imports check the length.
#[derive(Debug)]
struct RecorderBlocks;

impl KvBlocks for RecorderBlocks {
    fn export_block(&self, _: BlockId, index: u32, filled: u32) -> Result<Bytes, BackendError> {
        Ok(Bytes::from(vec![index as u8; filled as usize]))
    }
    fn import_block(&self, import: ImportBlock<'_>, data: &[u8]) -> Result<(), BackendError> {
        if data.len() != import.tokens.len() {
            return Err(BackendError::Corrupt("length".into()));
        }
        Ok(())
    }
}

impl Backend for Recorder {
    type Blocks = RecorderBlocks;

    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn blocks(&self) -> Arc<RecorderBlocks> {
        Arc::new(RecorderBlocks)
    }
    fn start(&mut self, _: SeqStart<'_>) -> Result<(), BackendError> {
        Ok(())
    }
    fn step(
        &mut self,
        batch: &Batch,
        sampled: &mut [Option<crate::types::Sampled>],
    ) -> Result<Duration, BackendError> {
        if std::mem::take(&mut self.fail_first) {
            return Err(BackendError::Invalid("injected failure".into()));
        }
        let mut log = Vec::new();
        // Which entry writes each block: two writing one block would corrupt it.
        let mut writer = std::collections::HashMap::new();
        let bs = self.info.block_size;
        for (i, e) in batch.entries().iter().enumerate() {
            let end = e.position + e.len();
            let table = batch.table(e);
            if table.len() as u32 * bs < end {
                return Err(BackendError::Invalid(format!(
                    "seq {} has no block for position {end}",
                    e.seq
                )));
            }
            for b in e.position / bs..end.div_ceil(bs) {
                if let Some(other) = writer.insert(table[b as usize], e.seq)
                    && other != e.seq
                {
                    return Err(BackendError::Invalid(format!(
                        "seqs {other} and {} both write block {}",
                        e.seq, table[b as usize]
                    )));
                }
            }
            if e.sample {
                sampled[i] = Some(crate::types::Sampled::token(if self.eos_at == Some(end) {
                    EOS
                } else {
                    3 + end % 90
                }));
            }
            log.push((e.seq, e.position, e.len(), e.sample));
        }
        self.log.lock().push(log);
        Ok(STEP)
    }
    fn release(&mut self, _: SeqId) {}
}

struct Setup {
    total_blocks: u32,
    max_batched_tokens: u32,
    max_waiting: u32,
    eos_at: Option<u32>,
    fail_first: bool,
    policy: SchedulingPolicy,
    prefill_chunk_tokens: u32,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            total_blocks: 64,
            max_batched_tokens: 64,
            max_waiting: 8,
            eos_at: None,
            fail_first: false,
            policy: SchedulingPolicy::Fcfs,
            prefill_chunk_tokens: 0,
        }
    }
}

const BS: u32 = 4;

fn engine(s: Setup) -> (Arc<Scheduler<Recorder>>, Arc<Mutex<Vec<StepLog>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let info = EngineInfo {
        model: "test".into(),
        engine: "test",
        block_size: BS,
        total_blocks: s.total_blocks,
        kv_bytes_per_token: 1,
        kv_layout: "test".into(),
        context_length: 1024,
        vocab_size: 100,
        eos_token_id: Some(EOS),
        step_limits: None,
    };
    let backend = Recorder {
        info,
        log: log.clone(),
        eos_at: s.eos_at,
        fail_first: s.fail_first,
    };
    let cfg = SchedulerConfig {
        max_batched_tokens: s.max_batched_tokens,
        max_waiting: s.max_waiting,
        event_capacity: 64,
        policy: s.policy,
        prefill_chunk_tokens: s.prefill_chunk_tokens,
        ..SchedulerConfig::default()
    };
    (Scheduler::spawn(backend, cfg).expect("valid config"), log)
}

fn req(id: &str, prompt_len: u32, max_tokens: u32) -> SeqRequest {
    SeqRequest {
        request_id: id.into(),
        prompt: (0..prompt_len)
            .map(|i| 10 + (i * 7 + id.bytes().map(u32::from).sum::<u32>()) % 80)
            .collect(),
        sampling: Sampling {
            max_tokens,
            ..Sampling::default()
        },
    }
}

async fn collect(mut rx: OutputStream) -> (Vec<u32>, FinishReason, SeqUsage) {
    let mut tokens = Vec::new();
    while let Some(out) = rx.recv().await {
        match out {
            SeqOutput::Token(t) => tokens.push(t.id),
            SeqOutput::Finished { reason, usage } => return (tokens, reason, usage),
            SeqOutput::Error(e) => panic!("stream failed: {e}"),
        }
    }
    panic!("stream ended without Finished after {tokens:?}");
}

/// Runs the scheduler until `cond` holds (virtual time: a bounded number of steps).
async fn until(engine: &Scheduler<Recorder>, cond: impl Fn(&LoadSnapshot) -> bool) {
    for _ in 0..1000 {
        if cond(&engine.load()) {
            return;
        }
        tokio::time::sleep(STEP / 2).await;
    }
    panic!("condition never held: {:?}", engine.load());
}

fn expected_tokens(prompt_len: u32, n: u32) -> Vec<u32> {
    (prompt_len..prompt_len + n).map(|p| 3 + p % 90).collect()
}

#[tokio::test]
async fn info_carries_the_step_limits_the_scheduler_runs_with() {
    let (engine, _) = engine(Setup {
        max_batched_tokens: 48,
        ..Setup::default()
    });
    let limits = engine.info().step_limits.expect("set by the scheduler");
    assert_eq!(limits, crate::policy::StepLimits::new(48));
}

#[tokio::test(start_paused = true)]
async fn continuous_batching_mixes_prefill_and_decode() {
    let (engine, log) = engine(Setup {
        max_batched_tokens: 8,
        ..Setup::default()
    });
    let a = engine.generate(req("a", 4, 12)).await.expect("admitted");
    tokio::time::sleep(STEP * 2 + STEP / 2).await; // a is decoding now
    let b = engine.generate(req("b", 20, 3)).await.expect("admitted");
    let (ta, ra, _) = collect(a).await;
    let (tb, rb, _) = collect(b).await;
    assert_eq!((ta, ra), (expected_tokens(4, 12), FinishReason::Length));
    assert_eq!((tb, rb), (expected_tokens(20, 3), FinishReason::Length));

    let log = log.lock();
    let mut mixed = 0;
    let mut b_chunks = Vec::new();
    for step in log.iter() {
        let tokens: u32 = step.iter().map(|e| e.2).sum();
        assert!(tokens <= 8, "step over budget: {step:?}");
        let decodes = step
            .iter()
            .filter(|e| e.2 == 1 && e.3 && e.1 >= if e.0 == 1 { 4 } else { 20 })
            .count();
        let prefills = step.len() - decodes;
        if decodes > 0 && prefills > 0 {
            mixed += 1;
            // Decodes come first, then the prefill chunk takes what is left of the budget.
            assert!(step[0].0 == 1 && step[0].2 == 1, "decode first: {step:?}");
        }
        b_chunks.extend(
            step.iter()
                .filter(|e| e.0 == 2 && e.1 < 20)
                .map(|e| (e.1, e.2)),
        );
    }
    assert!(mixed >= 2, "b's prefill ran beside a's decodes: {log:?}");
    assert_eq!(b_chunks.iter().map(|c| c.1).sum::<u32>(), 20);
    assert_eq!(b_chunks[0], (0, 7), "one decode token leaves 7 of 8");
}

#[tokio::test(start_paused = true)]
async fn chunked_prefill_respects_the_budget() {
    let (engine, log) = engine(Setup {
        max_batched_tokens: 16,
        ..Setup::default()
    });
    let rx = engine.generate(req("a", 50, 2)).await.expect("admitted");
    let (tokens, _, usage) = collect(rx).await;
    assert_eq!(tokens, expected_tokens(50, 2));
    assert_eq!(
        usage,
        SeqUsage {
            prompt_tokens: 50,
            completion_tokens: 2,
            cached_tokens: 0,
            ..SeqUsage::default()
        }
    );
    let log = log.lock();
    let chunks: Vec<(u32, u32, bool)> = log.iter().flatten().map(|e| (e.1, e.2, e.3)).collect();
    assert_eq!(
        chunks,
        vec![
            (0, 16, false),
            (16, 16, false),
            (32, 16, false),
            (48, 2, true),
            (50, 1, true)
        ],
        "only the last chunk samples; then one decode"
    );
}

/// A prompt scored for its log probabilities computes at most `PROMPT_SCORING_CHUNK` tokens a
/// step (each is a row of logits), however large the step's budget.
#[tokio::test(start_paused = true)]
async fn a_scored_prompt_is_computed_in_bounded_chunks() {
    use super::seq::PROMPT_SCORING_CHUNK;
    let (engine, log) = engine(Setup {
        max_batched_tokens: 2048,
        total_blocks: 512,
        ..Setup::default()
    });
    let mut r = req("s", 1000, 2);
    r.sampling.prompt_logprobs = Some(0);
    let (tokens, _, _) = collect(engine.generate(r).await.expect("admitted")).await;
    assert_eq!(tokens, expected_tokens(1000, 2));
    let chunks: Vec<(u32, u32, bool)> = log
        .lock()
        .iter()
        .flatten()
        .map(|e| (e.1, e.2, e.3))
        .collect();
    let c = PROMPT_SCORING_CHUNK;
    assert_eq!(
        chunks,
        vec![(0, c, false), (c, 1000 - c, true), (1000, 1, true)]
    );
}

#[tokio::test(start_paused = true)]
async fn admission_waits_while_kv_is_full_then_proceeds() {
    // a needs ceil((8 + 8 - 1) / 4) = 4 blocks: the whole pool.
    let (engine, log) = engine(Setup {
        total_blocks: 4,
        ..Setup::default()
    });
    let a = engine.generate(req("a", 8, 8)).await.expect("admitted");
    let b = engine.generate(req("b", 4, 2)).await.expect("queued");
    let load = engine.load();
    assert_eq!(
        (load.running, load.waiting, load.queued_prefill_tokens),
        (1, 1, 12)
    );
    let (ta, _, _) = collect(a).await;
    assert_eq!(ta.len(), 8);
    let (tb, _, _) = collect(b).await;
    assert_eq!(tb, expected_tokens(4, 2));
    let log = log.lock();
    let last_a = log
        .iter()
        .rposition(|s| s.iter().any(|e| e.0 == 1))
        .expect("a ran");
    let first_b = log
        .iter()
        .position(|s| s.iter().any(|e| e.0 == 2))
        .expect("b ran");
    assert!(first_b > last_a, "b started only after a freed its blocks");
    assert_eq!(engine.load().free_blocks, 4);
}

/// Under the priority policy waiting requests are admitted lower value first, arrival order
/// among equals; in arrival order a priority is refused.
#[tokio::test(start_paused = true)]
async fn priority_orders_admission_where_the_policy_says_so() {
    let (engine, log) = engine(Setup {
        total_blocks: 4,
        policy: SchedulingPolicy::Priority,
        ..Setup::default()
    });
    let with = |id: &str, priority: i32| {
        let mut r = req(id, 8, 8);
        r.sampling.priority = priority;
        r
    };
    // Each needs the whole pool: one runs at a time, the others wait in line.
    let a = engine.generate(with("a", 0)).await.expect("admitted");
    let b = engine.generate(with("b", 5)).await.expect("queued");
    let c = engine.generate(with("c", -1)).await.expect("queued");
    let d = engine.generate(with("d", -1)).await.expect("queued");
    for s in [a, b, c, d] {
        collect(s).await;
    }
    let first_step = |seq: u64| {
        log.lock()
            .iter()
            .position(|s| s.iter().any(|e| e.0 == seq))
            .expect("ran")
    };
    let order: Vec<usize> = (1..=4).map(first_step).collect();
    assert!(
        order[0] < order[2] && order[2] < order[3] && order[3] < order[1],
        "{order:?}"
    );

    drop(engine);
    let (fcfs, _) = self::engine(Setup::default());
    match fcfs.generate(with("e", 1)).await {
        Err(EngineError::InvalidRequest(m)) => assert!(m.contains("--scheduling-policy"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_and_cancel_makes_room() {
    let (engine, _) = engine(Setup {
        total_blocks: 4,
        max_waiting: 1,
        ..Setup::default()
    });
    let a = engine.generate(req("a", 8, 8)).await.expect("admitted");
    let b = engine.generate(req("b", 4, 2)).await.expect("queued");
    assert!(matches!(
        engine.generate(req("c", 4, 2)).await,
        Err(EngineError::QueueFull)
    ));
    assert!(matches!(
        engine.reserve(req("c", 4, 2)).await,
        Err(EngineError::QueueFull)
    ));
    engine.cancel("b");
    let (_, reason, _) = collect(b).await;
    assert_eq!(reason, FinishReason::Cancelled);
    let c = engine.generate(req("c", 4, 2)).await.expect("room again");
    assert_eq!(engine.load().waiting, 1);
    collect(a).await;
    assert_eq!(collect(c).await.0, expected_tokens(4, 2));
}

#[tokio::test(start_paused = true)]
async fn cancel_frees_blocks_everywhere() {
    let (engine, _) = engine(Setup {
        total_blocks: 16,
        ..Setup::default()
    });
    let a = engine.generate(req("a", 10, 20)).await.expect("admitted");
    tokio::time::sleep(STEP * 3 + STEP / 2).await;
    assert!(engine.load().free_blocks < 16);
    engine.cancel("a");
    let (tokens, reason, usage) = collect(a).await;
    assert_eq!(reason, FinishReason::Cancelled);
    assert_eq!(usage.completion_tokens, tokens.len() as u32);
    assert!(tokens.len() < 20);
    let load = engine.load();
    assert_eq!((load.running, load.free_blocks), (0, 16));
    engine.cancel("a"); // unknown by now: no-op

    // A reservation, then a dropped stream, are cleaned up too.
    let r = engine.reserve(req("r", 10, 4)).await.expect("reserved");
    assert_eq!(r.blocks_expected, 3);
    assert_eq!(engine.load().running, 1);
    engine.cancel("r");
    assert!(matches!(
        engine.resume_local(r.seq).await,
        Err(EngineError::UnknownSequence(_))
    ));
    let d = engine.generate(req("d", 6, 50)).await.expect("admitted");
    tokio::time::sleep(STEP * 2).await;
    drop(d);
    until(&engine, |l| l.running == 0).await;
    assert_eq!(engine.load().free_blocks, 16);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_pending_prefill_cancels_it() {
    let (engine, _) = engine(Setup {
        max_batched_tokens: 4,
        ..Setup::default()
    });
    let slow = tokio::time::timeout(STEP, engine.prefill(req("p", 40, 1), 0)).await;
    assert!(slow.is_err(), "40 tokens at 4 per step take 10 steps");
    let load = engine.load();
    assert_eq!((load.running, load.free_blocks), (0, 64));
    let done = engine.prefill(req("p", 40, 1), 0).await.expect("prefilled");
    assert_eq!(done.first_token, 43, "3 + position 40");
    assert_eq!(done.blocks.len(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_streamed_prefill_hands_over_each_chunk_as_it_is_computed() {
    let (engine, _) = engine(Setup {
        max_batched_tokens: 8,
        ..Setup::default()
    });
    // 30 tokens, 8 per step: 4 steps; blocks of 4 from block 2 (the decode worker caches 2).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let prefill = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.prefill_streaming(req("s", 30, 1), 2, tx).await })
    };
    // After the first step (8 tokens: blocks 0-1, both skipped) nothing; after the second
    // (16 tokens) blocks 2 and 3 are out while the prefill is still running.
    let b2 = rx.recv().await.expect("block 2");
    let b3 = rx.recv().await.expect("block 3");
    assert_eq!((b2[0], b3[0], b2.len()), (2, 3, BS as usize));
    assert!(
        !prefill.is_finished(),
        "blocks arrive before the first token"
    );
    let out = prefill.await.expect("task").expect("prefilled");
    assert!(
        out.blocks.is_empty(),
        "streamed blocks are not in the reply"
    );
    let mut rest = Vec::new();
    while let Some(b) = rx.recv().await {
        rest.push(b);
    }
    // Blocks 4-7; the last holds 2 tokens (30 = 7 * 4 + 2).
    let index: Vec<u8> = rest.iter().map(|b| b[0]).collect();
    assert_eq!(index, vec![4, 5, 6, 7]);
    assert_eq!(rest[3].len(), 2);
    // The same blocks as an unstreamed prefill of the same prompt, and the same first token.
    let whole = engine.prefill(req("s", 30, 1), 2).await.expect("prefilled");
    assert_eq!(whole.first_token, out.first_token);
    let mut streamed = vec![b2, b3];
    streamed.extend(rest);
    assert_eq!(whole.blocks, streamed);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_streamed_prefill_closes_its_stream_short() {
    let (engine, _) = engine(Setup {
        max_batched_tokens: 4,
        ..Setup::default()
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let slow = tokio::time::timeout(STEP * 3, engine.prefill_streaming(req("c", 40, 1), 0, tx));
    assert!(slow.await.is_err(), "cancelled by the timeout");
    let mut got = 0;
    while rx.recv().await.is_some() {
        got += 1;
    }
    assert!(
        got < 10,
        "a cancelled prefill must not hand over all 10 blocks ({got})"
    );
    until(&engine, |l| l.running == 0).await;
    assert_eq!(engine.load().free_blocks, 64);
}

#[tokio::test(start_paused = true)]
async fn stop_conditions() {
    // EOS ends the request (and is streamed); ignore_eos runs on to max_tokens.
    let (engine, _) = engine(Setup {
        eos_at: Some(7),
        ..Setup::default()
    });
    let (tokens, reason, usage) =
        collect(engine.generate(req("a", 4, 10)).await.expect("ok")).await;
    assert_eq!((tokens, reason), (vec![7, 8, 9, EOS], FinishReason::Stop));
    assert_eq!(usage.completion_tokens, 4);
    let mut r = req("b", 4, 5);
    r.sampling.ignore_eos = true;
    let (tokens, reason, _) = collect(engine.generate(r).await.expect("ok")).await;
    assert_eq!(
        (tokens.len(), tokens[3], reason),
        (5, EOS, FinishReason::Length)
    );
    // A stop token id stops at its first occurrence.
    let mut r = req("c", 1, 10);
    r.sampling.stop_token_ids = vec![5, 6];
    let (tokens, reason, _) = collect(engine.generate(r).await.expect("ok")).await;
    assert_eq!((tokens, reason), (vec![4, 5], FinishReason::Stop));
    // min_tokens: none of the first two tokens stops the request, the third may.
    let mut r = req("c", 1, 10);
    r.sampling.stop_token_ids = vec![5, 6];
    r.sampling.min_tokens = 2;
    let (tokens, reason, _) = collect(engine.generate(r).await.expect("ok")).await;
    assert_eq!((tokens, reason), (vec![4, 5, 6], FinishReason::Stop));
    // max_tokens 1: the prefill's token is the whole answer.
    let (tokens, reason, _) = collect(engine.generate(req("d", 9, 1)).await.expect("ok")).await;
    assert_eq!((tokens, reason), (vec![12], FinishReason::Length));
}

#[tokio::test(start_paused = true)]
async fn invalid_requests_are_refused() {
    let (engine, _) = engine(Setup {
        total_blocks: 8,
        ..Setup::default()
    });
    let cases = [
        req("empty", 0, 4),
        req("zero", 4, 0),
        req("long", 1000, 100), // beyond the 1024 context
        req("big", 20, 20),     // 10 blocks > 8
        SeqRequest {
            prompt: vec![3, 100],
            ..req("vocab", 2, 2)
        },
    ];
    for r in cases {
        let id = r.request_id.clone();
        assert!(
            matches!(
                engine.generate(r).await,
                Err(EngineError::InvalidRequest(_))
            ),
            "{id}"
        );
    }
    let _a = engine.generate(req("dup", 4, 4)).await.expect("ok");
    assert!(matches!(
        engine.generate(req("dup", 4, 4)).await,
        Err(EngineError::InvalidRequest(_))
    ));
    assert!(matches!(
        engine.prefill(req("skip", 8, 1), 3).await,
        Err(EngineError::InvalidRequest(_))
    ));
    assert!(matches!(
        engine.import(999, 0, b""),
        Err(EngineError::UnknownSequence(999))
    ));
}

#[tokio::test(start_paused = true)]
async fn cache_events_and_prefix_hits() {
    let (engine, _) = engine(Setup::default());
    let (snapshot, mut events) = engine.subscribe();
    assert!(snapshot.is_empty());
    let a = req("a", 8, 6);
    let (out, _, usage) = collect(engine.generate(a.clone()).await.expect("ok")).await;
    assert_eq!(usage.cached_tokens, 0);
    // KV exists for 8 prompt + 5 generated tokens: 3 full blocks, the third of generated tokens.
    let all: Vec<u32> = a.prompt.iter().copied().chain(out).collect();
    let hashes = block_hashes(&all[..12], BS as usize);
    let mut seen = Vec::new();
    while let Ok(ev) = events.try_recv() {
        seen.push(ev);
    }
    assert_eq!(
        seen,
        vec![
            KvEvent::Stored {
                parent: None,
                hashes: hashes[..2].to_vec()
            },
            KvEvent::Stored {
                parent: Some(hashes[1]),
                hashes: vec![hashes[2]]
            },
        ]
    );
    assert_eq!(
        engine.subscribe().0,
        vec![KvEvent::Stored {
            parent: None,
            hashes: hashes.clone()
        }]
    );

    // A prompt extending a's first 12 tokens hits all three blocks (generated ones included).
    let b = SeqRequest {
        prompt: all[..14].to_vec(),
        ..req("b", 0, 2)
    };
    let (_, _, usage) = collect(engine.generate(b).await.expect("ok")).await;
    assert_eq!(usage.cached_tokens, 12);
    // A prompt equal to a's first 8 tokens keeps its last token to compute: one block cached.
    let c = SeqRequest {
        prompt: all[..8].to_vec(),
        ..req("c", 0, 2)
    };
    let (_, _, usage) = collect(engine.generate(c).await.expect("ok")).await;
    assert_eq!(usage.cached_tokens, 4);
}

/// A request whose prompt is `prefix` and then `tail`.
fn with_prefix(id: &str, prefix: &[u32], tail: &[u32], max_tokens: u32) -> SeqRequest {
    SeqRequest {
        prompt: prefix.iter().chain(tail).copied().collect(),
        ..req(id, 0, max_tokens)
    }
}

#[tokio::test(start_paused = true)]
async fn prompts_in_one_step_share_the_prefix_the_first_schedules() {
    // Three prompts over one new 12-token prefix (three blocks), queued together: they enter
    // one step, and the prefix is cached as the first is scheduled, so the two after it find
    // it (vLLM's scheduling) and compute their own two tokens alone.
    let (engine, log) = engine(Setup::default());
    let prefix: Vec<u32> = (20..32).collect();
    let streams = [
        engine
            .generate(with_prefix("a", &prefix, &[60, 61], 2))
            .await
            .expect("ok"),
        engine
            .generate(with_prefix("b", &prefix, &[62, 63], 2))
            .await
            .expect("ok"),
        engine
            .generate(with_prefix("c", &prefix, &[64, 65], 2))
            .await
            .expect("ok"),
    ];
    let mut cached = Vec::new();
    for s in streams {
        let (tokens, reason, usage) = collect(s).await;
        assert_eq!(
            (tokens, reason),
            (expected_tokens(14, 2), FinishReason::Length)
        );
        cached.push(usage.cached_tokens);
    }
    assert_eq!(cached, [0, 12, 12]);
    let first: Vec<(u32, u32, bool)> = log.lock()[0]
        .iter()
        .map(|&(_, p, n, s)| (p, n, s))
        .collect();
    assert_eq!(first, [(0, 14, true), (12, 2, true), (12, 2, true)]);
    until(&engine, |l| l.free_blocks == 64 && l.running == 0).await;
}

#[tokio::test(start_paused = true)]
async fn a_prompt_computed_twice_at_once_keeps_one_cached_copy() {
    // Two requests with one new 40-token prompt, queued together, in 6-token chunks two to a
    // step. A chunk ends mid-block, so neither finds the other's blocks before its next chunk
    // (it holds a block of its own): each step, one completes a block the other cached a step
    // before. It gives its copy up for the cached one (the step still writes it, so it goes
    // back when the step returns): one copy of the prompt is cached, both generate as if
    // alone, and every block comes back.
    let (engine, log) = engine(Setup {
        max_batched_tokens: 12,
        prefill_chunk_tokens: 6,
        ..Setup::default()
    });
    let (_, mut events) = engine.subscribe();
    let prompt: Vec<u32> = (20..60).collect();
    let streams = [
        engine
            .generate(with_prefix("a", &prompt, &[], 3))
            .await
            .expect("ok"),
        engine
            .generate(with_prefix("b", &prompt, &[], 3))
            .await
            .expect("ok"),
    ];
    for s in streams {
        let (tokens, reason, _) = collect(s).await;
        assert_eq!(
            (tokens, reason),
            (expected_tokens(40, 3), FinishReason::Length)
        );
    }
    // Both computed much of the prompt: the overlap really happened.
    let mut computed = std::collections::BTreeMap::<SeqId, u32>::new();
    for &(seq, position, len, _) in log.lock().iter().flatten() {
        if position < 40 {
            *computed.entry(seq).or_default() += len;
        }
    }
    assert!(
        computed.len() == 2 && computed.values().sum::<u32>() >= 56,
        "at least 16 tokens computed twice: {computed:?}"
    );
    until(&engine, |l| l.free_blocks == 64 && l.running == 0).await;
    // Each of the prompt's 10 blocks was stored once, and the snapshot holds one chain.
    let mut stored = Vec::new();
    while let Ok(ev) = events.try_recv() {
        if let KvEvent::Stored { hashes, .. } = ev {
            stored.extend(hashes);
        }
    }
    assert_eq!(stored, block_hashes(&prompt, BS as usize));
    let snapshot = engine.subscribe().0;
    assert_eq!(snapshot.len(), 1, "one chain: {snapshot:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failed_step_takes_what_it_cached_out_of_the_cache() {
    // The first step fails: the prefix it cached when scheduling was never computed, so it
    // leaves the cache, and the same prompt afterwards computes it all again.
    let (engine, _) = engine(Setup {
        fail_first: true,
        ..Setup::default()
    });
    let prefix: Vec<u32> = (20..32).collect();
    let a = engine
        .generate(with_prefix("a", &prefix, &[60, 61], 2))
        .await
        .expect("ok");
    let b = engine
        .generate(with_prefix("b", &prefix, &[62, 63], 2))
        .await
        .expect("ok");
    for mut s in [a, b] {
        match s.recv().await {
            Some(SeqOutput::Error(e)) => assert!(e.contains("injected"), "{e}"),
            other => panic!("expected the step's failure, got {other:?}"),
        }
    }
    until(&engine, |l| l.free_blocks == 64 && l.running == 0).await;
    assert!(engine.subscribe().0.is_empty(), "nothing cached is left");
    let again = engine
        .generate(with_prefix("c", &prefix, &[60, 61], 2))
        .await
        .expect("ok");
    let (tokens, _, usage) = collect(again).await;
    assert_eq!((tokens, usage.cached_tokens), (expected_tokens(14, 2), 0));
}

#[tokio::test(start_paused = true)]
async fn remote_path_imports_then_resumes() {
    let (engine, log) = engine(Setup::default());
    let r = engine.reserve(req("r", 10, 5)).await.expect("reserved");
    assert_eq!((r.cached_blocks, r.blocks_expected), (0, 3));
    assert!(
        matches!(
            engine.resume(r.seq, 50.into()).await,
            Err(EngineError::InvalidRequest(_))
        ),
        "blocks missing"
    );
    assert!(matches!(
        engine.import(r.seq, 3, &[0; 4]),
        Err(EngineError::CorruptKv { index: 3, .. })
    ));
    assert!(matches!(
        engine.import(r.seq, 0, &[0; 3]),
        Err(EngineError::CorruptKv { .. })
    ));
    for (i, len) in [(0, 4), (1, 4), (2, 2)] {
        engine.import(r.seq, i, &vec![0; len]).expect("import");
    }
    let (tokens, reason, _) =
        collect(engine.resume(r.seq, 50.into()).await.expect("resumed")).await;
    assert_eq!(
        (tokens[0], &tokens[1..], reason),
        (50, &expected_tokens(11, 4)[..], FinishReason::Length)
    );
    assert!(
        log.lock().iter().flatten().all(|e| e.1 >= 10),
        "no prompt token was computed here"
    );
}

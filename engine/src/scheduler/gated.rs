//! A test backend whose steps wait at a gate the test holds shut, so a step is "running" for as
//! long as the test needs, over a KV memory that holds per slot the token whose KV it is. Every
//! step first checks that each sequence's earlier positions still hold its own tokens (so KV
//! overwritten by someone else fails the sequence), then waits at the gate, then writes its new
//! tokens: a step that wrote into blocks handed to another sequence meanwhile is caught at that
//! sequence's next step.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::{Scheduler, SchedulerConfig};
use crate::backend::{Backend, Batch, ImportBlock, KvBlocks, SeqStart};
use crate::error::BackendError;
use crate::types::{BlockId, EngineInfo, SeqId};

pub(super) const BS: u32 = 4;
/// The watchdog's patience: only reached when a call waits for the step (a failure).
const WATCHDOG: Duration = Duration::from_secs(60);

/// What happened, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Event {
    StepEntered(u32),
    StepReturned(u32),
    Test(&'static str),
}

/// A gate steps wait at while it is shut, and the log of events.
#[derive(Debug, Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    shut: bool,
    entered: u32,
    returned: u32,
    events: Vec<Event>,
}

impl Gate {
    pub(super) fn shut(&self) {
        self.state.lock().shut = true;
    }

    pub(super) fn open(&self) {
        self.state.lock().shut = false;
        self.changed.notify_all();
    }

    pub(super) fn record(&self, event: Event) {
        self.state.lock().events.push(event);
    }

    pub(super) fn events(&self) -> Vec<Event> {
        self.state.lock().events.clone()
    }

    /// Blocks until `n` steps have reached the gate.
    pub(super) fn wait_entered(&self, n: u32) {
        let mut st = self.state.lock();
        while st.entered < n {
            self.changed.wait(&mut st);
        }
    }

    /// Called by a step: waits while the gate is shut.
    fn pass(&self) -> u32 {
        let mut st = self.state.lock();
        st.entered += 1;
        let n = st.entered;
        st.events.push(Event::StepEntered(n));
        self.changed.notify_all();
        while st.shut {
            self.changed.wait(&mut st);
        }
        n
    }

    /// Fails unless the first step is still held at the gate: `call` returned while it ran.
    pub(super) fn assert_held(&self, call: &str) {
        let st = self.state.lock();
        assert!(
            st.shut && st.returned == 0,
            "{call} returned only after the step: {:?}",
            st.events
        );
    }

    fn returned(&self, n: u32) {
        let mut st = self.state.lock();
        st.returned = n;
        st.events.push(Event::StepReturned(n));
    }
}

/// Opens the gate after `WATCHDOG` unless told the calls returned.
pub(super) fn watchdog(gate: &Arc<Gate>) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let gate = gate.clone();
    std::thread::spawn(move || {
        if rx.recv_timeout(WATCHDOG).is_err() {
            gate.record(Event::Test("watchdog opened the gate"));
            gate.open();
        }
    });
    tx
}

/// KV memory: the token whose KV each slot holds.
#[derive(Debug)]
pub(super) struct Slots(Mutex<Vec<Option<u32>>>);

impl Slots {
    pub(super) fn bytes(tokens: &[u32]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }
}

impl KvBlocks for Slots {
    fn export_block(&self, block: BlockId, _: u32, filled: u32) -> Result<Bytes, BackendError> {
        let start = (block * BS) as usize;
        let slots = self.0.lock();
        let tokens: Option<Vec<u32>> = slots[start..start + filled as usize]
            .iter()
            .copied()
            .collect();
        let tokens = tokens.ok_or_else(|| BackendError::Invalid("unwritten slot".into()))?;
        Ok(Bytes::from(Self::bytes(&tokens)))
    }

    fn import_block(&self, import: ImportBlock<'_>, data: &[u8]) -> Result<(), BackendError> {
        if data != Self::bytes(import.tokens) {
            return Err(BackendError::Corrupt("not this block's tokens".into()));
        }
        let start = (import.block * BS) as usize;
        let mut slots = self.0.lock();
        for (i, &t) in import.tokens.iter().enumerate() {
            slots[start + i] = Some(t);
        }
        Ok(())
    }
}

/// Steps wait at the gate; tokens are `3 + position % 90`.
#[derive(Debug)]
pub(super) struct Gated {
    info: EngineInfo,
    gate: Arc<Gate>,
    slots: Arc<Slots>,
    /// Per started sequence, the tokens whose KV it has (prompt, then what steps fed it).
    known: HashMap<SeqId, Vec<u32>>,
}

fn slot(table: &[BlockId], pos: u32) -> usize {
    (table[(pos / BS) as usize] * BS + pos % BS) as usize
}

impl Backend for Gated {
    type Blocks = Slots;

    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn blocks(&self) -> Arc<Slots> {
        self.slots.clone()
    }
    fn start(&mut self, s: SeqStart<'_>) -> Result<(), BackendError> {
        self.known.insert(s.seq, s.prompt.to_vec());
        Ok(())
    }
    fn step(
        &mut self,
        batch: &Batch,
        sampled: &mut [Option<crate::types::Sampled>],
    ) -> Result<Duration, BackendError> {
        for e in batch.entries() {
            let known = self
                .known
                .get(&e.seq)
                .ok_or_else(|| BackendError::Invalid(format!("sequence {} not started", e.seq)))?;
            let slots = self.slots.0.lock();
            for pos in 0..e.position {
                let held = slots[slot(batch.table(e), pos)];
                if held != Some(known[pos as usize]) {
                    return Err(BackendError::Corrupt(format!(
                        "sequence {} position {pos} holds {held:?}, not {}",
                        e.seq, known[pos as usize]
                    )));
                }
            }
        }
        let n = self.gate.pass();
        for (i, e) in batch.entries().iter().enumerate() {
            let mut slots = self.slots.0.lock();
            let known = self.known.entry(e.seq).or_default();
            for (k, &t) in batch.tokens(e).iter().enumerate() {
                let pos = e.position + k as u32;
                slots[slot(batch.table(e), pos)] = Some(t);
                if pos as usize == known.len() {
                    known.push(t);
                }
            }
            if e.sample {
                sampled[i] = Some(crate::types::Sampled::token(
                    3 + (e.position + e.len()) % 90,
                ));
            }
        }
        self.gate.returned(n);
        Ok(Duration::ZERO)
    }
    fn release(&mut self, seq: SeqId) {
        self.known.remove(&seq);
    }
}

/// An engine on its own thread over a gated backend with `total_blocks` blocks.
pub(super) fn engine(total_blocks: u32, gate: &Arc<Gate>) -> Arc<Scheduler<Gated>> {
    let backend = Gated {
        info: EngineInfo {
            model: "gated".into(),
            engine: "test",
            block_size: BS,
            total_blocks,
            kv_bytes_per_token: 4,
            kv_layout: "test".into(),
            context_length: 1024,
            vocab_size: 100,
            eos_token_id: None,
            step_limits: None,
        },
        gate: gate.clone(),
        slots: Arc::new(Slots(Mutex::new(vec![None; (total_blocks * BS) as usize]))),
        known: HashMap::new(),
    };
    let cfg = SchedulerConfig {
        max_batched_tokens: 64,
        max_waiting: 8,
        event_capacity: 64,
        ..SchedulerConfig::default()
    };
    // Outside any runtime: the scheduler gets a thread, which the gate may block.
    assert!(tokio::runtime::Handle::try_current().is_err());
    Scheduler::spawn(backend, cfg).expect("valid config")
}

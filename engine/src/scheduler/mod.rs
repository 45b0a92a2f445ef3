//! The scheduler: continuous batching with chunked prefill over a paged KV pool, generic over the
//! model [`Backend`]. [`Scheduler`] is the handle the workers use (as `Arc<dyn Engine>`); the
//! loop runs on its own task and stops when the handle is dropped.
//!
//! Policy, per step: every decoding sequence contributes one token, then prompts fill the rest of
//! `max_batched_tokens` in admission order (chunked when they do not fit). A request is admitted,
//! in arrival order, only when the pool can hold its prompt plus `max_tokens`; that capacity is
//! reserved at admission, so nothing is ever preempted. At most `max_waiting` requests wait.
//!
//! Locking: one lock guards the scheduler's state (`Core`); the loop owns the backend. Each step
//! is planned under the lock (admission, backend start/release, the batch), computed by the
//! backend without it, and applied under it again. So `generate`, `cancel`, `import`, `load` and
//! the rest wait at most for a plan or an apply, never for a model step. A sequence released while
//! its step computes keeps its blocks until the step returns (see `step.rs`); for which blocks
//! imports and exports may touch meanwhile see the rule in `crate::backend`.

#[cfg(test)]
mod concurrency_tests;
mod driven;
mod driver;
#[cfg(test)]
mod gated;
mod pace;
pub mod policy;
mod release;
mod remote;
mod seq;
mod state;
mod step;
#[cfg(test)]
mod tests;

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use dolphin_kv_block::KvBlock;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{Notify, broadcast, oneshot};

pub use self::pace::{BatchWait, Lockstep, StepProfile};
use self::policy::StepLimits;
use self::seq::Kind;
use self::state::Core;
use crate::backend::Backend;
use crate::drive::{DriveStart, SeqDriver};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::types::{
    EngineInfo, Generated, KvEvent, LoadSnapshot, OutputStream, PrefillOutput, Reservation, SeqId,
    SeqRequest,
};

/// Scheduling limits.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Tokens per step (decode tokens plus prefill chunk tokens); at least 1.
    pub max_batched_tokens: u32,
    /// Most prefill tokens of one sequence per step; 0: no cap beyond the budget
    /// ([`StepLimits::prefill_chunk_tokens`](policy::StepLimits)).
    pub prefill_chunk_tokens: u32,
    /// Most prefill tokens in a step that also decodes; 0: no cap beyond the budget
    /// ([`StepLimits::mixed_prefill_tokens`](policy::StepLimits)).
    pub mixed_prefill_tokens: u32,
    /// Requests that may wait for admission; one more is `QueueFull`.
    pub max_waiting: u32,
    /// KV events buffered per subscriber before it lags.
    pub event_capacity: usize,
    /// Delayed batching (off by default); `Engine::set_batch_wait` changes it at run time.
    pub batch_wait: BatchWait,
    /// Lockstep rounds shared with other schedulers (the lockstep baseline); `None` runs free.
    pub lockstep: Option<Arc<Lockstep>>,
    /// A modeled link that imported KV crosses before its sequence decodes (the simulated
    /// engine's); `None`: only the real transfer's time counts.
    pub link: Option<LinkModel>,
    /// The order requests are admitted and prefilled in.
    pub policy: SchedulingPolicy,
}

/// The order a scheduler admits requests in, and prefills the admitted ones in (vLLM's
/// `--scheduling-policy`). Nothing admitted is preempted either way: its KV is reserved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// Arrival order; a request that names a priority other than 0 is refused.
    #[default]
    Fcfs,
    /// By each request's priority, lower first (vLLM's), arrival order among equals.
    Priority,
}

impl std::str::FromStr for SchedulingPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(SchedulingPolicy::Fcfs),
            "priority" => Ok(SchedulingPolicy::Priority),
            other => Err(format!(
                "scheduling policy must be fcfs or priority, got {other:?}"
            )),
        }
    }
}

/// The link a simulated engine charges imported KV for, whatever bytes really moved: the
/// simulated model's bytes per token at the simulated link's rate, scaled like its steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    /// KV bytes per token of the simulated model.
    pub bytes_per_token: u64,
    /// Link bandwidth, Gb/s (positive).
    pub gbps: f64,
    /// Multiplies the time, like the engine's step durations.
    pub time_scale: f64,
}

impl LinkModel {
    /// Time to move `tokens` tokens of KV.
    pub fn time(&self, tokens: u32) -> std::time::Duration {
        crate::sim::line_time(u64::from(tokens) * self.bytes_per_token, self.gbps)
            .mul_f64(self.time_scale.max(0.0))
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batched_tokens: 2048,
            prefill_chunk_tokens: 0,
            mixed_prefill_tokens: 0,
            max_waiting: 256,
            event_capacity: 4096,
            batch_wait: BatchWait::OFF,
            lockstep: None,
            link: None,
            policy: SchedulingPolicy::Fcfs,
        }
    }
}

/// State shared by the handle and the loop.
#[derive(Debug)]
struct Shared<B: Backend> {
    core: Mutex<Core<B>>,
    /// Wakes the idle loop: new work, resumed sequences, freed capacity, shutdown.
    notify: Notify,
    shutdown: AtomicBool,
}

impl<B: Backend> Shared<B> {
    fn lock(&self) -> Locked<'_, B> {
        Locked(self.core.lock())
    }
}

/// The core, locked; publishes the KV events queued meanwhile when released.
struct Locked<'a, B: Backend>(MutexGuard<'a, Core<B>>);

impl<B: Backend> Deref for Locked<'_, B> {
    type Target = Core<B>;
    fn deref(&self) -> &Core<B> {
        &self.0
    }
}

impl<B: Backend> DerefMut for Locked<'_, B> {
    fn deref_mut(&mut self) -> &mut Core<B> {
        &mut self.0
    }
}

impl<B: Backend> Drop for Locked<'_, B> {
    fn drop(&mut self) {
        self.0.flush_events();
    }
}

/// The engine over a backend: implements [`Engine`].
#[derive(Debug)]
pub struct Scheduler<B: Backend> {
    shared: Arc<Shared<B>>,
    info: EngineInfo,
}

impl<B: Backend> Scheduler<B> {
    /// Starts the scheduler loop over `backend`: on the current Tokio runtime when there is one,
    /// else on a dedicated thread with its own runtime.
    pub fn spawn(backend: B, cfg: SchedulerConfig) -> Result<Arc<Self>, EngineError> {
        let bi = backend.info();
        let config = |msg: &str| Err(EngineError::Config(msg.to_string()));
        if bi.block_size == 0 || bi.total_blocks == 0 {
            return config("block_size and total_blocks must be at least 1");
        }
        if cfg.max_batched_tokens == 0 {
            return config("max_batched_tokens must be at least 1");
        }
        if cfg.event_capacity == 0 {
            return config("event_capacity must be at least 1");
        }
        let info = EngineInfo {
            step_limits: Some(StepLimits {
                max_batched_tokens: cfg.max_batched_tokens,
                prefill_chunk_tokens: cfg.prefill_chunk_tokens,
                mixed_prefill_tokens: cfg.mixed_prefill_tokens,
            }),
            ..bi.clone()
        };
        let (events, _) = broadcast::channel(cfg.event_capacity);
        let shared = Arc::new(Shared {
            core: Mutex::new(Core::new(&backend, cfg, events)),
            notify: Notify::new(),
            shutdown: AtomicBool::new(false),
        });
        let task = driver::run(shared.clone(), backend);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(task);
            }
            Err(_) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .map_err(|e| EngineError::Config(format!("scheduler runtime: {e}")))?;
                std::thread::Builder::new()
                    .name("dolphin-scheduler".into())
                    .spawn(move || rt.block_on(task))
                    .map_err(|e| EngineError::Config(format!("scheduler thread: {e}")))?;
            }
        }
        Ok(Arc::new(Self { shared, info }))
    }

    fn check_running(&self) -> Result<(), EngineError> {
        if self.shared.shutdown.load(Ordering::Acquire) {
            return Err(EngineError::Shutdown);
        }
        Ok(())
    }

    /// Queues a request that answers on a oneshot, cancelling it if the caller stops waiting.
    async fn enqueue_and_wait<T>(
        &self,
        req: SeqRequest,
        kind: impl FnOnce(oneshot::Sender<Result<T, EngineError>>) -> Kind,
    ) -> Result<T, EngineError> {
        self.check_running()?;
        let (tx, rx) = oneshot::channel();
        let request_id = req.request_id.clone();
        let (id, _) = self.shared.lock().enqueue(req, kind(tx))?;
        self.shared.notify.notify_one();
        let guard = CancelOnDrop {
            shared: &self.shared,
            request_id: &request_id,
            seq: id,
            armed: true,
        };
        let result = rx.await;
        guard.disarm();
        result.unwrap_or(Err(EngineError::Shutdown))
    }
}

impl<B: Backend> Drop for Scheduler<B> {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.notify.notify_one();
    }
}

/// Cancels a queued `prefill` / `reserve` whose caller dropped the future before the reply.
struct CancelOnDrop<'a, B: Backend> {
    shared: &'a Shared<B>,
    request_id: &'a str,
    seq: SeqId,
    armed: bool,
}

impl<B: Backend> CancelOnDrop<'_, B> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<B: Backend> Drop for CancelOnDrop<'_, B> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut core = self.shared.lock();
        // Only if the id still names this request (not a later one reusing it).
        if core.by_request.get(self.request_id) == Some(&self.seq) {
            core.cancel(self.request_id);
        }
    }
}

#[async_trait::async_trait]
impl<B: Backend> Engine for Scheduler<B> {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    async fn generate(&self, req: SeqRequest) -> Result<OutputStream, EngineError> {
        self.check_running()?;
        let (_, stream) = self.shared.lock().enqueue(req, Kind::Generate)?;
        self.shared.notify.notify_one();
        stream.ok_or(EngineError::Shutdown)
    }

    async fn prefill(
        &self,
        req: SeqRequest,
        skip_blocks: u32,
    ) -> Result<PrefillOutput, EngineError> {
        self.enqueue_and_wait(req, |tx| Kind::Prefill {
            skip_blocks,
            reply: Some(tx),
            stream: None,
            exported: skip_blocks,
        })
        .await
    }

    async fn prefill_streaming(
        &self,
        req: SeqRequest,
        skip_blocks: u32,
        blocks: tokio::sync::mpsc::UnboundedSender<KvBlock>,
    ) -> Result<PrefillOutput, EngineError> {
        self.enqueue_and_wait(req, |tx| Kind::Prefill {
            skip_blocks,
            reply: Some(tx),
            stream: Some(blocks),
            exported: skip_blocks,
        })
        .await
    }

    async fn reserve(&self, req: SeqRequest) -> Result<Reservation, EngineError> {
        self.enqueue_and_wait(req, |tx| Kind::Reserve { reply: Some(tx) })
            .await
    }

    fn import(&self, seq: SeqId, index: u32, data: &[u8]) -> Result<(), EngineError> {
        self.check_running()?;
        self.shared.lock().import(seq, index, data)
    }

    async fn resume(&self, seq: SeqId, first: Generated) -> Result<OutputStream, EngineError> {
        self.check_running()?;
        let charge = {
            let core = self.shared.lock();
            core.cfg
                .link
                .map(|link| core.awaited_tokens(seq).map(|t| link.time(t)))
                .transpose()?
        };
        if let Some(delay) = charge.filter(|d| !d.is_zero()) {
            // The blocks cross the modeled link: they stay reserved, the sequence waits.
            tokio::time::sleep(delay).await;
            self.check_running()?;
        }
        let rx = self.shared.lock().resume(seq, first)?;
        self.shared.notify.notify_one();
        Ok(rx)
    }

    async fn resume_local(&self, seq: SeqId) -> Result<OutputStream, EngineError> {
        self.check_running()?;
        let rx = self.shared.lock().resume_local(seq)?;
        self.shared.notify.notify_one();
        Ok(rx)
    }

    fn cancel(&self, request_id: &str) {
        if self.shared.lock().cancel(request_id) {
            // Freed capacity may have admitted waiting requests.
            self.shared.notify.notify_one();
        }
    }

    fn subscribe(&self) -> (Vec<KvEvent>, broadcast::Receiver<KvEvent>) {
        self.shared.lock().subscribe()
    }

    fn load(&self) -> LoadSnapshot {
        self.shared.lock().load()
    }

    fn set_batch_wait(&self, wait: BatchWait) -> Result<(), EngineError> {
        if wait.min_batch == 0 {
            return Err(EngineError::InvalidRequest(
                "batch wait needs a batch of at least 1".into(),
            ));
        }
        self.shared.lock().cfg.batch_wait = wait;
        self.shared.notify.notify_one();
        Ok(())
    }

    fn step_profile(&self) -> StepProfile {
        self.shared.lock().profile.clone()
    }

    async fn drive(
        &self,
        req: SeqRequest,
        start: DriveStart,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<SeqId, EngineError> {
        self.check_running()?;
        let id = self.shared.lock().drive(req, start, driver)?;
        self.shared.notify.notify_one();
        Ok(id)
    }

    fn append(&self, seq: SeqId, tokens: &[u32], resume: bool) -> Result<(), EngineError> {
        self.check_running()?;
        self.shared.lock().append(seq, tokens, resume)?;
        self.shared.notify.notify_one();
        Ok(())
    }

    async fn resume_driven(
        &self,
        seq: SeqId,
        first: Generated,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        self.check_running()?;
        self.shared.lock().resume_driven(seq, first, driver)?;
        self.shared.notify.notify_one();
        Ok(())
    }

    async fn resume_local_driven(
        &self,
        seq: SeqId,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        self.check_running()?;
        self.shared.lock().resume_local_driven(seq, driver)?;
        self.shared.notify.notify_one();
        Ok(())
    }
}

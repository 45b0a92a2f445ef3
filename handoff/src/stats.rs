//! A model group's counters: tokens and handoffs per subserver, resume latency. Exported as
//! metrics (names in `crate::metrics`) and read by benchmarks and the batch-wait planner.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics as m;

/// Counters of one subserver.
#[derive(Debug, Default)]
struct PerModel {
    tokens: AtomicU64,
    handoffs_from: AtomicU64,
    resumes: AtomicU64,
    resume_ns: AtomicU64,
    /// Live requests whose sequence here waits paused for a peer.
    pending: AtomicI64,
}

/// Counters of a model group.
#[derive(Debug)]
pub struct GroupStats {
    names: Arc<[String]>,
    models: Vec<PerModel>,
    requests: AtomicU64,
}

/// A snapshot of one subserver's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelCounters {
    /// Accepted tokens it wrote in finished requests.
    pub tokens: u64,
    /// Handoffs away from it.
    pub handoffs_from: u64,
    /// Handoffs to it whose first token arrived.
    pub resumes: u64,
    /// Mean time from a handoff to the peer's first token.
    pub mean_resume: Duration,
}

impl GroupStats {
    pub(crate) fn new(names: Arc<[String]>) -> Self {
        Self {
            models: names.iter().map(|_| PerModel::default()).collect(),
            names,
            requests: AtomicU64::new(0),
        }
    }

    /// A request started on `active`: its sequences elsewhere wait.
    pub(crate) fn started(&self, active: usize) {
        self.shift_pending(active, 1);
    }

    /// A request that was on `active` ended.
    pub(crate) fn ended(&self, active: usize) {
        self.shift_pending(active, -1);
    }

    fn shift_pending(&self, active: usize, by: i64) {
        for (i, c) in self.models.iter().enumerate() {
            if i != active {
                c.pending.fetch_add(by, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn handoff(&self, from: usize, to: usize) {
        self.models[from].pending.fetch_add(1, Ordering::Relaxed);
        self.models[to].pending.fetch_sub(1, Ordering::Relaxed);
        self.models[from]
            .handoffs_from
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::HANDOFFS_TOTAL, "subserver" => self.names[from].clone()).increment(1);
    }

    pub(crate) fn resumed(&self, model: usize, took: Duration) {
        let c = &self.models[model];
        c.resumes.fetch_add(1, Ordering::Relaxed);
        c.resume_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        metrics::histogram!(m::HANDOFF_RESUME_SECONDS, "subserver" => self.names[model].clone())
            .record(took.as_secs_f64());
    }

    pub(crate) fn finished(&self, written: &[u32]) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        for (i, &t) in written.iter().enumerate() {
            self.models[i]
                .tokens
                .fetch_add(u64::from(t), Ordering::Relaxed);
            metrics::counter!(m::SUBSERVER_TOKENS_TOTAL, "subserver" => self.names[i].clone())
                .increment(u64::from(t));
        }
    }

    /// Live requests whose sequence in subserver `model` waits paused for a peer.
    pub fn pending(&self, model: usize) -> u64 {
        self.models[model].pending.load(Ordering::Relaxed).max(0) as u64
    }

    /// Requests finished (or ended) so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Counters of subserver `model`.
    pub fn model(&self, model: usize) -> ModelCounters {
        let c = &self.models[model];
        let resumes = c.resumes.load(Ordering::Relaxed);
        let ns = c.resume_ns.load(Ordering::Relaxed);
        ModelCounters {
            tokens: c.tokens.load(Ordering::Relaxed),
            handoffs_from: c.handoffs_from.load(Ordering::Relaxed),
            resumes,
            mean_resume: Duration::from_nanos(ns.checked_div(resumes).unwrap_or(0)),
        }
    }

    /// Per subserver: the chance that a step of it ends in a handoff away (handoffs over tokens
    /// written plus dropped), as the batch-wait planner needs it; `None` before any token.
    pub fn handoff_rates(&self) -> Vec<Option<f64>> {
        (0..self.models.len())
            .map(|i| {
                let c = self.model(i);
                let steps = c.tokens + c.handoffs_from;
                (steps > 0).then(|| c.handoffs_from as f64 / steps as f64)
            })
            .collect()
    }
}

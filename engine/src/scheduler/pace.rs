//! Pacing of the scheduler loop: delayed batching (wait for `min_batch` ready sequences, at most
//! `max_wait`) and lockstep rounds (the lockstep baseline: every member's step starts together
//! and lasts as long as the slowest one's), plus the measured step-time profile.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

/// Delayed batching: step only once `min_batch` sequences are ready, or after `max_wait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchWait {
    /// Ready sequences a step waits for (1: step at once).
    pub min_batch: u32,
    /// The longest a ready sequence waits for others.
    pub max_wait: Duration,
}

impl BatchWait {
    /// No waiting.
    pub const OFF: BatchWait = BatchWait {
        min_batch: 1,
        max_wait: Duration::ZERO,
    };
}

impl Default for BatchWait {
    fn default() -> Self {
        Self::OFF
    }
}

/// Members starting a step within this long of a round's start join that round.
const JOIN_WINDOW: Duration = Duration::from_micros(500);

/// Synchronized steps across several schedulers (the lockstep baseline of token-level routing:
/// one batch over both models, each step as slow as the slower model). A member starting a step
/// while a round is under way waits for it to end, then opens or joins the next; every member of a
/// round applies its results when the last one's step is done.
#[derive(Debug, Default)]
pub struct Lockstep {
    round: Mutex<Round>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Round {
    started: Option<Instant>,
    /// Latest deadline of the round's members so far.
    end: Option<Instant>,
    /// Members whose step has not reported its deadline yet.
    computing: u32,
    /// Members still waiting for the round to end.
    members: u32,
}

impl Lockstep {
    /// A new clock (share one `Arc` among the members' scheduler configs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits until this member may start a step, and enters the round.
    pub(super) async fn begin(&self) {
        loop {
            let notified = self.changed.notified();
            {
                let mut r = self.round.lock();
                let now = Instant::now();
                let open = r.members == 0;
                let joinable = r
                    .started
                    .is_some_and(|s| now.saturating_duration_since(s) <= JOIN_WINDOW);
                if open || joinable {
                    if open {
                        r.started = Some(now);
                        r.end = Some(now);
                    }
                    r.members += 1;
                    r.computing += 1;
                    return;
                }
            }
            notified.await;
        }
    }

    /// This member's step is computed and would end at `deadline`: waits until every member of
    /// the round is done and the latest deadline has passed, then leaves the round.
    pub(super) async fn finish(&self, deadline: Instant) {
        {
            let mut r = self.round.lock();
            r.end = Some(r.end.map_or(deadline, |e| e.max(deadline)));
            r.computing -= 1;
        }
        self.changed.notify_waiters();
        loop {
            let notified = self.changed.notified();
            let (computing, end) = {
                let r = self.round.lock();
                (r.computing, r.end)
            };
            if computing == 0 {
                if let Some(end) = end {
                    sleep_until(end).await;
                }
                break;
            }
            notified.await;
        }
        let mut r = self.round.lock();
        r.members -= 1;
        if r.members == 0 {
            r.started = None;
        }
        drop(r);
        self.changed.notify_waiters();
    }
}

/// Measured step times by batch size (sequences in the step), for planning delayed batching.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepProfile {
    /// `(batch size, steps, total seconds)` per batch size seen, ascending.
    pub by_batch: Vec<(u32, u64, f64)>,
}

impl StepProfile {
    pub(super) fn record(&mut self, batch: u32, took: Duration) {
        let secs = took.as_secs_f64();
        match self.by_batch.binary_search_by_key(&batch, |e| e.0) {
            Ok(i) => {
                let e = &mut self.by_batch[i];
                e.1 += 1;
                e.2 += secs;
            }
            Err(i) => self.by_batch.insert(i, (batch, 1, secs)),
        }
    }

    /// Mean step time of `batch`-sized steps, if any were seen.
    pub fn mean(&self, batch: u32) -> Option<Duration> {
        let i = self.by_batch.binary_search_by_key(&batch, |e| e.0).ok()?;
        let (_, n, total) = self.by_batch[i];
        Some(Duration::from_secs_f64(total / n as f64))
    }

    /// Steps recorded.
    pub fn steps(&self) -> u64 {
        self.by_batch.iter().map(|e| e.1).sum()
    }
}

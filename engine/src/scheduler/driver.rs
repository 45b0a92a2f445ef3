//! The scheduler loop, on its own task, owning the backend: plan a step under the lock (admit,
//! bring the backend up to date, build the batch), hold it back while delayed batching waits for
//! more ready sequences, compute it without the lock, free what was released meanwhile, wait out
//! its simulated duration (and, in lockstep, the round's slowest member), apply the results;
//! sleep while there is nothing to do.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::Shared;
use crate::backend::{Backend, Batch};
use crate::metrics as m;

/// How far behind its deadlines the loop may fall and still keep the schedule (catching up by
/// shortening the next sleeps); beyond it the schedule restarts from now instead of bursting.
const MAX_LAG: Duration = Duration::from_millis(50);

/// Runs until the engine handle is dropped.
pub(super) async fn run<B: Backend>(shared: Arc<Shared<B>>, mut backend: B) {
    let mut batch = Batch::default();
    let mut sampled = Vec::new();
    let mut failed = Vec::new();
    let mut done = Vec::new();
    // Sequences the backend failed alone in a step (`Backend::take_failures`).
    let mut failures = Vec::new();
    // When the next step starts if the loop stays busy: the previous step's deadline, so time
    // spent scheduling does not add up step after step.
    let mut next_start: Option<Instant> = None;
    // Since when ready sequences wait for delayed batching to fill a step.
    let mut waiting_since: Option<Instant> = None;
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            let mut core = shared.lock();
            core.shutdown();
            core.sync_backend(&mut backend);
            return;
        }
        let (wait, lockstep) = {
            let mut core = shared.lock();
            core.admit_waiting();
            core.sync_backend(&mut backend);
            core.build_batch(&mut batch, &mut failed);
            (core.cfg.batch_wait, core.cfg.lockstep.clone())
        };
        if batch.is_empty() {
            next_start = None;
            waiting_since = None;
            shared.notify.notified().await;
            continue;
        }
        if (batch.len() as u32) < wait.min_batch {
            let since = *waiting_since.get_or_insert_with(Instant::now);
            let deadline = since + wait.max_wait;
            if Instant::now() < deadline {
                // Not enough ready yet: give the batch back and wait for more or the bound.
                shared.lock().step_returned(&batch);
                next_start = None;
                tokio::select! {
                    () = shared.notify.notified() => {}
                    () = sleep_until(deadline) => {}
                }
                continue;
            }
        }
        waiting_since = None;
        if let Some(clock) = &lockstep {
            clock.begin().await;
        }
        sampled.clear();
        sampled.resize(batch.len(), None);
        failures.clear();
        let started = Instant::now();
        // The model computes without the lock: callers are served meanwhile.
        let result = backend.step(&batch, &mut sampled);
        let duration = {
            let mut core = shared.lock();
            core.step_returned(&batch);
            result.map_err(|e| core.step_failed(&batch, &e))
        };
        backend.take_failures(&mut failures);
        let Ok(duration) = duration else {
            if let Some(clock) = &lockstep {
                clock.finish(Instant::now()).await;
            }
            continue;
        };
        if duration.is_zero() {
            next_start = None;
            if let Some(clock) = &lockstep {
                clock.finish(Instant::now()).await;
            } else {
                // Zero-delay mode: let the callers' tasks run between steps.
                tokio::task::yield_now().await;
            }
        } else {
            let now = Instant::now();
            let start = next_start
                .filter(|s| now.saturating_duration_since(*s) <= MAX_LAG && lockstep.is_none())
                .unwrap_or(started);
            let deadline = start + duration;
            match &lockstep {
                Some(clock) => clock.finish(deadline).await,
                None => sleep_until(deadline).await,
            }
            next_start = Some(deadline);
        }
        let took = started.elapsed();
        metrics::histogram!(m::STEP_SECONDS).record(took.as_secs_f64());
        metrics::histogram!(m::BATCH_SIZE).record(batch.len() as f64);
        metrics::histogram!(m::BATCH_TOKENS).record(f64::from(batch.token_count()));
        let mut core = shared.lock();
        core.profile.record(batch.len() as u32, took);
        core.apply(&batch, &mut sampled, &mut failures, &mut done);
    }
}

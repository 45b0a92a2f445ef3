//! The scheduler loop, on its own task, owning the backend: plan a step under the lock (admit,
//! bring the backend up to date, build the batch), compute it without the lock, free what was
//! released meanwhile, wait out its simulated duration, apply the results; sleep while there is
//! nothing to do.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::Shared;
use crate::backend::{Backend, Batch};

/// How far behind its deadlines the loop may fall and still keep the schedule (catching up by
/// shortening the next sleeps); beyond it the schedule restarts from now instead of bursting.
const MAX_LAG: Duration = Duration::from_millis(50);

/// Runs until the engine handle is dropped.
pub(super) async fn run<B: Backend>(shared: Arc<Shared<B>>, mut backend: B) {
    let mut batch = Batch::default();
    let mut sampled: Vec<Option<u32>> = Vec::new();
    let mut failed = Vec::new();
    let mut done = Vec::new();
    // When the next step starts if the loop stays busy: the previous step's deadline, so time
    // spent scheduling does not add up step after step.
    let mut next_start: Option<Instant> = None;
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            let mut core = shared.lock();
            core.shutdown();
            core.sync_backend(&mut backend);
            return;
        }
        {
            let mut core = shared.lock();
            core.admit_waiting();
            core.sync_backend(&mut backend);
            core.build_batch(&mut batch, &mut failed);
        }
        if batch.is_empty() {
            next_start = None;
            shared.notify.notified().await;
            continue;
        }
        sampled.clear();
        sampled.resize(batch.len(), None);
        // The model computes without the lock: callers are served meanwhile.
        let result = backend.step(&batch, &mut sampled);
        let duration = {
            let mut core = shared.lock();
            core.step_returned(&batch);
            match result {
                Ok(d) => d,
                Err(e) => {
                    core.step_failed(&batch, &e);
                    continue;
                }
            }
        };
        if duration.is_zero() {
            // Zero-delay mode: let the callers' tasks run between steps.
            next_start = None;
            tokio::task::yield_now().await;
        } else {
            let now = Instant::now();
            let start = next_start
                .filter(|s| now.saturating_duration_since(*s) <= MAX_LAG)
                .unwrap_or(now);
            let deadline = start + duration;
            sleep_until(deadline).await;
            next_start = Some(deadline);
        }
        shared.lock().apply(&batch, &sampled, &mut done);
    }
}

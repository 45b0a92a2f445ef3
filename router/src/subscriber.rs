//! One task per worker that follows its `Worker.Subscribe` stream into the prefix index.
//!
//! The stream starts with a snapshot of every cached block, so on each (re)connect the worker's
//! old entries are dropped first. While the stream is down the worker's entries are kept but
//! marked stale (gauge and log line), and the task reconnects with exponential backoff. A gap in
//! the event sequence numbers means events were lost: the task reconnects for a fresh snapshot.

use std::sync::Arc;
use std::time::Duration;

use dolphin_proto::v1::{self, worker_event::Event};

use crate::metrics as m;
use crate::workers::{SharedPool, WorkerHandle};

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Starts the subscriber task of `worker`; it ends when the worker's cancel token fires.
pub(crate) fn spawn(worker: Arc<WorkerHandle>, pool: SharedPool, load_interval_ms: u32) {
    tokio::spawn(run(worker, pool, load_interval_ms));
}

async fn run(worker: Arc<WorkerHandle>, pool: SharedPool, load_interval_ms: u32) {
    let cancel = worker.cancel.clone();
    let mut delay = BACKOFF_MIN;
    loop {
        let why = tokio::select! {
            _ = cancel.cancelled() => return,
            why = follow_once(&worker, &pool, load_interval_ms, &mut delay) => why,
        };
        if worker.events_live() {
            metrics::counter!(m::EVENT_STREAM_DISCONNECTS_TOTAL, "role" => worker.role.as_str())
                .increment(1);
            tracing::warn!(worker = %worker.id, reason = %why, "worker event stream down; its index entries are stale until it reconnects");
        } else {
            tracing::debug!(worker = %worker.id, reason = %why, "worker event stream not connected");
        }
        worker.set_events_live(false);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(BACKOFF_MAX);
    }
}

/// Connects once and applies events until the stream breaks; returns why it stopped.
async fn follow_once(
    worker: &WorkerHandle,
    pool: &SharedPool,
    load_interval_ms: u32,
    delay: &mut Duration,
) -> String {
    let mut client = worker.channel().worker();
    let mut stream = match client
        .subscribe(v1::SubscribeRequest { load_interval_ms })
        .await
    {
        Ok(resp) => resp.into_inner(),
        Err(status) => return format!("subscribe failed: {}", status.message()),
    };
    // The stream opens with a full snapshot: forget what we had.
    {
        let mut p = pool.write();
        p.index.clear_slot(worker.slot);
        // The snapshot is exact again: drop the estimates made while the stream was down.
        p.approx.forget(worker.slot);
    }
    *delay = BACKOFF_MIN;
    if !worker.events_live() {
        tracing::info!(worker = %worker.id, "worker event stream connected");
    }
    worker.set_events_live(true);
    let mut expected: Option<u64> = None;
    loop {
        let ev = match stream.message().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return "stream ended".into(),
            Err(status) => return format!("stream error: {}", status.message()),
        };
        if let Some(want) = expected
            && ev.seq != want
        {
            metrics::counter!(m::EVENT_GAPS_TOTAL).increment(1);
            return format!("event gap: expected seq {want}, got {}", ev.seq);
        }
        expected = Some(ev.seq.wrapping_add(1));
        apply(worker, pool, ev.event);
    }
}

/// Applies one event to the index or the worker's load.
pub(crate) fn apply(worker: &WorkerHandle, pool: &SharedPool, event: Option<Event>) {
    let kind = match event {
        Some(Event::Stored(s)) => {
            pool.write().index.stored(worker.slot, &s.block_hashes);
            "stored"
        }
        Some(Event::Removed(r)) => {
            pool.write().index.removed(worker.slot, &r.block_hashes);
            "removed"
        }
        Some(Event::Cleared(_)) => {
            pool.write().index.clear_slot(worker.slot);
            "cleared"
        }
        Some(Event::Load(l)) => {
            worker.apply_load(&l);
            // Piggyback the index-size gauge on the periodic load report: cheap and fresh enough.
            let blocks = pool.read().index.distinct_blocks();
            metrics::gauge!(m::INDEX_BLOCKS, "role" => worker.role.as_str()).set(blocks as f64);
            "load"
        }
        None => return,
    };
    metrics::counter!(m::WORKER_EVENTS_TOTAL, "kind" => kind).increment(1);
}

#[cfg(test)]
mod tests {
    use dolphin_cluster::Role;

    use crate::policy::Policy;
    use crate::request_log::RequestLog;
    use crate::testutil::{Behavior, FakeWorker, dispatcher, eventually, wait_indexed};

    #[tokio::test]
    async fn follows_snapshot_stores_and_clears_then_goes_stale() {
        let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
        // Blocks cached before the router subscribes arrive in the snapshot.
        fake.store(&[1, 2]);
        let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
        d.registry().add(fake.record()).expect("add");
        wait_indexed(&d, "d1", 2).await;
        fake.store(&[3]);
        wait_indexed(&d, "d1", 3).await;
        fake.clear();
        wait_indexed(&d, "d1", 0).await;
        fake.stop();
        eventually("stream marked stale", || {
            d.registry().list().iter().all(|w| !w.events_live)
        })
        .await;
    }
}

//! `Worker.Subscribe`: a snapshot of the prefix cache, then live cache events and periodic load
//! reports, each numbered by a per-stream `seq`.

use std::{sync::Arc, time::Duration};

use dolphin_proto::v1::{self, worker_event::Event};
use tokio::sync::{broadcast::error::RecvError, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::{events, metrics as m, state::WorkerState};

/// Messages buffered per subscriber before the feed waits for it (and, waiting long enough,
/// falls behind the engine's event channel and resynchronizes).
const STREAM_BUFFER: usize = 256;
/// Shortest load interval a subscriber may ask for: faster reports cost more than they tell.
pub const MIN_LOAD_INTERVAL: Duration = Duration::from_millis(10);

/// The stream type of `Worker.Subscribe`.
pub type SubscribeStream = ReceiverStream<Result<v1::WorkerEvent, Status>>;

/// The load interval a subscriber gets for `requested_ms` (0: the default).
pub fn load_interval(requested_ms: u32, default: Duration) -> Duration {
    if requested_ms == 0 {
        default
    } else {
        Duration::from_millis(u64::from(requested_ms)).max(MIN_LOAD_INTERVAL)
    }
}

/// Starts feeding one subscriber; the feed ends when the subscriber goes away or the worker stops.
pub fn subscribe(state: Arc<WorkerState>, interval: Duration) -> SubscribeStream {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(feed(state, interval, tx));
    ReceiverStream::new(rx)
}

/// Numbers and sends events; gives up when the subscriber or the worker goes away.
struct Emitter {
    tx: mpsc::Sender<Result<v1::WorkerEvent, Status>>,
    state: Arc<WorkerState>,
    /// The next event's number; streams start at 1, so 0 can mean "nothing seen yet".
    next_seq: u64,
}

impl Emitter {
    /// Sends one event; false when the stream is over.
    async fn send(&mut self, event: Event) -> bool {
        let message = v1::WorkerEvent {
            seq: self.next_seq,
            worker_id: self.state.identity().id.0.clone(),
            event: Some(event),
        };
        self.next_seq += 1;
        // A subscriber that stops reading must not keep the worker from shutting down.
        tokio::select! {
            sent = self.tx.send(Ok(message)) => sent.is_ok(),
            () = self.state.closing().cancelled() => false,
        }
    }

    /// Sends a cache snapshot, one event per stored run of blocks.
    async fn send_all(&mut self, events: Vec<dolphin_engine::KvEvent>) -> bool {
        for event in events {
            if !self.send(events::kv_event(event)).await {
                return false;
            }
        }
        true
    }

    async fn send_load(&mut self) -> bool {
        let engine = self.state.engine();
        let load = engine.load();
        let max_batched_tokens = engine
            .info()
            .step_limits
            .map_or(0, |l| l.max_batched_tokens);
        let draining = self.state.admission().is_draining();
        self.send(events::load_report(load, max_batched_tokens, draining))
            .await
    }
}

/// Keeps the subscriber gauge true however the feed ends.
struct SubscriberGauge;

impl SubscriberGauge {
    fn open() -> Self {
        metrics::gauge!(m::WORKER_SUBSCRIBERS).increment(1.0);
        SubscriberGauge
    }
}

impl Drop for SubscriberGauge {
    fn drop(&mut self) {
        metrics::gauge!(m::WORKER_SUBSCRIBERS).decrement(1.0);
    }
}

async fn feed(
    state: Arc<WorkerState>,
    interval: Duration,
    tx: mpsc::Sender<Result<v1::WorkerEvent, Status>>,
) {
    let _gauge = SubscriberGauge::open();
    let closing = state.closing().clone();
    let (snapshot, mut live) = state.engine().subscribe();
    let mut out = Emitter {
        tx,
        state,
        next_seq: 1,
    };
    if !out.send_all(snapshot).await {
        return;
    }
    let mut ticker = tokio::time::interval(interval);
    // After a stall, one report is as good as a burst of stale ones.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let open = tokio::select! {
            () = closing.cancelled() => false,
            () = out.tx.closed() => false,
            event = live.recv() => match event {
                Ok(event) => out.send(events::kv_event(event)).await,
                Err(RecvError::Lagged(missed)) => {
                    // The subscriber fell so far behind that events were dropped. Rather than
                    // leave a hole in its view, start it over: clear, then a fresh snapshot
                    // taken atomically with a fresh feed.
                    tracing::warn!(missed, "subscriber fell behind; resending the cache snapshot");
                    metrics::counter!(m::WORKER_SUBSCRIBE_RESYNCS_TOTAL).increment(1);
                    let (snapshot, fresh) = out.state.engine().subscribe();
                    live = fresh;
                    out.send(Event::Cleared(v1::AllBlocksCleared {})).await
                        && out.send_all(snapshot).await
                }
                // The engine is gone: nothing more will happen on this worker.
                Err(RecvError::Closed) => false,
            },
            _ = ticker.tick() => out.send_load().await,
        };
        if !open {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_interval_uses_the_default_for_zero_and_clamps_tiny_values() {
        let default = Duration::from_millis(200);
        assert_eq!(load_interval(0, default), default);
        assert_eq!(load_interval(1, default), MIN_LOAD_INTERVAL);
        assert_eq!(load_interval(1500, default), Duration::from_millis(1500));
    }
}

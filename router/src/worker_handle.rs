//! One live worker as the router sees it: address, channel, load figures, event-stream state,
//! and this router's own in-flight count on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use dolphin_cluster::{KvCompat, KvMismatch, Role, WorkerId, WorkerRecord};
use dolphin_proto::v1;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::selection;
use crate::worker_channel::WorkerChannel;

/// How long a worker whose call failed at the transport is passed over, unless its event stream
/// reconnects first.
pub const UNREACHABLE_BACKOFF_MS: u64 = 5_000;

/// Milliseconds since the router's first call (monotonic, never 0 after the first).
fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

/// Load figures of one worker, from its latest load report.
#[derive(Debug, Default)]
struct Load {
    running: AtomicU32,
    waiting: AtomicU32,
    free_blocks: AtomicU32,
    total_blocks: AtomicU32,
    active_tokens: AtomicU64,
    queued_prefill_tokens: AtomicU64,
    max_batched_tokens: AtomicU32,
    draining: AtomicBool,
}

/// One live worker.
#[derive(Debug)]
pub struct WorkerHandle {
    /// The worker's id.
    pub id: WorkerId,
    /// Prefill or decode.
    pub role: Role,
    /// gRPC address, `host:port`.
    pub grpc_addr: String,
    /// KV transfer listener of a decode worker.
    pub kv_addr: Option<String>,
    /// Slot in its pool's prefix index.
    pub slot: usize,
    /// Build version, model, block size and KV layout: a prefill and a decode worker are
    /// paired only when theirs are equal.
    pub compat: KvCompat,
    /// The registry's number for `compat`: equal numbers, equal `compat` (one integer compare
    /// per candidate on the request path instead of four field compares).
    compat_id: u32,
    block_size: u32,
    channel: WorkerChannel,
    load: Load,
    events_live: AtomicBool,
    /// Until when (milliseconds on [`clock_ms`]) the worker is passed over: a call to it failed
    /// at the transport (refused, reset, unavailable). Cleared when its event stream connects.
    unreachable_until_ms: AtomicU64,
    /// Requests this router has in flight on the worker, and their prompt tokens: a load signal
    /// that is never stale, unlike the periodic reports.
    inflight_requests: AtomicU32,
    inflight_tokens: AtomicU64,
    /// Cancelled when the worker leaves: stops its subscriber task.
    pub(crate) cancel: CancellationToken,
}

impl WorkerHandle {
    /// The worker's channel (connects on first use, reconnects as needed).
    pub fn channel(&self) -> &WorkerChannel {
        &self.channel
    }

    /// Load term of the selection cost, in block units: tokens held (the larger of the worker's
    /// report and this router's own in-flight prompts) over the block size, plus queued requests.
    pub fn load_cost(&self) -> f64 {
        let reported = self.load.active_tokens.load(Ordering::Relaxed);
        let own = self.inflight_tokens.load(Ordering::Relaxed);
        selection::load_cost(reported.max(own), self.waiting(), self.block_size)
    }

    /// Requests waiting in the worker's queue, per its latest report.
    pub fn waiting(&self) -> u32 {
        self.load.waiting.load(Ordering::Relaxed)
    }

    /// Whether the worker said it is draining.
    pub fn draining(&self) -> bool {
        self.load.draining.load(Ordering::Relaxed)
    }

    /// Whether the worker's event stream is connected (else its index entries may be stale).
    pub fn events_live(&self) -> bool {
        self.events_live.load(Ordering::Relaxed)
    }

    /// Whether a recent call found the worker unreachable (routing passes it over).
    pub fn unreachable(&self) -> bool {
        // Never marked (0) needs no clock: routing asks this of every worker of a pool per
        // request, and a clock read costs more than the rest of a candidate's figures.
        let until = self.unreachable_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        if until > clock_ms() {
            return true;
        }
        // Expired: forgotten, so later checks need no clock either (unless marked again since).
        let _ = self.unreachable_until_ms.compare_exchange(
            until,
            0,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        false
    }

    /// Passes the worker over for [`UNREACHABLE_BACKOFF_MS`] or until its event stream
    /// connects, whichever is first: a dead worker that the registry still lists (static
    /// membership, or an etcd lease that has not expired yet) stops drawing requests and
    /// migrations at once.
    pub(crate) fn mark_unreachable(&self) {
        self.unreachable_until_ms
            .store(clock_ms() + UNREACHABLE_BACKOFF_MS, Ordering::Relaxed);
    }

    /// Counts a request against the worker until the guard is dropped.
    pub fn begin_request(self: &Arc<Self>, prompt_tokens: u32) -> InflightGuard {
        self.inflight_requests.fetch_add(1, Ordering::Relaxed);
        self.inflight_tokens
            .fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
        InflightGuard {
            worker: self.clone(),
            tokens: u64::from(prompt_tokens),
        }
    }

    pub(crate) fn apply_load(&self, r: &v1::LoadReport) {
        self.load.running.store(r.running, Ordering::Relaxed);
        self.load.waiting.store(r.waiting, Ordering::Relaxed);
        self.load
            .free_blocks
            .store(r.free_blocks, Ordering::Relaxed);
        self.load
            .total_blocks
            .store(r.total_blocks, Ordering::Relaxed);
        self.load
            .active_tokens
            .store(r.active_tokens, Ordering::Relaxed);
        self.load
            .queued_prefill_tokens
            .store(r.queued_prefill_tokens, Ordering::Relaxed);
        self.load
            .max_batched_tokens
            .store(r.max_batched_tokens, Ordering::Relaxed);
        self.load.draining.store(r.draining, Ordering::Relaxed);
    }

    /// Prompt tokens waiting to be prefilled and the most one step computes, per the latest
    /// report (the second is 0 until a report says).
    pub fn prefill_backlog(&self) -> (u64, u32) {
        (
            self.load.queued_prefill_tokens.load(Ordering::Relaxed),
            self.load.max_batched_tokens.load(Ordering::Relaxed),
        )
    }

    /// Share of the KV pool in use (committed to admitted requests or reserved for them), per
    /// the latest report; `None` before one.
    pub fn kv_usage(&self) -> Option<f64> {
        let total = self.load.total_blocks.load(Ordering::Relaxed);
        let free = self.load.free_blocks.load(Ordering::Relaxed).min(total);
        (total > 0).then(|| f64::from(total - free) / f64::from(total))
    }

    /// Marks the event stream up or down; keeps the stale-stream gauge in step.
    pub(crate) fn set_events_live(&self, live: bool) {
        if live {
            self.unreachable_until_ms.store(0, Ordering::Relaxed);
        }
        let was = self.events_live.swap(live, Ordering::Relaxed);
        if was != live {
            let g = metrics::gauge!(m::STALE_EVENT_STREAMS, "role" => self.role.as_str());
            if live {
                g.decrement(1.0)
            } else {
                g.increment(1.0)
            }
        }
    }
}

/// Keeps a request counted against a worker's load; dropping it ends the count.
#[derive(Debug)]
pub struct InflightGuard {
    worker: Arc<WorkerHandle>,
    tokens: u64,
}

impl InflightGuard {
    /// The worker the request runs on.
    pub fn worker(&self) -> &Arc<WorkerHandle> {
        &self.worker
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.worker
            .inflight_requests
            .fetch_sub(1, Ordering::Relaxed);
        self.worker
            .inflight_tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

impl WorkerHandle {
    /// A handle for `rec` in pool slot `slot`, with its event stream not yet connected.
    pub(crate) fn new(
        rec: &WorkerRecord,
        slot: usize,
        channel: WorkerChannel,
        compat_id: u32,
    ) -> Self {
        let handle = WorkerHandle {
            id: rec.id.clone(),
            role: rec.role,
            grpc_addr: rec.grpc_addr.clone(),
            kv_addr: rec.kv_addr.clone(),
            slot,
            compat: rec.kv_compat(),
            compat_id,
            block_size: rec.block_size,
            channel,
            load: Load::default(),
            events_live: AtomicBool::new(true),
            unreachable_until_ms: AtomicU64::new(0),
            inflight_requests: AtomicU32::new(0),
            inflight_tokens: AtomicU64::new(0),
            cancel: CancellationToken::new(),
        };
        // Counted as stale until the first snapshot arrives.
        handle.set_events_live(false);
        handle
    }

    /// The worker's status for `RouterAdmin.ListWorkers` (`indexed_blocks` is the caller's).
    pub fn status(&self, indexed_blocks: u64) -> v1::WorkerStatus {
        v1::WorkerStatus {
            worker_id: self.id.0.clone(),
            role: i32::from(self.role),
            grpc_addr: self.grpc_addr.clone(),
            kv_addr: self.kv_addr.clone().unwrap_or_default(),
            running: self.load.running.load(Ordering::Relaxed),
            waiting: self.load.waiting.load(Ordering::Relaxed),
            free_blocks: self.load.free_blocks.load(Ordering::Relaxed),
            total_blocks: self.load.total_blocks.load(Ordering::Relaxed),
            indexed_blocks,
            events_live: self.events_live(),
            draining: self.draining(),
            version: self.compat.version.clone(),
            kv_layout: self.compat.kv_layout.clone(),
        }
    }

    /// Whether this (prefill) worker's KV may go to `decode`; else why not.
    pub fn pairs_with(&self, decode: &WorkerHandle) -> Result<(), KvMismatch> {
        if self.compat_id == decode.compat_id {
            return Ok(());
        }
        self.compat.check(&decode.compat)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dolphin_cluster::Role;
    use dolphin_tls::GrpcConnector;

    use super::*;

    #[tokio::test]
    async fn an_unreachable_mark_holds_until_it_expires_and_is_then_forgotten() {
        let rec = crate::testutil::worker_record("d1", Role::Decode, "127.0.0.1:9");
        let connector = GrpcConnector::plain(Duration::from_millis(200));
        let channel = WorkerChannel::new(&rec.grpc_addr, &connector).expect("channel");
        let w = WorkerHandle::new(&rec, 0, channel, 0);
        assert!(!w.unreachable());
        w.mark_unreachable();
        assert!(w.unreachable());
        // A mark whose time has passed (as if set long ago).
        w.unreachable_until_ms.store(1, Ordering::Relaxed);
        assert!(!w.unreachable());
        assert_eq!(
            w.unreachable_until_ms.load(Ordering::Relaxed),
            0,
            "forgotten"
        );
        // The event stream connecting clears a mark at once.
        w.mark_unreachable();
        w.set_events_live(true);
        assert!(!w.unreachable());
    }
}

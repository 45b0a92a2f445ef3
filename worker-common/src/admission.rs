//! Admission control for a worker's request handlers: counts running requests, refuses new ones
//! once the worker drains, and lets the shutdown path wait for the running ones to finish.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;

/// The worker refuses new requests because it is draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the worker is draining and takes no new requests")]
pub struct Draining;

/// Running-request counter with a drain switch, shared by every handler of one worker.
#[derive(Debug, Default)]
pub struct Admission {
    draining: AtomicBool,
    inflight: AtomicUsize,
    idle: Notify,
    /// Cancelled when the drain grace period runs out: handlers still running give up.
    abort: CancellationToken,
}

impl Admission {
    /// A fresh gate that admits requests.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Admits one request, or refuses it when the worker drains. The request counts as running
    /// until the returned guard is dropped.
    pub fn try_admit(self: &Arc<Self>) -> Result<AdmissionGuard, Draining> {
        // Count first, then look at the flag: with both operations SeqCst, either `drain` sees
        // this request in the counter (and waits for it) or this request sees the flag (and
        // leaves). Checking the flag first would let a request slip in after the drain saw zero.
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let mut guard = AdmissionGuard {
            admission: Arc::clone(self),
            counted: false,
        };
        if self.draining.load(Ordering::SeqCst) {
            return Err(Draining);
        }
        metrics::gauge!(m::WORKER_INFLIGHT_REQUESTS).increment(1.0);
        guard.counted = true;
        Ok(guard)
    }

    /// Stops admitting requests. Returns whether this call started the drain.
    pub fn start_drain(&self) -> bool {
        !self.draining.swap(true, Ordering::SeqCst)
    }

    /// Whether the worker drains.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Requests running now.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// Waits until no request runs, at most `grace`. Returns whether the worker became idle.
    pub async fn wait_idle(&self, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Register interest before reading the counter so a guard dropped in between
            // still wakes us.
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inflight() == 0 {
                return true;
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => return self.inflight() == 0,
            }
        }
    }

    /// Tells running requests to give up (the grace period is over).
    pub fn abort_running(&self) {
        self.abort.cancel();
    }

    /// Completes when running requests are told to give up.
    pub fn aborted(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.abort.cancelled()
    }

    /// A token cancelled when running requests must give up, for tasks that outlive a borrow.
    pub fn abort_token(&self) -> CancellationToken {
        self.abort.clone()
    }
}

/// One admitted request; dropping it marks the request finished.
#[derive(Debug)]
pub struct AdmissionGuard {
    admission: Arc<Admission>,
    /// Whether the in-flight gauge counts this request (refused ones never do).
    counted: bool,
}

impl AdmissionGuard {
    /// A token cancelled when the worker's drain grace period runs out.
    pub fn abort_token(&self) -> CancellationToken {
        self.admission.abort_token()
    }
}

impl Drop for AdmissionGuard {
    fn drop(&mut self) {
        if self.counted {
            metrics::gauge!(m::WORKER_INFLIGHT_REQUESTS).decrement(1.0);
        }
        if self.admission.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.admission.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_admitted_requests_until_dropped() {
        let gate = Admission::new();
        let a = gate.try_admit().expect("admits");
        let b = gate.try_admit().expect("admits");
        assert_eq!(gate.inflight(), 2);
        drop(a);
        assert_eq!(gate.inflight(), 1);
        drop(b);
        assert_eq!(gate.inflight(), 0);
    }

    #[test]
    fn refuses_after_drain_without_leaking_a_count() {
        let gate = Admission::new();
        assert!(gate.start_drain());
        assert!(!gate.start_drain(), "second drain is not a new one");
        assert_eq!(gate.try_admit().unwrap_err(), Draining);
        assert_eq!(gate.inflight(), 0);
        assert!(gate.is_draining());
    }

    #[tokio::test]
    async fn wait_idle_returns_once_the_last_request_ends() {
        let gate = Admission::new();
        let guard = gate.try_admit().expect("admits");
        gate.start_drain();
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.wait_idle(Duration::from_secs(3600)).await })
        };
        tokio::task::yield_now().await;
        drop(guard);
        assert!(waiter.await.expect("joins"));
    }

    #[tokio::test]
    async fn wait_idle_gives_up_after_the_grace_period() {
        let gate = Admission::new();
        // The guard lives across the wait, so the answer cannot depend on timing.
        let _guard = gate.try_admit().expect("admits");
        assert!(!gate.wait_idle(Duration::from_millis(20)).await);
    }

    #[tokio::test]
    async fn abort_reaches_admitted_requests() {
        let gate = Admission::new();
        let guard = gate.try_admit().expect("admits");
        let token = guard.abort_token();
        assert!(!token.is_cancelled());
        gate.abort_running();
        token.cancelled().await;
        gate.aborted().await;
    }
}

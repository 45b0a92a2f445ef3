//! A worker's side: a leased record kept alive, and restored whenever it is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{BACKOFF_MAX, BACKOFF_MIN, EtcdConfig, connect, deadline};
use crate::backoff::Backoff;
use crate::discovery::DiscoveryError;
use crate::keys::worker_key;
use crate::telemetry::ETCD_REREGISTRATIONS_TOTAL;
use crate::worker::WorkerRecord;

/// No lease held (etcd never grants lease 0).
const NO_LEASE: i64 = 0;

/// A worker's membership in etcd: its record under
/// [`worker_key`](crate::worker_key), attached to a lease that a background task keeps alive.
///
/// When the lease is lost (expired during a network cut, revoked by an operator) or the key is
/// deleted, the task grants a new lease and writes the record again, with backoff, until
/// [`shutdown`](Registration::shutdown) is called or the `Registration` is dropped. Dropping it
/// stops the keep-alive without revoking: the worker leaves membership when the lease expires
/// (as if the process had crashed). Call `shutdown` to leave at once.
pub struct Registration {
    key: String,
    client: Client,
    /// The lease the task currently holds, [`NO_LEASE`] while it holds none.
    lease: Arc<AtomicI64>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Registration {
    /// Grants a lease, writes the record under worker_key (create-if-absent transaction),
    /// keeps the lease alive; when the lease is lost (expired, etcd restarted, network cut) it
    /// re-grants and re-registers, with backoff, until `shutdown` is called or it is dropped.
    ///
    /// Fails with [`DiscoveryError::AlreadyRegistered`] if another live lease holds the key
    /// (two workers with one id), or with an etcd error or timeout if etcd is unreachable.
    pub async fn register(
        cfg: &EtcdConfig,
        record: WorkerRecord,
    ) -> Result<Registration, DiscoveryError> {
        let client = connect(cfg).await?;
        let key = worker_key(&cfg.cluster, record.role, &record.id);
        let value = serde_json::to_vec(&record).map_err(|source| DiscoveryError::Parse {
            what: format!("record for {key}"),
            source,
        })?;
        let lease = Arc::new(AtomicI64::new(NO_LEASE));
        let mut keeper = Keeper {
            client: client.clone(),
            key: key.clone(),
            value,
            ttl_secs: cfg.lease_ttl_secs,
            lease: lease.clone(),
        };
        let revision = match keeper.establish().await {
            Ok(revision) => revision,
            Err(err) => {
                keeper.abandon().await;
                return Err(err);
            }
        };
        tracing::info!(key = %key, lease = lease.load(Ordering::Relaxed), "registered in etcd");
        let stop = CancellationToken::new();
        let task = tokio::spawn(keeper.run(revision, stop.clone()));
        Ok(Registration {
            key,
            client,
            lease,
            stop,
            task: Some(task),
        })
    }

    /// The etcd key this registration holds.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Revokes the lease so the worker leaves membership at once.
    pub async fn shutdown(mut self) -> Result<(), DiscoveryError> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // The task only ends by cancellation; a panic in it has been logged by tokio.
            let _ = task.await;
        }
        let lease = self.lease.swap(NO_LEASE, Ordering::Relaxed);
        if lease == NO_LEASE {
            return Ok(());
        }
        match deadline("lease revoke", self.client.lease_revoke(lease)).await {
            Ok(_) => {
                tracing::info!(key = %self.key, "left etcd membership");
                Ok(())
            }
            // Already expired or revoked: the record is gone either way.
            Err(DiscoveryError::Etcd(etcd_client::Error::GRpcStatus(status)))
                if status.code() == tonic::Code::NotFound =>
            {
                Ok(())
            }
            Err(err) => Err(err),
        }
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .field("lease", &self.lease.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The background task's state: everything needed to (re)write the record.
struct Keeper {
    client: Client,
    key: String,
    value: Vec<u8>,
    ttl_secs: i64,
    /// Shared with [`Registration`] so `shutdown` revokes whatever lease is current.
    lease: Arc<AtomicI64>,
}

/// Why a healthy session ended.
enum Lost {
    /// etcd says the lease no longer exists: grant a new one.
    Lease,
    /// The connection or a stream broke, or the key was deleted: check the lease, rewrite.
    Connection,
}

impl Keeper {
    /// Keeps the registration alive until `stop` is cancelled.
    async fn run(mut self, mut revision: i64, stop: CancellationToken) {
        let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        loop {
            let lost = tokio::select! {
                _ = stop.cancelled() => return,
                lost = self.keep_alive(revision, &mut backoff) => lost,
            };
            match lost {
                Lost::Lease => {
                    tracing::warn!(key = %self.key, "etcd lease lost; registering again");
                    self.lease.store(NO_LEASE, Ordering::Relaxed);
                }
                Lost::Connection => tracing::info!(key = %self.key, "etcd session interrupted"),
            }
            // Restore lease and record, retrying with backoff while etcd is unreachable.
            loop {
                let attempt = tokio::select! {
                    _ = stop.cancelled() => return,
                    attempt = self.establish() => attempt,
                };
                match attempt {
                    Ok(rev) => {
                        tracing::info!(key = %self.key, lease = self.lease.load(Ordering::Relaxed),
                            "etcd registration restored");
                        revision = rev;
                        break;
                    }
                    Err(err) => tracing::warn!(key = %self.key, error = %err,
                        source = ?std::error::Error::source(&err), "etcd registration failed; retrying"),
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }

    /// Makes sure a live lease exists and the record is written with it; returns the revision
    /// at which the record was seen in place.
    async fn establish(&mut self) -> Result<i64, DiscoveryError> {
        let mut lease = self.lease.load(Ordering::Relaxed);
        if lease != NO_LEASE {
            let ttl = deadline("lease ttl", self.client.lease_time_to_live(lease, None)).await?;
            if ttl.ttl() <= 0 {
                lease = NO_LEASE;
                self.lease.store(NO_LEASE, Ordering::Relaxed);
            }
        }
        if lease == NO_LEASE {
            let granted =
                deadline("lease grant", self.client.lease_grant(self.ttl_secs, None)).await?;
            lease = granted.id();
            // Published before the record is written so `shutdown` can revoke it.
            self.lease.store(lease, Ordering::Relaxed);
            metrics::counter!(ETCD_REREGISTRATIONS_TOTAL).increment(1);
        }
        self.put_if_absent(lease).await
    }

    /// Create-if-absent: writes the record only if the key does not exist, in one transaction;
    /// an existing key is fine only if it is attached to our own lease.
    async fn put_if_absent(&mut self, lease: i64) -> Result<i64, DiscoveryError> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.as_str(),
                self.value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(self.key.as_str(), None)]);
        let response = deadline("register txn", self.client.txn(txn)).await?;
        let revision = response.header().map(|h| h.revision()).unwrap_or(0);
        if response.succeeded() {
            return Ok(revision);
        }
        let holder = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.lease()),
            _ => None,
        });
        match holder {
            Some(holder) if holder == lease => Ok(revision),
            _ => Err(DiscoveryError::AlreadyRegistered {
                key: self.key.clone(),
            }),
        }
    }

    /// Best-effort revoke of a lease granted by a registration that then failed.
    async fn abandon(&mut self) {
        let lease = self.lease.swap(NO_LEASE, Ordering::Relaxed);
        if lease != NO_LEASE {
            let _ = deadline("lease revoke", self.client.lease_revoke(lease)).await;
        }
    }

    /// Sends keep-alives every TTL/3 and watches our own key, until something is lost.
    async fn keep_alive(&mut self, revision: i64, backoff: &mut Backoff) -> Lost {
        let lease = self.lease.load(Ordering::Relaxed);
        let ttl = Duration::from_secs(self.ttl_secs.unsigned_abs());
        let Ok((mut keeper, mut responses)) =
            deadline("lease keep-alive", self.client.lease_keep_alive(lease)).await
        else {
            return Lost::Connection;
        };
        // A delete of our key (by hand, or by a revoke) must not leave us alive but unlisted.
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let Ok(mut own_key) = deadline(
            "watch own key",
            self.client.watch(self.key.as_str(), Some(options)),
        )
        .await
        else {
            return Lost::Connection;
        };
        let mut tick = tokio::time::interval((ttl / 3).max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last_ack = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    // No ack for a whole TTL: the lease has expired on the server side, or the
                    // connection is a black hole the streams have not noticed yet.
                    if last_ack.elapsed() > ttl || keeper.keep_alive().await.is_err() {
                        return Lost::Connection;
                    }
                }
                ack = responses.message() => match ack {
                    Ok(Some(ack)) if ack.ttl() > 0 => {
                        last_ack = Instant::now();
                        backoff.reset();
                    }
                    Ok(Some(_)) => return Lost::Lease,
                    Ok(None) | Err(_) => return Lost::Connection,
                },
                change = own_key.message() => match change {
                    Ok(Some(change)) if !change.canceled() => {
                        if change.events().iter().any(|e| e.event_type() == EventType::Delete) {
                            return Lost::Connection;
                        }
                    }
                    Ok(_) | Err(_) => return Lost::Connection,
                },
            }
        }
    }
}

//! The router's side: a membership stream built from a snapshot plus a prefix watch.

use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchStream};
use tokio::sync::mpsc;

use super::members::{Members, SnapshotEntry};
use super::{BACKOFF_MAX, BACKOFF_MIN, EtcdConfig, connect, deadline};
use crate::backoff::Backoff;
use crate::discovery::{DiscoveryError, MembershipEvent};
use crate::keys::workers_prefix;
use crate::telemetry::ETCD_WATCH_RESYNCS_TOTAL;

/// Events buffered ahead of a slow consumer; beyond this the watcher waits for it.
const EVENT_BUFFER: usize = 1024;

/// Snapshot of every worker under the prefix (as `Up` events), then watch from revision + 1;
/// after a disconnect, re-snapshot, emit `Down` for workers that vanished meanwhile, and resume.
/// The stream ends only when the returned receiver is dropped.
///
/// Fails only if the first snapshot cannot be taken (etcd unreachable at start); later outages
/// are retried with backoff for as long as the receiver lives.
pub async fn watch_workers(
    cfg: &EtcdConfig,
) -> Result<mpsc::Receiver<MembershipEvent>, DiscoveryError> {
    let mut client = connect(cfg).await?;
    let prefix = workers_prefix(&cfg.cluster);
    let (revision, snapshot) = take_snapshot(&mut client, &prefix).await?;

    let mut members = Members::default();
    let mut initial = Vec::new();
    members.resync(snapshot, &mut initial);
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let watcher = Watcher {
        client,
        prefix,
        members,
        revision,
        tx,
    };
    tokio::spawn(watcher.run(initial));
    Ok(rx)
}

struct Watcher {
    client: Client,
    prefix: String,
    members: Members,
    /// Revision the view is current to: the next watch starts at `revision + 1`.
    revision: i64,
    tx: mpsc::Sender<MembershipEvent>,
}

/// The consumer dropped its receiver: stop watching.
struct Closed;

impl Watcher {
    async fn run(mut self, initial: Vec<MembershipEvent>) {
        if self.send_all(initial).await.is_err() {
            return;
        }
        let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        loop {
            let tx = self.tx.clone();
            tokio::select! {
                _ = tx.closed() => return,
                result = self.follow() => match result {
                    Ok(Err(Closed)) => return,
                    Ok(Ok(())) => tracing::warn!(prefix = %self.prefix, "etcd watch ended; resyncing"),
                    Err(err) => tracing::warn!(prefix = %self.prefix, error = %err,
                        source = ?std::error::Error::source(&err), "etcd watch failed; resyncing"),
                },
            }
            // Disconnected: take a fresh snapshot (retrying with backoff) and diff it against
            // what the consumer was told, then resume watching after it.
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
                let snapshot = tokio::select! {
                    _ = tx.closed() => return,
                    s = take_snapshot(&mut self.client, &self.prefix) => s,
                };
                match snapshot {
                    Ok((revision, entries)) => {
                        metrics::counter!(ETCD_WATCH_RESYNCS_TOTAL).increment(1);
                        let mut events = Vec::new();
                        self.members.resync(entries, &mut events);
                        tracing::info!(prefix = %self.prefix, revision, changes = events.len(),
                            "etcd membership resynced");
                        if self.send_all(events).await.is_err() {
                            return;
                        }
                        self.revision = revision;
                        break;
                    }
                    Err(err) => tracing::debug!(error = %err, "etcd snapshot failed; retrying"),
                }
            }
            backoff.reset();
        }
    }

    /// Watches from `revision + 1` and forwards events until the watch breaks (`Ok(Ok)` for a
    /// clean end or cancellation, `Err` for a failure) or the consumer leaves (`Ok(Err(Closed))`).
    async fn follow(&mut self) -> Result<Result<(), Closed>, DiscoveryError> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.revision + 1);
        let mut stream: WatchStream = deadline(
            "watch",
            self.client.watch(self.prefix.as_str(), Some(options)),
        )
        .await?;
        while let Some(response) = stream.message().await? {
            if response.canceled() {
                // Compacted past our revision, or the cluster lost its leader: resync.
                tracing::warn!(
                    compact_revision = response.compact_revision(),
                    reason = response.cancel_reason(),
                    "etcd watch cancelled"
                );
                return Ok(Ok(()));
            }
            let mut events = Vec::new();
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                match event.event_type() {
                    EventType::Put => {
                        self.members
                            .put(key, kv.value(), kv.mod_revision(), &mut events)
                    }
                    EventType::Delete => self.members.delete(key, &mut events),
                }
                self.revision = self.revision.max(kv.mod_revision());
            }
            if self.send_all(events).await.is_err() {
                return Ok(Err(Closed));
            }
        }
        Ok(Ok(()))
    }

    async fn send_all(&self, events: Vec<MembershipEvent>) -> Result<(), Closed> {
        for event in events {
            self.tx.send(event).await.map_err(|_| Closed)?;
        }
        Ok(())
    }
}

/// Every record under `prefix` and the revision the read saw.
async fn take_snapshot(
    client: &mut Client,
    prefix: &str,
) -> Result<(i64, Vec<SnapshotEntry>), DiscoveryError> {
    let response = deadline(
        "get workers",
        client.get(prefix, Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let revision = response.header().map(|h| h.revision()).unwrap_or(0);
    let entries = response
        .kvs()
        .iter()
        .filter_map(|kv| {
            let key = kv.key_str().ok()?;
            Some((key.to_owned(), kv.value().to_vec(), kv.mod_revision()))
        })
        .collect();
    Ok((revision, entries))
}

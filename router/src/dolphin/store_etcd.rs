//! Tables and the classifier in etcd, and the watcher that keeps a router's loaded tables in
//! line with them.
//!
//! Writes are transactions: a version is created only if absent (versions are immutable), and
//! the active pointer is replaced only if it did not change since it was read and the version
//! it names exists (compare-and-swap, retried a few times), so two operators or routers acting at
//! once cannot lose an activation. The watcher takes a snapshot, applies it, then watches the
//! tables prefix and the classifier key from the snapshot's revision + 1; any change triggers a
//! fresh snapshot (tables are few and change rarely, so re-reading beats replaying events), and
//! any failure a resync with backoff. Applying never fails a request: see
//! [`DolphinRouting::apply_snapshot`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};
use tokio_util::sync::CancellationToken;

use super::classifier::OutputClassifier;
use super::routing::DolphinRouting;
use super::split::Split;
use super::store::{
    ACTIVE, ActivePointer, StoreError, StoreSnapshot, TableStore, active_key, check_table,
    check_version, classifier_key, table_key,
};

/// Longest wait for one etcd request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Compare-and-swap attempts on the active pointer.
const CAS_ATTEMPTS: usize = 8;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

async fn deadline<T>(
    op: &'static str,
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => r.map_err(StoreError::Etcd),
        Err(_) => Err(StoreError::Timeout { op }),
    }
}

/// The table store of a cluster in etcd.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    cluster: String,
    routing: Arc<DolphinRouting>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the etcd of `cfg` (lazily: errors surface on the first request), with the
    /// same timeouts, keep-alive and TLS as discovery.
    pub async fn connect(
        cfg: &dolphin_cluster::EtcdConfig,
        routing: Arc<DolphinRouting>,
    ) -> Result<EtcdStore, StoreError> {
        let options = cfg.connect_options()?;
        let client = deadline("connect", Client::connect(&cfg.endpoints, Some(options))).await?;
        Ok(EtcdStore {
            client,
            cluster: cfg.cluster.clone(),
            routing,
        })
    }

    /// The snapshot and the revision it was read at.
    async fn read(&self) -> Result<(i64, StoreSnapshot), StoreError> {
        let mut c = self.client.clone();
        let prefix = dolphin_cluster::tables_prefix(&self.cluster);
        let tables = deadline(
            "get tables",
            c.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let revision = tables.header().map_or(0, |h| h.revision());
        // Read the classifier at the same revision so the snapshot is one consistent moment.
        let key = classifier_key(&self.cluster);
        let cls = deadline(
            "get classifier",
            c.get(
                key.as_str(),
                Some(GetOptions::new().with_revision(revision)),
            ),
        )
        .await?;
        let mut snap = StoreSnapshot::default();
        for kv in tables.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            let rest = &key[prefix.len()..];
            let parsed = rest
                .split_once('/')
                .and_then(|(s, name)| Some((s.parse::<Split>().ok()?, name)));
            let Some((split, name)) = parsed else {
                tracing::warn!(%key, "ignoring a key under the tables prefix that is not <split>/<version>");
                continue;
            };
            let value = String::from_utf8_lossy(kv.value()).into_owned();
            let entry = snap.splits.entry(split).or_default();
            if name == ACTIVE {
                match serde_json::from_str::<ActivePointer>(&value) {
                    Ok(p) => entry.active = Some(p),
                    Err(e) => {
                        tracing::error!(%key, error = %e, "corrupt active pointer ignored")
                    }
                }
            } else {
                entry.versions.insert(name.to_owned(), value);
            }
        }
        snap.classifier = cls
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
        Ok((revision, snap))
    }

    /// The active pointer of `split` and its mod revision (0: absent).
    async fn pointer(&self, split: Split) -> Result<(Option<ActivePointer>, i64), StoreError> {
        let key = active_key(&self.cluster, split);
        let resp = deadline(
            "get active pointer",
            self.client.clone().get(key.as_str(), None),
        )
        .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok((None, 0));
        };
        let p = serde_json::from_slice(kv.value()).map_err(|e| StoreError::Corrupt {
            key,
            detail: e.to_string(),
        })?;
        Ok((Some(p), kv.mod_revision()))
    }

    /// Replaces the pointer of `split` with `next(current)` if it is unchanged since read.
    async fn swap_pointer(
        &self,
        split: Split,
        next: impl Fn(Option<&ActivePointer>) -> Result<ActivePointer, StoreError>,
    ) -> Result<ActivePointer, StoreError> {
        let key = active_key(&self.cluster, split);
        for _ in 0..CAS_ATTEMPTS {
            let (cur, rev) = self.pointer(split).await?;
            let p = next(cur.as_ref())?;
            let version_key = table_key(&self.cluster, split, &p.version);
            let value = serde_json::to_string(&p).unwrap_or_default();
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, rev),
                    Compare::version(version_key.as_str(), CompareOp::Greater, 0),
                ])
                .and_then([TxnOp::put(key.as_str(), value, None)]);
            let resp = deadline("swap active pointer", self.client.clone().txn(txn)).await?;
            if resp.succeeded() {
                self.refresh().await?;
                return Ok(p);
            }
        }
        Err(StoreError::Conflict(split))
    }

    /// Checks that `version` of `split` is stored and valid.
    async fn check_stored(&self, split: Split, version: &str) -> Result<(), StoreError> {
        let key = table_key(&self.cluster, split, version);
        let resp = deadline("get table", self.client.clone().get(key.as_str(), None)).await?;
        let kv = resp
            .kvs()
            .first()
            .ok_or_else(|| StoreError::NotFound(format!("table {split}/{version}")))?;
        check_table(split, &String::from_utf8_lossy(kv.value()))?;
        Ok(())
    }

    /// Follows etcd until `shutdown`: applies every change to the router.
    pub fn spawn_watcher(&self, shutdown: CancellationToken) {
        let store = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = store.watch_loop() => {}
            }
        });
    }

    async fn watch_loop(&self) {
        let mut delay = BACKOFF_MIN;
        loop {
            match self.follow().await {
                Ok(()) => tracing::warn!("etcd table watch ended; resyncing"),
                Err(e) => tracing::warn!(error = %e, "etcd table watch failed; resyncing"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(BACKOFF_MAX);
        }
    }

    /// Snapshot, apply, then watch; returns when the watch breaks.
    async fn follow(&self) -> Result<(), StoreError> {
        let (revision, snap) = self.read().await?;
        self.routing.apply_snapshot(&snap);
        let mut c = self.client.clone();
        let prefix = dolphin_cluster::tables_prefix(&self.cluster);
        let from = revision + 1;
        let mut stream = deadline(
            "watch tables",
            c.watch(
                prefix.as_str(),
                Some(WatchOptions::new().with_prefix().with_start_revision(from)),
            ),
        )
        .await?;
        deadline(
            "watch classifier",
            stream.watch(
                classifier_key(&self.cluster),
                Some(WatchOptions::new().with_start_revision(from)),
            ),
        )
        .await?;
        while let Some(resp) = stream.message().await? {
            if resp.canceled() {
                return Ok(());
            }
            if resp.events().is_empty() {
                continue;
            }
            let (_, snap) = self.read().await?;
            self.routing.apply_snapshot(&snap);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl TableStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    async fn snapshot(&self) -> Result<StoreSnapshot, StoreError> {
        Ok(self.read().await?.1)
    }

    async fn put(
        &self,
        split: Split,
        version: Option<&str>,
        json: &str,
    ) -> Result<String, StoreError> {
        check_table(split, json)?;
        let explicit = version.is_some();
        for _ in 0..CAS_ATTEMPTS {
            let version = match version {
                Some(v) => v.to_owned(),
                None => self.read().await?.1.next_version(split),
            };
            check_version(&version)?;
            let key = table_key(&self.cluster, split, &version);
            let txn = Txn::new()
                .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), json, None)]);
            let resp = deadline("put table", self.client.clone().txn(txn)).await?;
            if resp.succeeded() {
                return Ok(version);
            }
            if explicit {
                return Err(StoreError::VersionExists { split, version });
            }
            // Another writer took the generated name first: pick the next one.
        }
        Err(StoreError::Conflict(split))
    }

    async fn activate(&self, split: Split, version: &str) -> Result<ActivePointer, StoreError> {
        check_version(version)?;
        self.check_stored(split, version).await?;
        self.swap_pointer(split, |cur| Ok(ActivePointer::activate(cur, version)))
            .await
    }

    async fn rollback(&self, split: Split) -> Result<ActivePointer, StoreError> {
        let (cur, _) = self.pointer(split).await?;
        if let Some(prev) = cur.as_ref().and_then(|p| p.history.first()) {
            self.check_stored(split, prev).await?;
        }
        self.swap_pointer(split, |cur| {
            cur.and_then(ActivePointer::rollback)
                .ok_or(StoreError::NothingToRollBack(split))
        })
        .await
    }

    async fn put_classifier(&self, json: &str) -> Result<(), StoreError> {
        OutputClassifier::from_json(json)?;
        deadline(
            "put classifier",
            self.client
                .clone()
                .put(classifier_key(&self.cluster), json, None),
        )
        .await?;
        self.refresh().await
    }

    async fn refresh(&self) -> Result<(), StoreError> {
        let (_, snap) = self.read().await?;
        self.routing.apply_snapshot(&snap);
        Ok(())
    }
}

#[cfg(test)]
#[path = "store_etcd_tests.rs"]
mod tests;

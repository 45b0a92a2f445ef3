//! Where tables and the classifier are kept: etcd ([`super::store_etcd`]) or, without etcd,
//! the router's memory ([`MemoryStore`]).
//!
//! etcd layout (per cluster `<c>`):
//! - `/dolphin/<c>/tables/<split>/<version>`: a table document (immutable once written);
//! - `/dolphin/<c>/tables/<split>/active`: the [`ActivePointer`] of the split (JSON);
//! - `/dolphin/<c>/classifier`: the output classifier document.
//!
//! Versions are names of 1 to 64 characters from `[A-Za-z0-9._-]`, never `active`. Activating a
//! version pushes the previous one onto the pointer's history; a rollback pops it.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::classifier::{ClassifierError, OutputClassifier};
use super::routing::DolphinRouting;
use super::split::{BadSplit, Split};
use super::table::{RoutingTable, TableError};

/// Name of the active pointer key inside a split's directory.
pub const ACTIVE: &str = "active";
/// Longest activation history kept.
pub const MAX_HISTORY: usize = 32;

/// The key of one table version.
pub fn table_key(cluster: &str, split: Split, version: &str) -> String {
    format!(
        "{}{split}/{version}",
        dolphin_cluster::tables_prefix(cluster)
    )
}

/// The key of a split's active pointer.
pub fn active_key(cluster: &str, split: Split) -> String {
    table_key(cluster, split, ACTIVE)
}

/// The key of the output classifier, next to the tables.
pub fn classifier_key(cluster: &str) -> String {
    format!("/dolphin/{cluster}/classifier")
}

/// The active version of a split and the versions active before it (most recent first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivePointer {
    /// The active version.
    pub version: String,
    /// Versions previously active, most recent first (what a rollback returns to).
    #[serde(default)]
    pub history: Vec<String>,
    /// When it was set (Unix milliseconds).
    #[serde(default)]
    pub updated_ms: u64,
}

impl ActivePointer {
    /// The pointer after activating `version` on top of `prev`.
    pub fn activate(prev: Option<&ActivePointer>, version: &str) -> ActivePointer {
        let mut history = Vec::new();
        if let Some(p) = prev {
            if p.version == version {
                history = p.history.clone();
            } else {
                history.push(p.version.clone());
                history.extend(p.history.iter().cloned());
            }
        }
        history.truncate(MAX_HISTORY);
        ActivePointer {
            version: version.to_owned(),
            history,
            updated_ms: crate::request_log::unix_ms(),
        }
    }

    /// The pointer after a rollback, or `None` when there is nothing to return to.
    pub fn rollback(&self) -> Option<ActivePointer> {
        let (version, rest) = self.history.split_first()?;
        Some(ActivePointer {
            version: version.clone(),
            history: rest.to_vec(),
            updated_ms: crate::request_log::unix_ms(),
        })
    }
}

/// Everything stored for one split.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitEntry {
    /// Version -> table document.
    pub versions: BTreeMap<String, String>,
    /// The active pointer, if any.
    pub active: Option<ActivePointer>,
}

/// The whole store at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreSnapshot {
    /// Per split.
    pub splits: BTreeMap<Split, SplitEntry>,
    /// The classifier document, if one was stored.
    pub classifier: Option<String>,
}

impl StoreSnapshot {
    /// The next free `v<N>` version name of `split`.
    pub fn next_version(&self, split: Split) -> String {
        let n = self
            .splits
            .get(&split)
            .into_iter()
            .flat_map(|e| e.versions.keys())
            .filter_map(|v| v.strip_prefix('v')?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        format!("v{}", n + 1)
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// etcd failed.
    #[error("etcd request failed")]
    Etcd(#[from] etcd_client::Error),
    /// The etcd settings cannot work (TLS files, endpoints).
    #[error(transparent)]
    EtcdConfig(#[from] dolphin_cluster::DiscoveryError),
    /// etcd did not answer in time.
    #[error("etcd did not answer `{op}` in time")]
    Timeout {
        /// The request.
        op: &'static str,
    },
    /// The table is invalid.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The classifier is invalid.
    #[error(transparent)]
    Classifier(#[from] ClassifierError),
    /// A bad split name.
    #[error(transparent)]
    BadSplit(#[from] BadSplit),
    /// A bad version name.
    #[error("bad version name {0:?}: 1 to 64 characters from [A-Za-z0-9._-], and not \"{ACTIVE}\"")]
    BadVersion(String),
    /// Versions are immutable: this one exists.
    #[error("version {version} of split {split} already exists (versions are immutable)")]
    VersionExists {
        /// The split.
        split: Split,
        /// The version.
        version: String,
    },
    /// Nothing stored under that name.
    #[error("{0} not found")]
    NotFound(String),
    /// No earlier version to return to.
    #[error("split {0} has no earlier version to roll back to")]
    NothingToRollBack(Split),
    /// Concurrent updates kept winning.
    #[error("the active pointer of split {0} kept changing under us; retry")]
    Conflict(Split),
    /// A stored value is not what it should be.
    #[error("stored value {key} is corrupt: {detail}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
}

/// Checks a version name.
pub fn check_version(v: &str) -> Result<(), StoreError> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v != ACTIVE
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadVersion(v.to_owned()))
    }
}

/// Validates a table document for `split` (its own split must match).
pub fn check_table(split: Split, json: &str) -> Result<RoutingTable, StoreError> {
    let t = RoutingTable::from_json(json)?;
    if t.split != split {
        return Err(TableError::SplitMismatch {
            table: t.split,
            expected: split,
        }
        .into());
    }
    Ok(t)
}

/// Storage of tables and the classifier.
#[async_trait::async_trait]
pub trait TableStore: Send + Sync + std::fmt::Debug {
    /// "etcd" or "memory".
    fn kind(&self) -> &'static str;
    /// Everything stored.
    async fn snapshot(&self) -> Result<StoreSnapshot, StoreError>;
    /// Stores a new table version (validated; `version` None picks the next `v<N>`). Returns
    /// the version.
    async fn put(
        &self,
        split: Split,
        version: Option<&str>,
        json: &str,
    ) -> Result<String, StoreError>;
    /// Makes a stored (and valid) version the active one of its split.
    async fn activate(&self, split: Split, version: &str) -> Result<ActivePointer, StoreError>;
    /// Returns to the previously active version.
    async fn rollback(&self, split: Split) -> Result<ActivePointer, StoreError>;
    /// Stores the classifier (validated).
    async fn put_classifier(&self, json: &str) -> Result<(), StoreError>;
    /// Applies the store's current content to the router now (the etcd watcher does so too,
    /// asynchronously; this makes an admin call's effect visible when it returns).
    async fn refresh(&self) -> Result<(), StoreError>;
}

/// The store of a router without etcd: its own memory, applied to the router on every change.
/// Nothing survives a restart.
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<StoreSnapshot>,
    routing: Arc<DolphinRouting>,
}

impl MemoryStore {
    /// An empty store feeding `routing`.
    pub fn new(routing: Arc<DolphinRouting>) -> Self {
        MemoryStore {
            state: Mutex::default(),
            routing,
        }
    }

    fn update<T>(
        &self,
        f: impl FnOnce(&mut StoreSnapshot) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut state = self.state.lock();
        let mut next = state.clone();
        let out = f(&mut next)?;
        *state = next;
        self.routing.apply_snapshot(&state);
        Ok(out)
    }
}

#[async_trait::async_trait]
impl TableStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn snapshot(&self) -> Result<StoreSnapshot, StoreError> {
        Ok(self.state.lock().clone())
    }

    async fn put(
        &self,
        split: Split,
        version: Option<&str>,
        json: &str,
    ) -> Result<String, StoreError> {
        check_table(split, json)?;
        self.update(|s| {
            let version = match version {
                Some(v) => v.to_owned(),
                None => s.next_version(split),
            };
            check_version(&version)?;
            let entry = s.splits.entry(split).or_default();
            if entry.versions.contains_key(&version) {
                return Err(StoreError::VersionExists { split, version });
            }
            entry.versions.insert(version.clone(), json.to_owned());
            Ok(version)
        })
    }

    async fn activate(&self, split: Split, version: &str) -> Result<ActivePointer, StoreError> {
        self.update(|s| {
            let entry = s.splits.entry(split).or_default();
            let json = entry
                .versions
                .get(version)
                .ok_or_else(|| StoreError::NotFound(format!("table {split}/{version}")))?;
            check_table(split, json)?;
            let p = ActivePointer::activate(entry.active.as_ref(), version);
            entry.active = Some(p.clone());
            Ok(p)
        })
    }

    async fn rollback(&self, split: Split) -> Result<ActivePointer, StoreError> {
        self.update(|s| {
            let entry = s.splits.entry(split).or_default();
            let p = entry
                .active
                .as_ref()
                .and_then(ActivePointer::rollback)
                .ok_or(StoreError::NothingToRollBack(split))?;
            entry.active = Some(p.clone());
            Ok(p)
        })
    }

    async fn put_classifier(&self, json: &str) -> Result<(), StoreError> {
        OutputClassifier::from_json(json)?;
        self.update(|s| {
            s.classifier = Some(json.to_owned());
            Ok(())
        })
    }

    async fn refresh(&self) -> Result<(), StoreError> {
        self.routing.apply_snapshot(&self.state.lock());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_layout() {
        let s = Split::new(3, 1);
        assert_eq!(table_key("prod", s, "v2"), "/dolphin/prod/tables/3p1d/v2");
        assert_eq!(active_key("prod", s), "/dolphin/prod/tables/3p1d/active");
        assert_eq!(classifier_key("prod"), "/dolphin/prod/classifier");
        assert!(!classifier_key("prod").starts_with(&dolphin_cluster::tables_prefix("prod")));
    }

    #[test]
    fn version_names() {
        for ok in ["v1", "2026-11-29.a", "A_b-c"] {
            check_version(ok).expect(ok);
        }
        for bad in ["", "active", "a/b", "x y", &"v".repeat(65)] {
            assert!(check_version(bad).is_err(), "{bad:?}");
        }
        let mut snap = StoreSnapshot::default();
        assert_eq!(snap.next_version(Split::new(1, 1)), "v1");
        let e = snap.splits.entry(Split::new(1, 1)).or_default();
        e.versions.insert("v7".into(), String::new());
        e.versions.insert("custom".into(), String::new());
        assert_eq!(snap.next_version(Split::new(1, 1)), "v8");
    }

    #[test]
    fn pointer_history_supports_rollback() {
        let a = ActivePointer::activate(None, "v1");
        let b = ActivePointer::activate(Some(&a), "v2");
        let c = ActivePointer::activate(Some(&b), "v3");
        assert_eq!(c.history, vec!["v2", "v1"]);
        let again = ActivePointer::activate(Some(&c), "v3");
        assert_eq!(
            again.history, c.history,
            "re-activating is a no-op for history"
        );
        let r = c.rollback().expect("rollback");
        assert_eq!(
            (r.version.as_str(), r.history.clone()),
            ("v2", vec!["v1".into()])
        );
        let r = r.rollback().expect("rollback");
        assert_eq!(r.version, "v1");
        assert!(r.rollback().is_none());
    }
}

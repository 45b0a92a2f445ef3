//! DolphinRouting's state in the router: the active table of every split, the output
//! classifier, and the per-request decision.
//!
//! Tables and the classifier are swapped whole (a new `Arc` behind a lock held only to clone or
//! replace it), so a request in flight keeps the table it started with and none waits on a swap.
//! The request path caches the table of the live split: a generation counter, bumped on every
//! swap, tells it when to look again; a change of split is noticed by comparing the split it
//! is given. Transitions (a split gaining or losing a table, the live split changing) are
//! logged once each, and the `dolphin_router_table_active` gauge says whether the live split
//! has a table.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::admission::Admission;
use super::assign::CompiledTable;
use super::classifier::{OutputClassifier, OutputPrediction};
use super::online::Explorer;
use super::online_service::ActiveExplorer;
use super::split::Split;
use super::store::StoreSnapshot;
use super::table::TableError;
use crate::metrics as m;
use crate::route::TableRef;

/// A table loaded for one split.
#[derive(Debug)]
pub struct LoadedTable {
    /// The split.
    pub split: Split,
    /// Its version (the etcd key's last segment).
    pub version: Arc<str>,
    /// The compiled table.
    pub table: CompiledTable,
    /// The document it was compiled from (to tell an unchanged table from a rewritten one).
    source: String,
}

impl LoadedTable {
    /// The table and its version, as the routing decision takes them.
    pub fn as_ref(&self) -> TableRef<'_> {
        TableRef {
            table: &self.table,
            version: Some(&self.version),
        }
    }
}

/// A cluster as the wire and the request log carry it: proto3 has no optional int32 here, so
/// "no table decided" is -1.
pub fn wire_cluster(cluster: Option<u32>) -> i32 {
    cluster.and_then(|c| i32::try_from(c).ok()).unwrap_or(-1)
}

/// What this router has loaded for one split (for `RouterAdmin.ListTables`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadedStatus {
    /// The version in use (empty: none).
    pub loaded: String,
    /// Why the last table offered for the split was refused (empty: it was not).
    pub refused: String,
}

#[derive(Debug, Default)]
struct Current {
    generation: u64,
    split: Option<Split>,
    table: Option<Arc<LoadedTable>>,
}

/// Tables, classifier and decisions of the `dolphin` policy.
#[derive(Debug)]
pub struct DolphinRouting {
    tables: RwLock<Arc<HashMap<Split, Arc<LoadedTable>>>>,
    /// Bumped after every swap of `tables`.
    generation: AtomicU64,
    current: RwLock<Current>,
    classifier: RwLock<Arc<OutputClassifier>>,
    refused: Mutex<BTreeMap<Split, String>>,
    /// The online learner's exploration schedule, for the table it follows.
    explorer: RwLock<Option<Arc<ActiveExplorer>>>,
}

impl Default for DolphinRouting {
    fn default() -> Self {
        Self::new()
    }
}

impl DolphinRouting {
    /// No tables, the prior classifier.
    pub fn new() -> Self {
        DolphinRouting {
            tables: RwLock::new(Arc::default()),
            generation: AtomicU64::new(1),
            current: RwLock::new(Current::default()),
            classifier: RwLock::new(Arc::new(OutputClassifier::prior())),
            refused: Mutex::default(),
            explorer: RwLock::new(None),
        }
    }

    /// The online learner's exploration schedule for `split`'s table `version` (`None`: the
    /// learner follows another table, or none).
    pub fn explorer(&self, split: Split, version: &str) -> Option<Arc<Explorer>> {
        let cur = self.explorer.read();
        let e = cur.as_ref()?;
        (e.split == split && *e.version == *version).then(|| e.explorer.clone())
    }

    /// Sets the online learner's exploration schedule.
    pub fn set_explorer(&self, explorer: Option<ActiveExplorer>) {
        *self.explorer.write() = explorer.map(Arc::new);
    }

    /// The classifier's prediction for a request.
    pub fn classify(&self, a: &Admission) -> OutputPrediction {
        self.classifier.read().predict(a)
    }

    /// The classifier in use.
    pub fn classifier(&self) -> Arc<OutputClassifier> {
        self.classifier.read().clone()
    }

    /// Runs `f` with the table of `split` (`None`: the split has none), from the request path's
    /// cache of the live split's table; the decision itself is [`crate::route::route`].
    pub fn with_table<R>(&self, split: Split, f: impl FnOnce(Option<TableRef<'_>>) -> R) -> R {
        let generation = self.generation.load(Ordering::Acquire);
        {
            let cur = self.current.read();
            if cur.generation == generation && cur.split == Some(split) {
                return f(cur.table.as_deref().map(LoadedTable::as_ref));
            }
        }
        let table = self.refresh(split, generation);
        f(table.as_deref().map(LoadedTable::as_ref))
    }

    /// Slow path: the tables were swapped or the split changed since the cached lookup.
    fn refresh(&self, split: Split, generation: u64) -> Option<Arc<LoadedTable>> {
        // `generation` was read before the tables: a swap in between only makes the cache look
        // stale next time, never fresh with old tables.
        let table = self.tables.read().get(&split).cloned();
        let mut cur = self.current.write();
        let version = |t: &Option<Arc<LoadedTable>>| t.as_ref().map(|t| t.version.clone());
        if cur.split != Some(split) || version(&cur.table) != version(&table) {
            match &table {
                Some(t) => {
                    tracing::info!(%split, version = %t.version, k = t.table.k(), "routing with the table of the live split")
                }
                None => {
                    tracing::warn!(%split, "no routing table for the live split; the fallback policy decides")
                }
            }
            metrics::gauge!(m::TABLE_ACTIVE).set(if table.is_some() { 1.0 } else { 0.0 });
        }
        if generation >= cur.generation {
            *cur = Current {
                generation,
                split: Some(split),
                table: table.clone(),
            };
        }
        table
    }

    /// The table loaded for `split`.
    pub fn table(&self, split: Split) -> Option<Arc<LoadedTable>> {
        self.tables.read().get(&split).cloned()
    }

    /// What is loaded (and refused) per split.
    pub fn status(&self) -> BTreeMap<Split, LoadedStatus> {
        let mut out: BTreeMap<Split, LoadedStatus> = BTreeMap::new();
        for (split, t) in self.tables.read().iter() {
            out.entry(*split).or_default().loaded = t.version.to_string();
        }
        for (split, why) in self.refused.lock().iter() {
            out.entry(*split).or_default().refused = why.clone();
        }
        out
    }

    fn swap(&self, tables: HashMap<Split, Arc<LoadedTable>>) {
        *self.tables.write() = Arc::new(tables);
        self.generation.fetch_add(1, Ordering::AcqRel);
        metrics::counter!(m::TABLE_SWAPS_TOTAL).increment(1);
    }

    fn compile(split: Split, version: &str, json: &str) -> Result<LoadedTable, TableError> {
        let table = CompiledTable::from_json(json)?;
        if table.table().split != split {
            return Err(TableError::SplitMismatch {
                table: table.table().split,
                expected: split,
            });
        }
        Ok(LoadedTable {
            split,
            version: Arc::from(version),
            table,
            source: json.to_owned(),
        })
    }

    fn refuse(&self, split: Split, version: &str, e: &TableError) {
        metrics::counter!(m::TABLES_REJECTED_TOTAL, "kind" => "table").increment(1);
        tracing::error!(%split, %version, error = %e, "routing table refused; the previous table stays active");
        self.refused
            .lock()
            .insert(split, format!("version {version}: {e}"));
    }

    /// Makes `json` the active table of `split` (refusing it, and keeping the old one, when it
    /// is invalid).
    pub fn install(&self, split: Split, version: &str, json: &str) -> Result<(), TableError> {
        let loaded = match Self::compile(split, version, json) {
            Ok(t) => t,
            Err(e) => {
                self.refuse(split, version, &e);
                return Err(e);
            }
        };
        let mut tables = (**self.tables.read()).clone();
        tables.insert(split, Arc::new(loaded));
        self.refused.lock().remove(&split);
        tracing::info!(%split, %version, "routing table activated");
        self.swap(tables);
        Ok(())
    }

    /// Brings the loaded tables and the classifier in line with a store snapshot: each split's
    /// active version is loaded unless it already is; an invalid one is refused and the split
    /// keeps what it had; splits without an active pointer lose their table.
    pub fn apply_snapshot(&self, snap: &StoreSnapshot) {
        let old = self.tables.read().clone();
        let mut next: HashMap<Split, Arc<LoadedTable>> = HashMap::new();
        let mut changed = false;
        for (split, entry) in &snap.splits {
            let Some(active) = &entry.active else {
                continue;
            };
            let prev = old.get(split);
            let json = entry.versions.get(&active.version);
            if let (Some(p), Some(json)) = (prev, json)
                && *p.version == *active.version
                && p.source == *json
            {
                next.insert(*split, p.clone());
                continue;
            }
            let result = match json {
                Some(json) => Self::compile(*split, &active.version, json),
                None => Err(TableError::Model(format!(
                    "the active pointer names version {:?}, which is not stored",
                    active.version
                ))),
            };
            match result {
                Ok(t) => {
                    tracing::info!(%split, version = %active.version, "routing table activated");
                    self.refused.lock().remove(split);
                    next.insert(*split, Arc::new(t));
                    changed = true;
                }
                Err(e) => {
                    self.refuse(*split, &active.version, &e);
                    if let Some(p) = prev {
                        next.insert(*split, p.clone());
                    }
                }
            }
        }
        for split in old.keys().filter(|s| !next.contains_key(s)) {
            tracing::warn!(%split, "the split has no active routing table any more");
            changed = true;
        }
        if changed {
            self.swap(next);
        }
        self.apply_classifier(snap.classifier.as_deref());
    }

    /// Loads a classifier document (`None`: back to the prior). An invalid one is refused and
    /// the current classifier stays.
    pub fn apply_classifier(&self, json: Option<&str>) {
        let next = match json {
            None => OutputClassifier::prior(),
            Some(text) => match OutputClassifier::from_json(text) {
                Ok(c) => c,
                Err(e) => {
                    metrics::counter!(m::TABLES_REJECTED_TOTAL, "kind" => "classifier")
                        .increment(1);
                    tracing::error!(error = %e, "output classifier refused; the previous classifier stays");
                    return;
                }
            },
        };
        let mut cur = self.classifier.write();
        if **cur != next {
            tracing::info!(source = %next.provenance.source, date = %next.provenance.date, "output classifier loaded");
            *cur = Arc::new(next);
        }
    }
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;

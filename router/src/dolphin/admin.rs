//! The table and classifier calls of `RouterAdmin`, over the dispatcher's table store.

use dolphin_proto::v1;
use tonic::{Code, Status};

use super::split::Split;
use super::store::{ActivePointer, StoreError, check_table};
use super::table::RoutingTable;
use crate::dispatch::Dispatcher;

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        let code = match &e {
            StoreError::Etcd(_) | StoreError::Timeout { .. } => Code::Unavailable,
            StoreError::Table(_)
            | StoreError::Classifier(_)
            | StoreError::BadSplit(_)
            | StoreError::BadVersion(_) => Code::InvalidArgument,
            StoreError::VersionExists { .. } => Code::AlreadyExists,
            StoreError::NotFound(_) => Code::NotFound,
            StoreError::NothingToRollBack(_) => Code::FailedPrecondition,
            StoreError::Conflict(_) => Code::Aborted,
            StoreError::Corrupt { .. } => Code::Internal,
            StoreError::EtcdConfig(_) => Code::FailedPrecondition,
        };
        // The message carries the whole cause chain: operators read it in dolphinctl.
        Status::new(code, dolphin_cluster::error_chain(&e))
    }
}

fn split(s: &str) -> Result<Split, Status> {
    s.parse::<Split>()
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

fn pointer(split: Split, p: ActivePointer) -> v1::ActiveTablePointer {
    v1::ActiveTablePointer {
        split: split.to_string(),
        version: p.version,
        history: p.history,
    }
}

/// `ListTables`.
pub async fn list_tables(d: &Dispatcher) -> Result<v1::ListTablesResponse, Status> {
    let store = d.table_store();
    let snap = store.snapshot().await?;
    let mut status = d.dolphin().status();
    let mut splits = Vec::new();
    for (s, entry) in &snap.splits {
        let loaded = status.remove(s).unwrap_or_default();
        let active = entry.active.clone().unwrap_or_default();
        splits.push(v1::SplitTables {
            split: s.to_string(),
            versions: entry.versions.keys().cloned().collect(),
            active: active.version,
            history: active.history,
            loaded: loaded.loaded,
            refused: loaded.refused,
        });
    }
    let live = d.registry().split();
    Ok(v1::ListTablesResponse {
        splits,
        live_split: live.to_string(),
        live_version: d
            .dolphin()
            .table(live)
            .map(|t| t.version.to_string())
            .unwrap_or_default(),
        store: store.kind().into(),
    })
}

/// `GetTable`.
pub async fn get_table(
    d: &Dispatcher,
    r: v1::GetTableRequest,
) -> Result<v1::TableDocument, Status> {
    let s = split(&r.split)?;
    let snap = d.table_store().snapshot().await?;
    let entry = snap
        .splits
        .get(&s)
        .ok_or_else(|| Status::not_found(format!("no tables for split {s}")))?;
    let active = entry.active.as_ref().map(|p| p.version.clone());
    let version = if r.version.is_empty() {
        active
            .clone()
            .ok_or_else(|| Status::not_found(format!("split {s} has no active table")))?
    } else {
        r.version
    };
    let json = entry
        .versions
        .get(&version)
        .ok_or_else(|| Status::not_found(format!("table {s}/{version} not found")))?;
    Ok(v1::TableDocument {
        split: s.to_string(),
        active: active.as_deref() == Some(version.as_str()),
        json: json.clone(),
        version,
    })
}

/// `PutTable`.
pub async fn put_table(
    d: &Dispatcher,
    r: v1::PutTableRequest,
) -> Result<v1::PutTableResponse, Status> {
    let s = if r.split.is_empty() {
        RoutingTable::from_json(&r.json)
            .map_err(|e| Status::from(StoreError::from(e)))?
            .split
    } else {
        split(&r.split)?
    };
    check_table(s, &r.json)?;
    let store = d.table_store();
    let version = (!r.version.is_empty()).then_some(r.version.as_str());
    let version = store.put(s, version, &r.json).await?;
    tracing::info!(split = %s, %version, "routing table stored");
    if r.activate {
        store.activate(s, &version).await?;
    }
    Ok(v1::PutTableResponse {
        split: s.to_string(),
        version,
        activated: r.activate,
    })
}

/// `ActivateTable`.
pub async fn activate_table(
    d: &Dispatcher,
    r: v1::ActivateTableRequest,
) -> Result<v1::ActiveTablePointer, Status> {
    let s = split(&r.split)?;
    let p = d.table_store().activate(s, &r.version).await?;
    tracing::info!(split = %s, version = %p.version, "routing table version activated");
    Ok(pointer(s, p))
}

/// `RollbackTable`.
pub async fn rollback_table(
    d: &Dispatcher,
    r: v1::RollbackTableRequest,
) -> Result<v1::ActiveTablePointer, Status> {
    let s = split(&r.split)?;
    let p = d.table_store().rollback(s).await?;
    tracing::info!(split = %s, version = %p.version, "routing table rolled back");
    Ok(pointer(s, p))
}

/// `GetClassifier`.
pub fn get_classifier(d: &Dispatcher) -> v1::ClassifierDocument {
    let c = d.dolphin().classifier();
    v1::ClassifierDocument {
        json: c.to_json_pretty(),
        prior: c.is_prior(),
    }
}

/// `PutClassifier`.
pub async fn put_classifier(
    d: &Dispatcher,
    r: v1::ClassifierDocument,
) -> Result<v1::ClassifierDocument, Status> {
    d.table_store().put_classifier(&r.json).await?;
    tracing::info!("output classifier stored");
    Ok(get_classifier(d))
}

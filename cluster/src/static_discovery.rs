//! Static membership for a single machine without etcd: a JSON file or command-line flags.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use tokio::sync::mpsc;

use crate::discovery::{DiscoveryError, MembershipEvent};
use crate::worker::WorkerRecord;

/// The file format: `{"workers": [WorkerRecord, ...]}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticFile {
    workers: Vec<WorkerRecord>,
}

/// A JSON file `{"workers": [WorkerRecord, ...]}` or flags; yields Up for each, once.
///
/// Reads and checks the file: every id must be unique.
pub fn load_static_file(path: &Path) -> Result<Vec<WorkerRecord>, DiscoveryError> {
    let text = std::fs::read_to_string(path).map_err(|source| DiscoveryError::Io {
        path: path.to_owned(),
        source,
    })?;
    let file: StaticFile = serde_json::from_str(&text).map_err(|source| DiscoveryError::Parse {
        what: path.display().to_string(),
        source,
    })?;
    let mut seen = BTreeSet::new();
    for record in &file.workers {
        if !seen.insert(&record.id) {
            return Err(DiscoveryError::DuplicateWorker(record.id.clone()));
        }
    }
    Ok(file.workers)
}

/// A membership stream holding one `Up` per record, then closed: a static membership never
/// changes, so the end of this stream means "no further changes", not "cluster gone".
pub fn static_workers(records: Vec<WorkerRecord>) -> mpsc::Receiver<MembershipEvent> {
    let (tx, rx) = mpsc::channel(records.len().max(1));
    for record in records {
        // Cannot fail: the channel has room for every record and the receiver is still here.
        let _ = tx.try_send(MembershipEvent::Up(record));
    }
    rx
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::worker::{Role, WorkerId};

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(text.as_bytes()).expect("write");
        file
    }

    const TWO: &str = r#"{"workers": [
        {"id": "prefill-1", "role": "prefill", "grpc_addr": "127.0.0.1:7001", "model": "m", "block_size": 16},
        {"id": "decode-1", "role": "decode", "grpc_addr": "127.0.0.1:7002", "kv_addr": "127.0.0.1:7003",
         "model": "m", "block_size": 16}
    ]}"#;

    #[tokio::test]
    async fn file_yields_each_worker_once_then_ends() {
        let file = write(TWO);
        let records = load_static_file(file.path()).expect("load");
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].kv_addr.as_deref(), Some("127.0.0.1:7003"));
        assert_eq!(records[0].role, Role::Prefill);

        let mut rx = static_workers(records.clone());
        for record in records {
            assert_eq!(rx.recv().await, Some(MembershipEvent::Up(record)));
        }
        assert_eq!(rx.recv().await, None);
        assert_eq!(static_workers(vec![]).recv().await, None);
    }

    #[test]
    fn errors_are_typed() {
        let missing = load_static_file(Path::new("/nonexistent/dolphin-workers.json"));
        assert!(matches!(missing, Err(DiscoveryError::Io { .. })));

        let bad = write(r#"{"workers": [{"id": "x"}]}"#);
        assert!(matches!(
            load_static_file(bad.path()),
            Err(DiscoveryError::Parse { .. })
        ));

        let dup = write(&TWO.replace("decode-1", "prefill-1"));
        match load_static_file(dup.path()) {
            Err(DiscoveryError::DuplicateWorker(id)) => assert_eq!(id, WorkerId::from("prefill-1")),
            other => panic!("expected a duplicate error, got {other:?}"),
        }
    }
}

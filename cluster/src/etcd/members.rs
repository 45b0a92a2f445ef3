//! The watcher's view of membership: turns etcd puts, deletes and snapshots into
//! [`MembershipEvent`]s. Pure bookkeeping, no I/O, so the resync rules are unit-tested here.

use std::collections::BTreeMap;

use crate::discovery::{DiscoveryError, MembershipEvent};
use crate::worker::{WorkerId, WorkerRecord};

/// One key of a snapshot: key, value, mod revision.
pub(super) type SnapshotEntry = (String, Vec<u8>, i64);

/// The workers announced so far (`Up` sent, no `Down` yet), by etcd key.
#[derive(Debug, Default)]
pub(super) struct Members {
    by_key: BTreeMap<String, Known>,
}

#[derive(Debug)]
struct Known {
    id: WorkerId,
    mod_revision: i64,
}

impl Members {
    /// A key was written at `mod_revision`.
    pub(super) fn put(
        &mut self,
        key: &str,
        value: &[u8],
        mod_revision: i64,
        out: &mut Vec<MembershipEvent>,
    ) {
        match parse(key, value) {
            Ok(record) => {
                let known = Known {
                    id: record.id.clone(),
                    mod_revision,
                };
                if let Some(old) = self.by_key.insert(key.to_owned(), known)
                    && old.id != record.id
                {
                    out.push(MembershipEvent::Down(old.id));
                }
                out.push(MembershipEvent::Up(record));
            }
            Err(err) => {
                // A record we cannot read names no worker we can route to: treat it as absent.
                tracing::warn!(key, error = %err, source = ?std::error::Error::source(&err),
                    "ignoring unreadable worker record");
                self.delete(key, out);
            }
        }
    }

    /// A key was deleted (by revoke, lease expiry or hand).
    pub(super) fn delete(&mut self, key: &str, out: &mut Vec<MembershipEvent>) {
        if let Some(old) = self.by_key.remove(key) {
            out.push(MembershipEvent::Down(old.id));
        }
    }

    /// Replaces the view with a fresh snapshot taken after a disconnect: `Down` for workers that
    /// vanished meanwhile, `Up` for new workers and for keys rewritten since we last saw them.
    pub(super) fn resync(&mut self, snapshot: Vec<SnapshotEntry>, out: &mut Vec<MembershipEvent>) {
        let present: BTreeMap<&str, ()> =
            snapshot.iter().map(|(k, _, _)| (k.as_str(), ())).collect();
        let vanished: Vec<String> = self
            .by_key
            .keys()
            .filter(|k| !present.contains_key(k.as_str()))
            .cloned()
            .collect();
        for key in vanished {
            self.delete(&key, out);
        }
        for (key, value, mod_revision) in snapshot {
            let unchanged = self
                .by_key
                .get(&key)
                .is_some_and(|k| k.mod_revision == mod_revision);
            if !unchanged {
                self.put(&key, &value, mod_revision, out);
            }
        }
    }
}

fn parse(key: &str, value: &[u8]) -> Result<WorkerRecord, DiscoveryError> {
    serde_json::from_slice(value).map_err(|source| DiscoveryError::Parse {
        what: format!("etcd key {key}"),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Role;

    fn record(id: &str) -> WorkerRecord {
        WorkerRecord {
            id: WorkerId::from(id),
            role: Role::Decode,
            grpc_addr: "127.0.0.1:1".into(),
            kv_addr: Some("127.0.0.1:2".into()),
            model: "m".into(),
            block_size: 16,
            version: crate::BUILD_VERSION.into(),
            kv_layout: String::new(),
            context_length: 0,
        }
    }

    fn entry(id: &str, rev: i64) -> SnapshotEntry {
        (
            format!("/k/{id}"),
            serde_json::to_vec(&record(id)).unwrap(),
            rev,
        )
    }

    fn up(id: &str) -> MembershipEvent {
        MembershipEvent::Up(record(id))
    }

    fn down(id: &str) -> MembershipEvent {
        MembershipEvent::Down(WorkerId::from(id))
    }

    #[test]
    fn put_then_delete() {
        let mut m = Members::default();
        let mut out = vec![];
        let (k, v, r) = entry("a", 5);
        m.put(&k, &v, r, &mut out);
        m.delete(&k, &mut out);
        m.delete(&k, &mut out); // a second delete of an unknown key says nothing
        assert_eq!(out, vec![up("a"), down("a")]);
    }

    #[test]
    fn unreadable_record_is_skipped_and_retires_a_known_key() {
        let mut m = Members::default();
        let mut out = vec![];
        m.put("/k/x", b"not json", 3, &mut out);
        assert!(out.is_empty());
        let (k, v, r) = entry("a", 4);
        m.put(&k, &v, r, &mut out);
        m.put(&k, b"{}", 5, &mut out);
        assert_eq!(out, vec![up("a"), down("a")]);
    }

    #[test]
    fn id_change_under_one_key_reports_the_old_id_down() {
        let mut m = Members::default();
        let mut out = vec![];
        m.put(
            "/k/a",
            &serde_json::to_vec(&record("a")).unwrap(),
            1,
            &mut out,
        );
        m.put(
            "/k/a",
            &serde_json::to_vec(&record("b")).unwrap(),
            2,
            &mut out,
        );
        assert_eq!(out, vec![up("a"), down("a"), up("b")]);
    }

    #[test]
    fn resync_reports_vanished_new_and_rewritten_workers_only() {
        let mut m = Members::default();
        let mut out = vec![];
        m.resync(vec![entry("a", 1), entry("b", 2), entry("c", 3)], &mut out);
        assert_eq!(out, vec![up("a"), up("b"), up("c")]);

        // While disconnected: b left, c re-registered (new revision), d joined, a untouched.
        out.clear();
        m.resync(vec![entry("a", 1), entry("c", 9), entry("d", 10)], &mut out);
        assert_eq!(out, vec![down("b"), up("c"), up("d")]);

        out.clear();
        m.resync(vec![], &mut out);
        assert_eq!(out, vec![down("a"), down("c"), down("d")]);
    }
}

//! Responses kept for `previous_response_id` and `GET /v1/responses/{id}`: none by default (as
//! vLLM keeps none unless asked), the last N in this router's memory (`--responses-store N`:
//! each replica its own, so behind several a client must reach the one that answered), or in
//! the cluster's etcd for a while (`--responses-etcd-ttl SECS`,
//! [`super::response_store_etcd`]), where every replica reads what any of them kept.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use axum::http::StatusCode;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ApiError;
use super::response_store_etcd::EtcdResponses;

/// A stored response: the conversation it ended (chat messages, its output included, without
/// its instructions, which a later response does not inherit) and the response itself.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Stored {
    pub(crate) conversation: Vec<Value>,
    pub(crate) response: Value,
}

/// Why the store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ResponseStoreError {
    /// The etcd settings cannot be used (TLS files among them).
    #[error("the response store's etcd settings: {0}")]
    Config(#[from] dolphin_cluster::DiscoveryError),
    /// etcd refused or failed the request (a response past etcd's request limit among them).
    #[error("the response store (etcd) failed: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// etcd did not answer in time.
    #[error("the response store (etcd) did not answer {op} in time")]
    Timeout {
        /// What was asked.
        op: &'static str,
    },
    /// A kept response that does not read back.
    #[error("kept response {id:?} is corrupt: {source}")]
    Corrupt {
        /// Its id.
        id: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

impl From<ResponseStoreError> for ApiError {
    fn from(e: ResponseStoreError) -> Self {
        let (status, kind) = match e {
            ResponseStoreError::Corrupt { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "server_error")
            }
            _ => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error"),
        };
        ApiError {
            status,
            message: e.to_string(),
            kind,
            param: None,
            code: None,
        }
    }
}

/// The store (cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct ResponseStore(Backend);

#[derive(Clone, Debug, Default)]
enum Backend {
    /// Nothing is kept.
    #[default]
    Off,
    Memory(Arc<Mutex<Memory>>),
    Etcd(Arc<EtcdResponses>),
}

#[derive(Debug)]
struct Memory {
    capacity: usize,
    /// Ids, oldest first.
    order: VecDeque<String>,
    entries: HashMap<String, Stored>,
}

impl ResponseStore {
    /// A store of the last `capacity` responses in memory (0: none kept).
    pub fn new(capacity: usize) -> Self {
        Self(match capacity {
            0 => Backend::Off,
            _ => Backend::Memory(Arc::new(Mutex::new(Memory {
                capacity,
                order: VecDeque::new(),
                entries: HashMap::new(),
            }))),
        })
    }

    /// A store in etcd, shared by every router of the cluster (see [`EtcdResponses`]).
    pub fn etcd(responses: EtcdResponses) -> Self {
        Self(Backend::Etcd(Arc::new(responses)))
    }

    /// Whether responses are kept.
    pub(crate) fn enabled(&self) -> bool {
        !matches!(self.0, Backend::Off)
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<Stored>, ResponseStoreError> {
        match &self.0 {
            Backend::Off => Ok(None),
            Backend::Memory(m) => Ok(m.lock().entries.get(id).cloned()),
            Backend::Etcd(e) => e.get(id).await,
        }
    }

    /// Keeps `stored` under `id` (in memory dropping the oldest past the capacity).
    pub(crate) async fn put(&self, id: String, stored: Stored) -> Result<(), ResponseStoreError> {
        match &self.0 {
            Backend::Off => Ok(()),
            Backend::Memory(m) => {
                let mut m = m.lock();
                if m.entries.insert(id.clone(), stored).is_none() {
                    m.order.push_back(id);
                }
                while m.order.len() > m.capacity {
                    if let Some(old) = m.order.pop_front() {
                        m.entries.remove(&old);
                    }
                }
                Ok(())
            }
            Backend::Etcd(e) => e.put(&id, &stored).await,
        }
    }

    /// Forgets `id`; whether it was kept.
    pub(crate) async fn delete(&self, id: &str) -> Result<bool, ResponseStoreError> {
        match &self.0 {
            Backend::Off => Ok(false),
            Backend::Memory(m) => {
                let mut m = m.lock();
                let found = m.entries.remove(id).is_some();
                if found {
                    m.order.retain(|o| o != id);
                }
                Ok(found)
            }
            Backend::Etcd(e) => e.delete(id).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_the_last_n_and_forgets_on_request() {
        let store = ResponseStore::new(2);
        let stored = |n: i64| Stored {
            conversation: Vec::new(),
            response: Value::from(n),
        };
        for (id, n) in [("a", 1), ("b", 2), ("c", 3)] {
            store.put(id.into(), stored(n)).await.expect("memory");
        }
        let get = |id: &'static str| {
            let store = store.clone();
            async move { store.get(id).await.expect("memory") }
        };
        assert!(get("a").await.is_none());
        assert_eq!(get("c").await.map(|s| s.response), Some(Value::from(3)));
        assert!(store.delete("b").await.expect("memory"));
        assert!(!store.delete("b").await.expect("memory"));
        assert!(get("b").await.is_none());
        let off = ResponseStore::new(0);
        off.put("a".into(), stored(1)).await.expect("off");
        assert!(!off.enabled() && off.get("a").await.expect("off").is_none());
    }
}

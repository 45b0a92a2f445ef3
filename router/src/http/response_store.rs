//! Responses kept for `previous_response_id` and `GET /v1/responses/{id}`, in the router's
//! memory (`--responses-store N`: the last N stored; none by default, as vLLM keeps none unless
//! asked). Each router replica keeps its own: behind several replicas a client must reach the
//! one that answered (a session-affine route), or send the whole conversation.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

/// A stored response: the conversation it ended (chat messages, its output included, without
/// its instructions, which a later response does not inherit) and the response itself.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub(crate) conversation: Vec<Value>,
    pub(crate) response: Value,
}

/// The store (cheap to clone; `None` inside when off).
#[derive(Clone, Debug, Default)]
pub struct ResponseStore(Option<Arc<Mutex<Inner>>>);

#[derive(Debug)]
struct Inner {
    capacity: usize,
    /// Ids, oldest first.
    order: VecDeque<String>,
    entries: HashMap<String, Stored>,
}

impl ResponseStore {
    /// A store of the last `capacity` responses (0: none kept).
    pub fn new(capacity: usize) -> Self {
        Self((capacity > 0).then(|| {
            Arc::new(Mutex::new(Inner {
                capacity,
                order: VecDeque::new(),
                entries: HashMap::new(),
            }))
        }))
    }

    /// Whether responses are kept.
    pub(crate) fn enabled(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn get(&self, id: &str) -> Option<Stored> {
        self.0.as_ref()?.lock().entries.get(id).cloned()
    }

    /// Keeps `stored` under `id`, dropping the oldest past the capacity.
    pub(crate) fn put(&self, id: String, stored: Stored) {
        let Some(inner) = &self.0 else {
            return;
        };
        let mut inner = inner.lock();
        if inner.entries.insert(id.clone(), stored).is_none() {
            inner.order.push_back(id);
        }
        while inner.order.len() > inner.capacity {
            if let Some(old) = inner.order.pop_front() {
                inner.entries.remove(&old);
            }
        }
    }

    /// Forgets `id`; whether it was kept.
    pub(crate) fn delete(&self, id: &str) -> bool {
        let Some(inner) = &self.0 else {
            return false;
        };
        let mut inner = inner.lock();
        let found = inner.entries.remove(id).is_some();
        if found {
            inner.order.retain(|o| o != id);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_n_and_forgets_on_request() {
        let store = ResponseStore::new(2);
        let stored = |n: i64| Stored {
            conversation: Vec::new(),
            response: Value::from(n),
        };
        for (id, n) in [("a", 1), ("b", 2), ("c", 3)] {
            store.put(id.into(), stored(n));
        }
        assert!(store.get("a").is_none());
        assert_eq!(store.get("c").map(|s| s.response), Some(Value::from(3)));
        assert!(store.delete("b"));
        assert!(!store.delete("b"));
        assert!(store.get("b").is_none());
        let off = ResponseStore::new(0);
        off.put("a".into(), stored(1));
        assert!(!off.enabled() && off.get("a").is_none());
    }
}

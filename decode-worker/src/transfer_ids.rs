//! Transfer ids: unique per decode worker, and unlikely to repeat across its restarts (a prefill
//! worker still pushing for a previous incarnation must not hit a live reservation).

use std::{
    collections::hash_map::RandomState,
    hash::BuildHasher,
    sync::atomic::{AtomicU64, Ordering},
};

use dolphin_kv_transfer::TransferId;

/// Hands out transfer ids: a random start, then consecutive.
#[derive(Debug)]
pub struct TransferIds {
    next: AtomicU64,
}

impl TransferIds {
    /// A generator starting at a random point (std seeds `RandomState` from the OS).
    pub fn new() -> Self {
        // Half the range: 2^63 ids before a wrap, which never comes.
        Self::starting_at(RandomState::new().hash_one(std::process::id()) >> 1)
    }

    /// A generator starting at `first` (tests).
    pub fn starting_at(first: TransferId) -> Self {
        Self {
            next: AtomicU64::new(first),
        }
    }

    /// The next id.
    pub fn next_id(&self) -> TransferId {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

impl Default for TransferIds {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_consecutive() {
        let ids = TransferIds::starting_at(7);
        assert_eq!(ids.next_id(), 7);
        assert_eq!(ids.next_id(), 8);
    }

    #[test]
    fn separate_generators_start_apart() {
        // Two incarnations of a worker: equal starts would need a 63-bit collision.
        assert_ne!(TransferIds::new().next_id(), TransferIds::new().next_id());
    }
}

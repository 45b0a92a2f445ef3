//! The event queue: a binary min-heap of small `Copy` events ordered by time, then by insertion
//! (so simultaneous events run in a deterministic order). Pushing reuses the heap's storage: no
//! allocation per event once it has grown.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Which pool a worker is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pool {
    Prefill,
    Decode,
}

/// What happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// A worker's step finishes.
    StepEnd { pool: Pool, worker: u32 },
    /// A remote prefill's KV has fully arrived at decode worker `worker` for its sequence `seq`.
    KvArrived { worker: u32, seq: u32 },
    /// Every worker's periodic load report reaches the router.
    LoadReport,
}

/// An action at a time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    /// Simulated time, ms.
    pub time: f64,
    /// Insertion number: breaks ties in time.
    order: u64,
    pub action: Action,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    /// Reversed, so the std max-heap pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.order.cmp(&self.order))
    }
}

/// Pending events, earliest first.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    heap: BinaryHeap<Event>,
    next_order: u64,
}

impl EventQueue {
    /// Schedules `action` at `time`.
    pub fn push(&mut self, time: f64, action: Action) {
        let order = self.next_order;
        self.next_order += 1;
        self.heap.push(Event {
            time,
            order,
            action,
        });
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<f64> {
        self.heap.peek().map(|e| e.time)
    }

    /// Removes the earliest event.
    pub fn pop(&mut self) -> Option<Event> {
        self.heap.pop()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Events handled so far plus pending (a measure of simulation work).
    pub fn pushed(&self) -> u64 {
        self.next_order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut q = EventQueue::default();
        let a = |w| Action::StepEnd {
            pool: Pool::Decode,
            worker: w,
        };
        q.push(5.0, a(0));
        q.push(1.0, a(1));
        q.push(5.0, a(2));
        q.push(3.0, a(3));
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|e| e.action).collect();
        assert_eq!(order, vec![a(1), a(3), a(0), a(2)]);
        assert_eq!(q.pushed(), 4);
        assert_eq!(q.peek_time(), None);
    }
}

//! Exponential backoff with jitter for reconnect loops.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

/// Delays that double from `min` to `max`, each shortened by up to a quarter at random so that
/// many processes reconnecting to a restarted etcd do not arrive in lockstep.
#[derive(Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    jitter: RandomState,
    attempt: u64,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            next: min,
            jitter: RandomState::new(),
            attempt: 0,
        }
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        self.attempt += 1;
        let quarter = base.as_micros() as u64 / 4;
        let cut = self
            .jitter
            .hash_one(self.attempt)
            .checked_rem(quarter + 1)
            .unwrap_or(0);
        base - Duration::from_micros(cut)
    }

    /// Back to the shortest delay, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_max_with_bounded_jitter_and_resets() {
        let (min, max) = (Duration::from_millis(100), Duration::from_millis(800));
        let mut b = Backoff::new(min, max);
        let mut bases = vec![];
        for _ in 0..6 {
            let d = b.next_delay();
            bases.push(d);
        }
        let expected = [100, 200, 400, 800, 800, 800];
        for (d, base) in bases.iter().zip(expected) {
            let base = Duration::from_millis(base);
            assert!(*d <= base && *d >= base * 3 / 4, "{d:?} vs {base:?}");
        }
        b.reset();
        assert!(b.next_delay() <= min);
    }
}

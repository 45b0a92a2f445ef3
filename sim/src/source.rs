//! Where the next arrival comes from: the requests' own times (open loop), or the completions
//! of earlier requests (closed loop: each completion releases the next request at once).

use std::collections::VecDeque;

use crate::request::SimRequest;

/// The arrivals of one run, earliest first.
#[derive(Debug)]
pub(crate) enum Source {
    /// Request indices sorted by arrival time; `next` is the first that has not arrived.
    Open { order: Vec<u32>, next: usize },
    /// Released requests not yet arrived, as (time, index) in time order, and the first
    /// request not yet released (input order).
    Closed {
        released: VecDeque<(f64, u32)>,
        next: u32,
        total: u32,
    },
}

impl Source {
    /// Each request at its `arrival_ms` (ties keep input order).
    pub fn open(reqs: &[SimRequest]) -> Self {
        let mut order: Vec<u32> = (0..reqs.len() as u32).collect();
        order.sort_by(|&a, &b| {
            reqs[a as usize]
                .arrival_ms
                .total_cmp(&reqs[b as usize].arrival_ms)
        });
        Source::Open { order, next: 0 }
    }

    /// The first `concurrency` of `total` requests at 0, the others as earlier ones complete.
    pub fn closed(total: usize, concurrency: u32) -> Self {
        let total = total as u32;
        let first = concurrency.min(total);
        Source::Closed {
            released: (0..first).map(|i| (0.0, i)).collect(),
            next: first,
            total,
        }
    }

    /// Time of the next arrival.
    pub fn peek(&self, reqs: &[SimRequest]) -> Option<f64> {
        match self {
            Source::Open { order, next } => order.get(*next).map(|&i| reqs[i as usize].arrival_ms),
            Source::Closed { released, .. } => released.front().map(|&(t, _)| t),
        }
    }

    /// The next arrival: its time and request.
    pub fn pop(&mut self, reqs: &[SimRequest]) -> Option<(f64, u32)> {
        match self {
            Source::Open { order, next } => {
                let i = *order.get(*next)?;
                *next += 1;
                Some((reqs[i as usize].arrival_ms, i))
            }
            Source::Closed { released, .. } => released.pop_front(),
        }
    }

    /// A request completed at `now` (simulated time never goes back, so releases stay in
    /// time order).
    pub fn completed(&mut self, now: f64) {
        if let Source::Closed {
            released,
            next,
            total,
        } = self
            && *next < *total
        {
            released.push_back((now, *next));
            *next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use dolphin_workload::Slo;

    use super::*;

    #[test]
    fn closed_loop_releases_in_input_order_on_completion() {
        let mut s = Source::closed(4, 2);
        let reqs: [SimRequest; 0] = [];
        assert_eq!(s.pop(&reqs), Some((0.0, 0)));
        assert_eq!(s.pop(&reqs), Some((0.0, 1)));
        assert_eq!(s.pop(&reqs), None);
        s.completed(7.0);
        assert_eq!(s.peek(&reqs), Some(7.0));
        s.completed(9.0);
        s.completed(12.0); // nothing left to release
        assert_eq!(s.pop(&reqs), Some((7.0, 2)));
        assert_eq!(s.pop(&reqs), Some((9.0, 3)));
        assert_eq!(s.pop(&reqs), None);
        // More concurrency than requests.
        let mut s = Source::closed(1, 8);
        assert_eq!(s.pop(&reqs), Some((0.0, 0)));
        assert_eq!(s.pop(&reqs), None);
    }

    #[test]
    fn open_loop_sorts_by_arrival_keeping_ties_in_input_order() {
        let slo = Slo::new(1.0, 1.0);
        let reqs: Vec<SimRequest> = [5.0, 1.0, 5.0, 0.0]
            .iter()
            .map(|&t| SimRequest::from_hash_ids(t, &[1], 512, 16, 1, slo, 16))
            .collect();
        let mut s = Source::open(&reqs);
        let got: Vec<(f64, u32)> = std::iter::from_fn(|| s.pop(&reqs)).collect();
        assert_eq!(got, [(0.0, 3), (1.0, 1), (5.0, 0), (5.0, 2)]);
    }
}

//! Worker selection inside one pool: cache overlap against load.
//!
//! cost(worker) = overlap_weight * (prompt blocks the worker does not hold) + load, with
//! load = active tokens / block size + waiting requests. The cheapest non-draining worker wins;
//! ties are broken uniformly at random so equal workers share the traffic.

use std::cell::RefCell;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One worker as selection sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The worker's slot in its pool.
    pub slot: usize,
    /// Leading prompt blocks the worker holds.
    pub cached_blocks: u32,
    /// The worker's load in block units (see [`load_cost`]).
    pub load: f64,
    /// A draining worker takes no new requests.
    pub draining: bool,
}

/// The chosen worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// The worker's slot in its pool.
    pub slot: usize,
    /// Leading prompt blocks it holds.
    pub cached_blocks: u32,
    /// Its cost.
    pub cost: f64,
}

/// Load term of the cost: tokens held by running requests, in blocks, plus queued requests.
pub fn load_cost(active_tokens: u64, waiting: u32, block_size: u32) -> f64 {
    active_tokens as f64 / f64::from(block_size.max(1)) + f64::from(waiting)
}

/// Picks the cheapest candidate for a prompt of `prompt_blocks` blocks, skipping draining ones.
pub fn select<R: Rng>(
    candidates: impl IntoIterator<Item = Candidate>,
    prompt_blocks: u32,
    overlap_weight: f64,
    rng: &mut R,
) -> Option<Choice> {
    let mut best: Option<Choice> = None;
    let mut ties = 0u32;
    for c in candidates {
        if c.draining {
            continue;
        }
        let uncached = prompt_blocks.saturating_sub(c.cached_blocks);
        let cost = overlap_weight * f64::from(uncached) + c.load;
        let choice = Choice {
            slot: c.slot,
            cached_blocks: c.cached_blocks,
            cost,
        };
        match best {
            Some(b) if cost > b.cost => {}
            Some(b) if cost == b.cost => {
                // Reservoir sampling: each of the n tied workers ends up chosen with chance 1/n.
                ties += 1;
                if rng.random_ratio(1, ties) {
                    best = Some(choice);
                }
            }
            _ => {
                best = Some(choice);
                ties = 1;
            }
        }
    }
    best
}

thread_local! {
    static RNG: RefCell<SmallRng> = RefCell::new(SmallRng::seed_from_u64(random_seed()));
}

/// A per-thread random seed without an OS RNG dependency: std's `RandomState` is seeded from
/// the OS once per thread and varies per instance.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// Runs `f` with this thread's fast random generator (for tie-breaking on the request path).
pub fn with_rng<T>(f: impl FnOnce(&mut SmallRng) -> T) -> T {
    RNG.with(|r| f(&mut r.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(slot: usize, cached: u32, load: f64) -> Candidate {
        Candidate {
            slot,
            cached_blocks: cached,
            load,
            draining: false,
        }
    }

    #[test]
    fn prefers_cache_overlap_at_equal_load() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = select(
            [cand(0, 0, 0.0), cand(1, 8, 0.0), cand(2, 4, 0.0)],
            10,
            1.0,
            &mut rng,
        );
        assert_eq!(
            c,
            Some(Choice {
                slot: 1,
                cached_blocks: 8,
                cost: 2.0
            })
        );
    }

    #[test]
    fn load_outweighs_small_overlap() {
        let mut rng = SmallRng::seed_from_u64(1);
        let busy = load_cost(160, 3, 16); // 10 + 3
        let c = select([cand(0, 10, busy), cand(1, 0, 0.0)], 10, 1.0, &mut rng).expect("choice");
        assert_eq!(c.slot, 1);
        // A heavier overlap weight flips it.
        let c = select([cand(0, 10, busy), cand(1, 0, 0.0)], 10, 2.0, &mut rng).expect("choice");
        assert_eq!(c.slot, 0);
    }

    #[test]
    fn skips_draining_workers() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut d = cand(0, 10, 0.0);
        d.draining = true;
        let c = select([d, cand(1, 0, 5.0)], 10, 1.0, &mut rng).expect("choice");
        assert_eq!(c.slot, 1);
        assert_eq!(select([d], 10, 1.0, &mut rng), None);
        assert_eq!(select([], 10, 1.0, &mut rng), None);
    }

    #[test]
    fn ties_are_spread_over_all_tied_workers() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut hits = [0u32; 4];
        for _ in 0..4000 {
            let c = select((0..4).map(|s| cand(s, 2, 1.0)), 4, 1.0, &mut rng).expect("choice");
            hits[c.slot] += 1;
        }
        // Each of four equal workers gets roughly a quarter; 600 is far below 1000 +- noise.
        assert!(hits.iter().all(|&h| h > 600), "{hits:?}");
    }

    #[test]
    fn cached_beyond_prompt_is_not_negative() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = select([cand(0, 20, 0.0)], 10, 1.0, &mut rng).expect("choice");
        assert_eq!(c.cost, 0.0);
    }
}

//! The random control: handoffs at geometric gaps, independent of the text, with a chosen share
//! of tokens written by the large model.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::algorithm::{HandoffAlgorithm, Route, StepView};

/// A control that ignores the signals: after each small-model step (subserver `0`) it hands off
/// with probability `to_large`, dropping the token like the gates do; after each large-model step
/// it hands back with probability `to_small`, keeping the token. Spans are therefore geometric.
///
/// With `p = to_large` and `q = to_small`, a small span samples `S` tokens (`E[S] = 1/p`), the
/// last of them dropped, and a large span writes `L` tokens (`E[L] = 1/q`), so the stationary
/// share of answer tokens written by the large model is
/// `E[L] / (E[S] - 1 + E[L]) = p / (p + q (1 - p))` ([`RandomHandoff::large_share`]).
#[derive(Clone, Debug)]
pub struct RandomHandoff {
    /// Probability of handing off after a small-model step, in `[0, 1]`.
    pub to_large: f64,
    /// Probability of handing back after a large-model step, in `[0, 1]`.
    pub to_small: f64,
    rng: SmallRng,
}

/// `p` clamped to `[0, 1]`, NaN read as 0.
fn probability(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}

impl RandomHandoff {
    /// A control with the given probabilities (clamped to `[0, 1]`, NaN read as 0) and a
    /// deterministic generator seeded with `seed`.
    pub fn new(to_large: f64, to_small: f64, seed: u64) -> Self {
        Self {
            to_large: probability(to_large),
            to_small: probability(to_small),
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// A control whose large model writes `large_share` of the answer tokens in the long run, in
    /// spans of `mean_large_span` tokens on average.
    ///
    /// `to_small = 1 / mean_large_span` and, solving `s = E[L] / (E[S] - 1 + E[L])` for
    /// `p = 1 / E[S]` with `s = large_share` and `E[L] = mean_large_span`,
    /// `to_large = s / (s + mean_large_span (1 - s))`. That is exact for the geometric chain:
    /// share 0 never hands off, share 1 hands off after every small step (the small model's tokens
    /// are all dropped, the large model writes everything). `large_share` is clamped to `[0, 1]`
    /// (NaN read as 0) and `mean_large_span` to at least 1 (NaN read as 1; infinity never hands
    /// back).
    pub fn for_share(large_share: f64, mean_large_span: f64, seed: u64) -> Self {
        let share = probability(large_share);
        let span = if mean_large_span.is_nan() {
            1.0
        } else {
            mean_large_span.max(1.0)
        };
        let to_large = if share >= 1.0 {
            1.0
        } else if share <= 0.0 {
            0.0
        } else {
            share / (share + span * (1.0 - share))
        };
        Self::new(to_large, 1.0 / span, seed)
    }

    /// The stationary share of answer tokens the large model writes, `p / (p + q (1 - p))` for
    /// `p = to_large` and `q = to_small` (0 when `p` is 0, 1 when `q` is 0 and `p` is not).
    pub fn large_share(&self) -> f64 {
        let (p, q) = (self.to_large, self.to_small);
        if p <= 0.0 {
            0.0
        } else {
            p / (p + q * (1.0 - p))
        }
    }
}

impl HandoffAlgorithm for RandomHandoff {
    fn route(&mut self, step: &StepView<'_>) -> Route {
        let draw: f64 = self.rng.random();
        if step.model == 0 {
            if draw < self.to_large {
                return super::escalate(step);
            }
        } else if draw < self.to_small {
            return super::hand_back();
        }
        Route::Stay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::test_step;

    /// Drives `alg` for `steps` route calls as a two-model group would; returns the share of
    /// accepted tokens the large model wrote.
    fn simulate(alg: &mut RandomHandoff, steps: u32) -> f64 {
        let (mut model, mut since) = (0, 0);
        let (mut large, mut total) = (0_u64, 0_u64);
        for _ in 0..steps {
            since += 1;
            let route = alg.route(&test_step(model, 1.0, 0.5, 0.1, since));
            if !matches!(route, Route::Handoff { keep: false, .. }) {
                total += 1;
                large += u64::from(model == 1);
            }
            if let Route::Handoff { to, .. } = route {
                model = to;
                since = 0;
            }
        }
        large as f64 / total.max(1) as f64
    }

    #[test]
    fn for_share_hits_the_share() {
        for (share, span) in [(0.3, 4.0), (0.1, 2.0), (0.6, 8.0), (0.5, 1.0)] {
            let mut alg = RandomHandoff::for_share(share, span, 17);
            assert!((alg.large_share() - share).abs() < 1e-12);
            assert!((alg.to_small - 1.0 / span).abs() < 1e-12);
            let measured = simulate(&mut alg, 200_000);
            assert!(
                (measured - share).abs() < 0.01,
                "share {share} span {span}: measured {measured}"
            );
        }
    }

    #[test]
    fn for_share_edges() {
        let mut never = RandomHandoff::for_share(0.0, 4.0, 1);
        assert_eq!(never.to_large, 0.0);
        assert_eq!(simulate(&mut never, 10_000), 0.0);
        let mut always = RandomHandoff::for_share(1.0, 4.0, 1);
        assert_eq!(always.to_large, 1.0);
        assert_eq!(simulate(&mut always, 10_000), 1.0);
        let clamped = RandomHandoff::for_share(f64::NAN, 0.1, 1);
        assert_eq!((clamped.to_large, clamped.to_small), (0.0, 1.0));
    }

    #[test]
    fn seeded_runs_repeat() {
        let mut a = RandomHandoff::new(0.2, 0.5, 3);
        let mut b = RandomHandoff::new(0.2, 0.5, 3);
        for since in 1..100 {
            let step = test_step(0, 1.0, 0.5, 0.1, since);
            assert_eq!(a.route(&step), b.route(&step));
        }
    }
}

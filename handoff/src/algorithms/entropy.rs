//! R-Stitch's entropy gate: the small model writes until a step's distribution is too uncertain,
//! the large model rewrites that token and a short span after it, then hands back.

use crate::algorithm::{HandoffAlgorithm, Route, StepView};

/// R-Stitch: the small model (subserver `0`) hands off to the large model when a step's entropy
/// exceeds `threshold`, dropping that token (the large model writes the position itself); the
/// large model hands back, keeping its token, once it has written `span` tokens since the switch,
/// or earlier as soon as a step's entropy is below `back_entropy`.
///
/// The default (`threshold` 2.0, `span` 4, `back_entropy` 1.0 nats) suits SmolLM2-135M-like
/// models over a 49k vocabulary.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EntropyGate {
    /// Entropy (nats) above which the small model hands off.
    pub threshold: f32,
    /// Most tokens the large model writes before handing back.
    pub span: u32,
    /// Entropy (nats) below which the large model hands back early (`0` never does).
    pub back_entropy: f32,
}

impl EntropyGate {
    /// A gate with the given threshold, span and early hand-back entropy.
    pub fn new(threshold: f32, span: u32, back_entropy: f32) -> Self {
        Self {
            threshold,
            span,
            back_entropy,
        }
    }
}

impl Default for EntropyGate {
    fn default() -> Self {
        Self::new(2.0, 4, 1.0)
    }
}

impl HandoffAlgorithm for EntropyGate {
    fn route(&mut self, step: &StepView<'_>) -> Route {
        if step.model == 0 {
            if step.entropy > self.threshold {
                return super::escalate(step);
            }
        } else if step.since_switch >= self.span || step.entropy < self.back_entropy {
            return super::hand_back();
        }
        Route::Stay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::test_step;

    fn entropy_step(model: usize, entropy: f32, since_switch: u32) -> StepView<'static> {
        test_step(model, entropy, 0.5, 0.1, since_switch)
    }

    #[test]
    fn small_hands_off_only_above_the_threshold_dropping_the_token() {
        let mut gate = EntropyGate::new(2.0, 4, 1.0);
        assert_eq!(gate.route(&entropy_step(0, 1.9, 3)), Route::Stay);
        assert_eq!(gate.route(&entropy_step(0, 2.0, 3)), Route::Stay);
        assert_eq!(
            gate.route(&entropy_step(0, 2.01, 3)),
            Route::Handoff { to: 1, keep: false }
        );
    }

    #[test]
    fn large_hands_back_after_span_keeping_the_token() {
        let mut gate = EntropyGate::new(2.0, 4, 1.0);
        for since in 1..4 {
            assert_eq!(gate.route(&entropy_step(1, 1.5, since)), Route::Stay);
        }
        assert_eq!(
            gate.route(&entropy_step(1, 1.5, 4)),
            Route::Handoff { to: 0, keep: true }
        );
    }

    #[test]
    fn large_hands_back_early_when_confident() {
        let mut gate = EntropyGate::new(2.0, 4, 1.0);
        assert_eq!(
            gate.route(&entropy_step(1, 0.5, 1)),
            Route::Handoff { to: 0, keep: true }
        );
    }

    #[test]
    fn a_group_of_one_stays() {
        let mut gate = EntropyGate::default();
        let mut step = entropy_step(0, 9.0, 1);
        step.models = 1;
        assert_eq!(gate.route(&step), Route::Stay);
    }
}

//! An ensemble of the entropy and confidence gates: hand off only when both agree.

use crate::algorithm::{HandoffAlgorithm, Route, StepView};

/// Two gates that must agree: the small model (subserver `0`) hands off, dropping its token, only
/// when the step's entropy is above `entropy` *and* the sampled token's probability is below
/// `prob`; the large model hands back, keeping its token, after `span` tokens since the switch or
/// as soon as neither signal fires (entropy at most `entropy` and probability at least `prob`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EnsembleGate {
    /// Entropy (nats) above which the entropy signal fires.
    pub entropy: f32,
    /// Probability below which the confidence signal fires.
    pub prob: f32,
    /// Most tokens the large model writes before handing back.
    pub span: u32,
}

impl EnsembleGate {
    /// A gate with the given entropy and probability thresholds and span.
    pub fn new(entropy: f32, prob: f32, span: u32) -> Self {
        Self {
            entropy,
            prob,
            span,
        }
    }
}

impl Default for EnsembleGate {
    /// Entropy 2.0 nats, probability 0.5, span 4.
    fn default() -> Self {
        Self::new(2.0, 0.5, 4)
    }
}

impl HandoffAlgorithm for EnsembleGate {
    fn route(&mut self, step: &StepView<'_>) -> Route {
        let entropy_fires = step.entropy > self.entropy;
        let prob_fires = step.prob < self.prob;
        if step.model == 0 {
            if entropy_fires && prob_fires {
                return super::escalate(step);
            }
        } else if step.since_switch >= self.span || !(entropy_fires || prob_fires) {
            return super::hand_back();
        }
        Route::Stay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::test_step;

    #[test]
    fn small_hands_off_only_when_both_signals_fire() {
        let mut gate = EnsembleGate::new(2.0, 0.5, 4);
        assert_eq!(gate.route(&test_step(0, 3.0, 0.9, 0.1, 1)), Route::Stay);
        assert_eq!(gate.route(&test_step(0, 1.0, 0.1, 0.1, 1)), Route::Stay);
        assert_eq!(
            gate.route(&test_step(0, 3.0, 0.1, 0.1, 1)),
            Route::Handoff { to: 1, keep: false }
        );
    }

    #[test]
    fn large_hands_back_when_neither_fires_or_after_span() {
        let mut gate = EnsembleGate::new(2.0, 0.5, 4);
        // One signal still firing: stay.
        assert_eq!(gate.route(&test_step(1, 3.0, 0.9, 0.1, 1)), Route::Stay);
        assert_eq!(gate.route(&test_step(1, 1.0, 0.1, 0.1, 2)), Route::Stay);
        assert_eq!(
            gate.route(&test_step(1, 1.0, 0.9, 0.1, 1)),
            Route::Handoff { to: 0, keep: true }
        );
        assert_eq!(
            gate.route(&test_step(1, 3.0, 0.1, 0.1, 4)),
            Route::Handoff { to: 0, keep: true }
        );
    }
}

//! R2R's training-free switch: a running average of an uncertainty signal, with hysteresis, so
//! that one uncertain token does not hand a request off and one confident token does not hand it
//! back.

use std::fmt;
use std::str::FromStr;

use crate::algorithm::{HandoffAlgorithm, Route, StepView};

/// The per-step uncertainty an [`UncertaintyMomentum`] averages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Signal {
    /// The step's entropy, in nats.
    #[default]
    Entropy,
    /// One minus the sampled token's probability.
    OneMinusProb,
    /// One minus the margin between the two most likely tokens.
    OneMinusMargin,
}

impl Signal {
    /// Every signal, in the order of their [`code`](Signal::code)s.
    pub const ALL: [Signal; 3] = [
        Signal::Entropy,
        Signal::OneMinusProb,
        Signal::OneMinusMargin,
    ];

    /// The signal's value for a step.
    pub fn value(self, step: &StepView<'_>) -> f32 {
        match self {
            Signal::Entropy => step.entropy,
            Signal::OneMinusProb => 1.0 - step.prob,
            Signal::OneMinusMargin => 1.0 - step.margin,
        }
    }

    /// The signal's name: `entropy`, `prob` or `margin`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Entropy => "entropy",
            Signal::OneMinusProb => "prob",
            Signal::OneMinusMargin => "margin",
        }
    }

    /// The signal as a number (0 entropy, 1 prob, 2 margin), how an algorithm spec's numeric
    /// parameters carry it.
    pub fn code(self) -> f64 {
        match self {
            Signal::Entropy => 0.0,
            Signal::OneMinusProb => 1.0,
            Signal::OneMinusMargin => 2.0,
        }
    }

    /// The signal with the given [`code`](Signal::code), if any.
    pub fn from_code(code: f64) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.code() == code)
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Signal {
    type Err = String;

    /// Parses `entropy`, `prob` (or `one-minus-prob`) and `margin` (or `one-minus-margin`),
    /// ignoring case and `_`/`-` differences.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "entropy" => Ok(Signal::Entropy),
            "prob" | "one-minus-prob" => Ok(Signal::OneMinusProb),
            "margin" | "one-minus-margin" => Ok(Signal::OneMinusMargin),
            other => Err(format!(
                "unknown uncertainty signal `{other}`; accepted: entropy, prob, margin"
            )),
        }
    }
}

/// R2R's training-free switch: keeps a running exponential average `m = decay * m +
/// (1 - decay) * u` of an uncertainty signal `u` over every step of the request, whichever model
/// wrote it. The small model (subserver `0`) hands off, dropping its token, when `m > level`; the
/// large model hands back, keeping its token, when `m < level - hysteresis`. The gap between the
/// two bounds keeps the request from bouncing between the models on a noisy signal.
///
/// The value is one request's state. The average starts from the request's first step (it is
/// seeded with that step's `u`, not with 0, so an uncertain opening can hand off at once) and is
/// not reset at switches: it describes how hard the text is, and the dropped token's uncertainty
/// (the reason for the handoff) stays in it, so the large model hands back only once its own
/// steps have brought the average down. Non-finite signal values (an infinite or NaN entropy) are
/// skipped rather than poisoning the average.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UncertaintyMomentum {
    /// Average above which the small model hands off.
    pub level: f32,
    /// How far below `level` the average must fall for the large model to hand back.
    pub hysteresis: f32,
    /// Weight of the previous average, in `[0, 1)` (0 follows the last step alone).
    pub decay: f32,
    /// The uncertainty averaged.
    pub signal: Signal,
    average: Option<f32>,
}

impl UncertaintyMomentum {
    /// A fresh request's state with the given bounds, decay and signal.
    pub fn new(level: f32, hysteresis: f32, decay: f32, signal: Signal) -> Self {
        Self {
            level,
            hysteresis,
            decay,
            signal,
            average: None,
        }
    }

    /// The default bounds for a signal, with decay 0.5: level 1.5 and hysteresis 0.3 nats for
    /// [`Signal::Entropy`] (SmolLM2-135M-like models over a 49k vocabulary), level 0.5 and
    /// hysteresis 0.1 for the signals in `[0, 1]`.
    pub fn for_signal(signal: Signal) -> Self {
        match signal {
            Signal::Entropy => Self::new(1.5, 0.3, 0.5, signal),
            Signal::OneMinusProb | Signal::OneMinusMargin => Self::new(0.5, 0.1, 0.5, signal),
        }
    }

    /// The running average, `None` before the first step with a finite signal.
    pub fn average(&self) -> Option<f32> {
        self.average
    }
}

impl Default for UncertaintyMomentum {
    /// [`UncertaintyMomentum::for_signal`] of [`Signal::Entropy`].
    fn default() -> Self {
        Self::for_signal(Signal::Entropy)
    }
}

impl HandoffAlgorithm for UncertaintyMomentum {
    fn route(&mut self, step: &StepView<'_>) -> Route {
        let u = self.signal.value(step);
        if u.is_finite() {
            self.average = Some(match self.average {
                Some(m) => self.decay * m + (1.0 - self.decay) * u,
                None => u,
            });
        }
        let Some(m) = self.average else {
            return Route::Stay;
        };
        if step.model == 0 {
            if m > self.level {
                return super::escalate(step);
            }
        } else if m < self.level - self.hysteresis {
            return super::hand_back();
        }
        Route::Stay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::test_step;

    fn entropy_step(model: usize, entropy: f32) -> StepView<'static> {
        test_step(model, entropy, 0.5, 0.5, 1)
    }

    #[test]
    fn average_follows_the_signal() {
        let mut alg = UncertaintyMomentum::new(10.0, 1.0, 0.5, Signal::Entropy);
        alg.route(&entropy_step(0, 2.0));
        assert_eq!(alg.average(), Some(2.0));
        alg.route(&entropy_step(0, 4.0));
        assert_eq!(alg.average(), Some(3.0));
        alg.route(&entropy_step(0, f32::NAN));
        assert_eq!(alg.average(), Some(3.0));
    }

    #[test]
    fn hysteresis_keeps_the_large_model_between_the_bounds() {
        // level 1.5, hysteresis 0.3: hand off above 1.5, hand back below 1.2.
        let mut alg = UncertaintyMomentum::new(1.5, 0.3, 0.5, Signal::Entropy);
        assert_eq!(alg.route(&entropy_step(0, 1.0)), Route::Stay); // m = 1.0
        assert_eq!(alg.route(&entropy_step(0, 1.8)), Route::Stay); // m = 1.4
        assert_eq!(
            alg.route(&entropy_step(0, 2.2)), // m = 1.8
            Route::Handoff { to: 1, keep: false }
        );
        assert_eq!(alg.route(&entropy_step(1, 1.0)), Route::Stay); // m = 1.4, above 1.2
        assert_eq!(alg.route(&entropy_step(1, 1.2)), Route::Stay); // m = 1.3
        assert_eq!(
            alg.route(&entropy_step(1, 0.9)), // m = 1.1, below 1.2
            Route::Handoff { to: 0, keep: true }
        );
        // Back on the small model, 1.3 is below the level: no immediate bounce.
        assert_eq!(alg.route(&entropy_step(0, 1.5)), Route::Stay); // m = 1.3
    }

    #[test]
    fn probability_and_margin_signals() {
        let mut alg = UncertaintyMomentum::for_signal(Signal::OneMinusProb);
        assert_eq!(
            alg.route(&test_step(0, 0.0, 0.2, 0.9, 1)), // u = 0.8
            Route::Handoff { to: 1, keep: false }
        );
        let mut alg = UncertaintyMomentum::for_signal(Signal::OneMinusMargin);
        assert_eq!(alg.route(&test_step(0, 9.0, 0.2, 0.9, 1)), Route::Stay); // u = 0.1
    }

    #[test]
    fn signal_names_and_codes_roundtrip() {
        for signal in Signal::ALL {
            assert_eq!(signal.name().parse::<Signal>(), Ok(signal));
            assert_eq!(Signal::from_code(signal.code()), Some(signal));
        }
        assert_eq!("one_minus_prob".parse::<Signal>(), Ok(Signal::OneMinusProb));
        assert!("loss".parse::<Signal>().is_err());
        assert_eq!(Signal::from_code(0.5), None);
    }
}

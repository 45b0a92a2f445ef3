//! A Co-LLM-style confidence gate: the small model defers to the large model on tokens it gives
//! a low probability, and the threshold is calibrated as a quantile of its confidences.

use crate::algorithm::{HandoffAlgorithm, Route, StepView};

/// Co-LLM style: the small model (subserver `0`) hands off to the large model when the sampled
/// token's probability is below `threshold`, dropping that token; the large model hands back,
/// keeping its token, after `span` tokens since the switch or as soon as a step's probability is
/// at least `threshold`.
///
/// [`calibrate_threshold`] picks `threshold` for a target share of handed-off steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConfidenceGate {
    /// Probability below which the small model hands off (and at or above which the large model
    /// hands back).
    pub threshold: f32,
    /// Most tokens the large model writes before handing back.
    pub span: u32,
}

impl ConfidenceGate {
    /// A gate with the given threshold and span.
    pub fn new(threshold: f32, span: u32) -> Self {
        Self { threshold, span }
    }
}

impl Default for ConfidenceGate {
    /// Threshold 0.5, span 4.
    fn default() -> Self {
        Self::new(0.5, 4)
    }
}

impl HandoffAlgorithm for ConfidenceGate {
    fn route(&mut self, step: &StepView<'_>) -> Route {
        if step.model == 0 {
            if step.prob < self.threshold {
                return super::escalate(step);
            }
        } else if step.since_switch >= self.span || step.prob >= self.threshold {
            return super::hand_back();
        }
        Route::Stay
    }
}

/// The Co-LLM-style quantile calibration `dolphinctl handoff calibrate` uses: given the small
/// model's top-token probabilities measured on a sample, returns the threshold `t` for which the
/// share of samples with confidence `< t` (the steps a [`ConfidenceGate`] with threshold `t`
/// would hand off) is as close as possible to `large_share`.
///
/// NaN confidences are ignored; `large_share` is clamped to `[0, 1]`. Share 0 gives a threshold
/// just below every sample, share 1 one just above every sample; in between, the threshold lies
/// midway between the two samples it separates (ties can make the exact share unreachable: the
/// nearest reachable one wins, the smaller on a draw). Returns `None` when no sample is left or
/// `large_share` is NaN.
pub fn calibrate_threshold(confidences: &[f32], large_share: f64) -> Option<f32> {
    if large_share.is_nan() {
        return None;
    }
    let mut sorted: Vec<f32> = confidences
        .iter()
        .copied()
        .filter(|c| !c.is_nan())
        .collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f32::total_cmp);
    let n = sorted.len();
    let target = large_share.clamp(0.0, 1.0) * n as f64;
    // `j` samples can lie below a threshold iff `j` is 0 or `n`, or sample `j - 1` is strictly
    // below sample `j`.
    let below = (0..=n)
        .filter(|&j| j == 0 || j == n || sorted[j - 1] < sorted[j])
        .min_by(|&a, &b| {
            (a as f64 - target)
                .abs()
                .total_cmp(&(b as f64 - target).abs())
        })?;
    let threshold = if below == 0 {
        sorted[0].next_down()
    } else if below == n {
        sorted[n - 1].next_up()
    } else {
        let (lo, hi) = (sorted[below - 1], sorted[below]);
        let mid = lo.midpoint(hi);
        // Adjacent floats (or infinities) can round the midpoint onto `lo`; `hi` is always exact.
        if mid > lo && mid <= hi { mid } else { hi }
    };
    Some(threshold)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::test_step;

    fn prob_step(model: usize, prob: f32, since_switch: u32) -> StepView<'static> {
        test_step(model, 1.0, prob, 0.1, since_switch)
    }

    fn share_below(sample: &[f32], threshold: f32) -> f64 {
        sample.iter().filter(|&&c| c < threshold).count() as f64 / sample.len() as f64
    }

    #[test]
    fn small_hands_off_below_the_threshold() {
        let mut gate = ConfidenceGate::new(0.5, 4);
        assert_eq!(gate.route(&prob_step(0, 0.5, 2)), Route::Stay);
        assert_eq!(
            gate.route(&prob_step(0, 0.49, 2)),
            Route::Handoff { to: 1, keep: false }
        );
    }

    #[test]
    fn large_hands_back_after_span_or_when_confident() {
        let mut gate = ConfidenceGate::new(0.5, 3);
        assert_eq!(gate.route(&prob_step(1, 0.2, 1)), Route::Stay);
        assert_eq!(gate.route(&prob_step(1, 0.2, 2)), Route::Stay);
        assert_eq!(
            gate.route(&prob_step(1, 0.2, 3)),
            Route::Handoff { to: 0, keep: true }
        );
        assert_eq!(
            gate.route(&prob_step(1, 0.5, 1)),
            Route::Handoff { to: 0, keep: true }
        );
    }

    #[test]
    fn calibration_hits_the_share() {
        let sample: Vec<f32> = (1..=100).map(|i| i as f32 / 100.0).collect();
        let t = calibrate_threshold(&sample, 0.3).expect("a threshold");
        assert!((share_below(&sample, t) - 0.3).abs() < 1e-9, "t = {t}");
        assert!(t > 0.30 && t <= 0.31, "t = {t}");
        for share in [0.0, 0.01, 0.5, 0.77, 0.99, 1.0] {
            let t = calibrate_threshold(&sample, share).expect("a threshold");
            assert!(
                (share_below(&sample, t) - share).abs() < 1e-9,
                "{share}: t = {t}"
            );
        }
    }

    #[test]
    fn calibration_edges() {
        let sample = [0.9_f32, 0.2, f32::NAN, 0.6];
        let low = calibrate_threshold(&sample, 0.0).expect("a threshold");
        assert!(low < 0.2);
        let high = calibrate_threshold(&sample, 1.0).expect("a threshold");
        assert!(high > 0.9);
        // Clamped shares.
        assert_eq!(calibrate_threshold(&sample, -3.0), Some(low));
        assert_eq!(calibrate_threshold(&sample, 7.0), Some(high));
        assert_eq!(calibrate_threshold(&[], 0.5), None);
        assert_eq!(calibrate_threshold(&[f32::NAN], 0.5), None);
        assert_eq!(calibrate_threshold(&sample, f64::NAN), None);
    }

    #[test]
    fn calibration_with_ties_picks_the_nearest_reachable_share() {
        let mut sample = vec![0.5_f32; 8];
        sample.extend([0.9, 0.95]);
        // 3 of 10 below is unreachable: 0 (distance 3) beats 8 (distance 5).
        let t = calibrate_threshold(&sample, 0.3).expect("a threshold");
        assert_eq!(share_below(&sample, t), 0.0);
        let t = calibrate_threshold(&sample, 0.7).expect("a threshold");
        assert_eq!(share_below(&sample, t), 0.8);
    }
}

//! The fixed references: every token from the small model, or every token from the large one.

use crate::algorithm::{HandoffAlgorithm, ModelIndex, Route, StepView};

/// Reference: subserver `0` (the small model) writes the whole request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlwaysSmall;

impl HandoffAlgorithm for AlwaysSmall {
    fn start(&self) -> ModelIndex {
        0
    }

    fn route(&mut self, _step: &StepView<'_>) -> Route {
        Route::Stay
    }
}

/// Reference: subserver `1` (the large model of a two-model group) writes the whole request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlwaysLarge;

impl HandoffAlgorithm for AlwaysLarge {
    fn start(&self) -> ModelIndex {
        1
    }

    fn route(&mut self, _step: &StepView<'_>) -> Route {
        Route::Stay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::test_step;

    #[test]
    fn references_start_on_their_model_and_stay() {
        let uncertain = test_step(0, 9.0, 0.01, 0.0, 1);
        assert_eq!(AlwaysSmall.start(), 0);
        assert_eq!(AlwaysSmall.route(&uncertain), Route::Stay);
        let uncertain = test_step(1, 9.0, 0.01, 0.0, 100);
        assert_eq!(AlwaysLarge.start(), 1);
        assert_eq!(AlwaysLarge.route(&uncertain), Route::Stay);
    }
}

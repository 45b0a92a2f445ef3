//! The handoff algorithms Dolphin ships: uncertainty gates from the token-level routing
//! literature (R-Stitch's entropy gate, a Co-LLM-style confidence gate, R2R's training-free
//! uncertainty momentum, an ensemble of two gates) and the references a comparison needs (always
//! small, always large, random handoffs with a chosen large-model share).
//!
//! Each value is one request's state. In a model group subserver `0` is the small model and the
//! others are larger ones (`1` in the usual two-model group): a gate hands an uncertain request up
//! to the next subserver *dropping* the uncertain token (the larger model writes that position
//! itself) and hands it back to subserver `0` *keeping* the token just written. In a group of one
//! subserver every algorithm stays.

pub mod confidence;
pub mod ensemble;
pub mod entropy;
pub mod fixed;
pub mod momentum;
pub mod random;

pub use confidence::{ConfidenceGate, calibrate_threshold};
pub use ensemble::EnsembleGate;
pub use entropy::EntropyGate;
pub use fixed::{AlwaysLarge, AlwaysSmall};
pub use momentum::{Signal, UncertaintyMomentum};
pub use random::RandomHandoff;

use crate::algorithm::{Route, StepView};

/// Hands the request from the small model up to the next subserver, discarding the token just
/// sampled (the larger model writes that position itself); stays in a group of one subserver.
fn escalate(step: &StepView<'_>) -> Route {
    if step.models < 2 {
        Route::Stay
    } else {
        Route::Handoff {
            to: step.peer(),
            keep: false,
        }
    }
}

/// Hands the request back to the small model (subserver `0`), keeping the token just written.
fn hand_back() -> Route {
    Route::Handoff { to: 0, keep: true }
}

/// A `StepView` for the unit tests: a two-model group, the given model and signals.
#[cfg(test)]
fn test_step(
    model: usize,
    entropy: f32,
    prob: f32,
    margin: f32,
    since_switch: u32,
) -> StepView<'static> {
    StepView {
        model,
        models: 2,
        token: 0,
        prob,
        entropy,
        margin,
        position: 0,
        since_switch,
        tokens: &[],
        prompt_len: 0,
    }
}

//! Timing profiles from measurement: time a backend's steps over a grid of shapes
//! ([`measure`]), then fit a [`crate::SimProfile`]'s step-time model to them ([`fit_profile`]),
//! with the error of every step against the fitted profile. `dolphinctl profile fit` drives it
//! for the candle engine (or the sim engine, which must give back its own profile).

mod fit;
mod measure;
#[cfg(test)]
mod tests;

pub use fit::{ErrorSummary, FitError, ProfileFit, Residual, fit_profile};
pub use measure::{FitGrid, StepSample, StepShape, measure};

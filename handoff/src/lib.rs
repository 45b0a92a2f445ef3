#![warn(missing_docs)]
//! Token-level handoffs between models on one decode worker (TokenRouter, DESIGN.md section 9).
//!
//! - [`ModelGroup`]: subservers (each a full engine: scheduler loop, KV pool, prefix cache,
//!   batching) behind one [`dolphin_engine::Engine`]; requests move between them token by token
//!   through handoff-resume, carried out by the inter-model loop.
//! - [`HandoffAlgorithm`]: `route`, `send`, `receive`; the training-free algorithms are in
//!   [`algorithms`], named and parameterized by [`AlgorithmSpec`].
//! - [`plan`]: the discrete-time Markov chain that picks each subserver's delayed-batching B.
//! - [`dispatcher`]: the external-dispatcher baseline (one server per model, every handoff a
//!   fresh request).

mod algorithm;
pub mod algorithms;
pub mod dispatcher;
mod group;
mod inter;
pub mod metrics;
pub mod plan;
pub mod probe;
mod request;
pub mod samples;
mod spec;
mod stats;

pub use algorithm::{HandoffAlgorithm, ModelIndex, Route, StepView};
pub use group::{GroupError, GroupOptions, ModelGroup, Subserver};
pub use spec::{AlgorithmSpec, SpecError, threshold_key};
pub use stats::{GroupStats, ModelCounters};

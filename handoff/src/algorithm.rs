//! The `HandoffAlgorithm` trait: the three per-request functions a token-level routing algorithm
//! writes (TokenRouter's `route`, `send`, `receive`), and what `route` sees after each step.

use std::fmt::Debug;

/// Index of a subserver in its model group (`0` is the first `--subserver` given).
pub type ModelIndex = usize;

/// What `route` sees after one decoding step of one subserver.
#[derive(Clone, Copy, Debug)]
pub struct StepView<'a> {
    /// The subserver that just decoded.
    pub model: ModelIndex,
    /// Number of subservers in the group.
    pub models: usize,
    /// The token it sampled.
    pub token: u32,
    /// Probability of `token` under the step's distribution (softmax of the logits).
    pub prob: f32,
    /// Entropy of the step's distribution, in nats.
    pub entropy: f32,
    /// Probability of the most likely token minus that of the second.
    pub margin: f32,
    /// Index of `token` among the generated tokens (0 for the first).
    pub position: u32,
    /// Tokens this subserver has written since it took the request over, `token` included.
    pub since_switch: u32,
    /// The sequence before `token`: the prompt, then every accepted token.
    pub tokens: &'a [u32],
    /// Prompt length (the first `prompt_len` entries of `tokens`).
    pub prompt_len: u32,
}

impl StepView<'_> {
    /// The other subserver of a two-model group (the next one in a larger group).
    pub fn peer(&self) -> ModelIndex {
        (self.model + 1) % self.models.max(1)
    }
}

/// What to do after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Keep the token and keep decoding here.
    Stay,
    /// Hand the request to subserver `to`. With `keep` the token just sampled is part of the
    /// answer and `to` continues after it; without, it is discarded and `to` writes that position
    /// itself (what a gate on an uncertain token wants).
    Handoff {
        /// The subserver to continue.
        to: ModelIndex,
        /// Whether the token just sampled is kept.
        keep: bool,
    },
}

/// A token-level routing algorithm: one value per request (its own state), called by the
/// request's subservers in turn. Implementations are small: see `algorithms/`.
pub trait HandoffAlgorithm: Send + Debug {
    /// The subserver that starts the request (prefills the prompt and writes the first token).
    fn start(&self) -> ModelIndex {
        0
    }

    /// After each step of the subserver that holds the request: stay, or hand off.
    fn route(&mut self, step: &StepView<'_>) -> Route;

    /// Packages what subserver `to` has not seen: `suffix`, the accepted tokens since it last
    /// held the request. The default sends them as they are.
    fn send(&mut self, to: ModelIndex, suffix: &[u32]) -> Vec<u32> {
        let _ = to;
        suffix.to_vec()
    }

    /// Turns what subserver `from` wrote during its span into local state; returns how many of
    /// `tokens` are accepted (a prefix). The default accepts every token.
    fn receive(&mut self, from: ModelIndex, tokens: &[u32]) -> usize {
        let _ = from;
        tokens.len()
    }
}

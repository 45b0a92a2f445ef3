//! Driven sequences: the engine side of token-level handoffs between models.
//!
//! A driven sequence belongs to a controller outside the engine (a model group's per-request
//! state) that sees every token the moment it is sampled and decides, before the next step,
//! whether the sequence keeps it and keeps decoding here, or pauses. A paused sequence keeps its
//! blocks and state and is skipped by batches; tokens another model wrote can be appended to it
//! (computed in one catch-up chunk through the same scheduler, never as a new request), after
//! which it decodes on as if it had never left.

use std::fmt::Debug;

use crate::types::{FinishReason, SeqUsage, TokenLogprobs, TokenStats};

/// A token a driven sequence just sampled, as its driver sees it.
#[derive(Clone, Copy, Debug)]
pub struct DrivenToken<'a> {
    /// The sampled token.
    pub token: u32,
    /// Its distribution's statistics; `None` for a first token sampled elsewhere (a prefill
    /// worker's, on the remote path).
    pub stats: Option<TokenStats>,
    /// Its log probabilities, where the request asked for them.
    pub logprobs: Option<&'a TokenLogprobs>,
    /// The sequence before `token`: prompt, then every token kept or appended so far.
    pub tokens: &'a [u32],
    /// Prompt length.
    pub prompt_len: u32,
}

/// What a driven sequence does with the token it sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steer {
    /// Keep it and decode on.
    Keep,
    /// Keep it, then pause (another model continues after it).
    KeepAndPause,
    /// Discard it and pause (another model writes this position).
    DropAndPause,
}

/// How a driven sequence ended in one engine.
#[derive(Clone, Debug, PartialEq)]
pub enum DrivenEnd {
    /// A kept token met a stop condition (end of sequence, a stop token, `max_tokens`).
    Finished {
        /// Why.
        reason: FinishReason,
        /// Token counts as this engine saw them.
        usage: SeqUsage,
    },
    /// Cancelled (`Engine::cancel`) or the engine shut down.
    Cancelled,
    /// The backend failed the sequence.
    Failed(String),
}

/// The controller of driven sequences. Both calls come from inside the engine, with its lock
/// held: they must be quick and must not call back into the same engine (hand work to another
/// task instead).
pub trait SeqDriver: Send + Sync + Debug + 'static {
    /// A token was sampled; the answer applies before the sequence's next step.
    fn on_token(&self, token: DrivenToken<'_>) -> Steer;

    /// The sequence ended in this engine (called once, after which it is gone).
    fn on_end(&self, end: DrivenEnd);
}

/// How a driven sequence begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriveStart {
    /// Prefill the prompt, sample the first token and decode: the model that starts.
    Active,
    /// Prefill all of the prompt but its last token, then wait paused for `append`: a peer
    /// model, kept one catch-up away from taking over.
    Passive,
}

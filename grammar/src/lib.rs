#![warn(missing_docs)]
//! Structured output: a request asks its output to follow a [`Format`] (a JSON Schema, any JSON
//! object, a regular expression, one of a list of strings, or a Lark grammar), and the engine
//! draws every token under a mask that keeps the text a prefix of something the format accepts,
//! ending the request when the format is complete. The compilation and the masks are
//! [llguidance](https://github.com/guidance-ai/llguidance)'s, the library vLLM and SGLang use
//! for the same job.
//!
//! Three parties use this crate:
//! - the router checks a request's format before routing it ([`Format::check`], against a
//!   byte-level vocabulary, so every grammar error is the client's 400 whatever the model);
//! - an engine builds one [`TokenSpace`] per model vocabulary at load (each token's bytes);
//! - each constrained sequence holds a [`Constrained`]: it reads every token the model is fed
//!   past the prompt (whoever drew it: this engine, a prefill worker, the other model of a
//!   group) and masks the logits of the next draw.

mod constrained;
mod error;
mod format;
mod space;
mod wire;

pub use constrained::Constrained;
pub use error::GrammarError;
pub use format::{Format, JSON_WHITESPACE, LARK_WHITESPACE, bounded_whitespace};
pub use space::{TokenSpace, TokenText};

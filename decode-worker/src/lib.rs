//! Dolphin's decode worker: decodes requests, prefilling their prompts locally or through a
//! prefill worker that pushes the KV here (falling back to local prefill when that fails).
//!
//! [`run`] is the whole process; [`start`] serves a worker on a given engine (in-process tests).
//!
//! The remote path (DESIGN.md section 3): the worker reserves KV for the part of the prompt it
//! does not hold (it owns its memory: the allocation precedes any byte), announces a transfer on
//! its KV listener, calls the prefill worker with that transfer id and the blocks to skip,
//! imports blocks as they arrive, and decodes from the prefill worker's first token.

mod cancel;
pub mod clients;
pub mod config;
pub mod error;
mod forward;
pub mod group;
#[cfg(feature = "nccl")]
pub mod kv_link;
pub mod node;
mod remote;
pub mod run;
pub mod service;
pub mod transfer_ids;

pub use config::DecodeConfig;
pub use error::DecodeError;
pub use node::{DecodeOptions, start};
pub use run::run;
pub use service::{DecodeContext, DecodeService};

//! Dolphin's prefill worker: computes prompts' KV (reusing its own prefix cache), pushes the
//! blocks a decode worker lacks to that worker's KV listener, and answers with the first token.
//!
//! [`run`] is the whole process; [`start`] serves a worker on a given engine (in-process tests).

pub mod config;
pub mod node;
pub mod run;
pub mod service;
pub mod transfer_status;

pub use config::PrefillConfig;
pub use node::{PrefillOptions, start};
pub use run::run;
pub use service::PrefillService;

//! Dolphin's prefill worker: computes prompts' KV (reusing its own prefix cache), pushes the
//! blocks a decode worker lacks to that worker's KV listener (TCP, or NCCL with the `nccl`
//! feature), the first token with the last block.
//!
//! [`run`] is the whole process; [`start`] serves a worker on a given engine (in-process tests).

pub mod config;
pub mod kv_link;
pub mod node;
pub mod run;
pub mod service;
pub mod transfer_status;

pub use config::PrefillConfig;
pub use node::{PrefillOptions, start};
pub use run::run;
pub use service::PrefillService;

//! Dolphin operator CLI: start a local cluster (`up`), inspect the router's workers
//! (`workers`), send a streamed request (`request`), and replay a workload on the live router
//! or the simulator (`replay`).
//!
//! The process supervision pieces ([`process`], [`ready`]) are also what the end-to-end tests
//! use to run the real binaries.

pub mod chart;
pub mod classifier;
pub mod cli;
pub mod client;
pub mod drain;
pub mod error;
pub mod handoff;
pub mod launch;
pub mod learn;
pub mod machine;
pub mod pdeathsig;
pub mod process;
pub mod profile;
pub mod ready;
pub mod replay;
pub mod request;
pub mod summary;
pub mod supervise;
pub mod table_diff;
pub mod tables;
pub mod up;
pub mod workers;

pub use error::CtlError;

//! Dolphin's front router: OpenAI-compatible HTTP and gRPC APIs, prefix index, worker selection,
//! prefill policies.
//!
//! A request flows through [`dispatch::Dispatcher`]: tokenize ([`tokenizer`]), hash the prompt
//! into blocks, look up every worker's cached prefix ([`prefix_index`]), pick the decode and
//! prefill workers ([`selection`]), compute the [`policy::Features`] and ask the [`policy`] for
//! local or remote prefill, then call the decode worker and stream its tokens back
//! ([`stream`]). Workers come and go through [`workers`] (fed by [`discovery`]); their cache
//! events arrive through a subscriber task per worker.

pub mod admission;
mod answer;
pub mod auth;
pub mod bad_words;
pub mod config;
pub mod discovery;
pub mod dispatch;
pub mod dolphin;
pub mod error;
pub mod grpc;
pub mod grpc_call;
mod grpc_generate;
pub mod http;
pub mod metrics;
mod migration;
pub mod policy;
pub mod prefix_index;
pub mod prompt_blocks;
mod pythonic;
mod pythonic_grammar;
pub mod reasoning;
pub mod request_log;
mod required_calls;
pub mod route;
pub mod selection;
pub mod server;
pub mod shard;
pub mod stop;
pub mod stream;
mod subscriber;
pub mod tokenizer;
pub mod tools;
pub mod worker_channel;
pub mod worker_handle;
pub mod workers;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod testutil;

pub use config::RouterConfig;
pub use dispatch::Dispatcher;
pub use error::DispatchError;
pub use server::{RunningRouter, ServerError, start};

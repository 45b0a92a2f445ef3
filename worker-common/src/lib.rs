//! What Dolphin's prefill and decode workers share: their common flags, engine construction, the
//! `dolphin.v1.Worker` service (Subscribe, Info, Drain), serving gRPC with health and reflection,
//! the `DOLPHIN_READY` line, etcd registration and graceful shutdown.
//!
//! A worker binary parses its config (with [`CommonArgs`] flattened in), builds the engine
//! ([`build_engine`]), binds its listeners, creates the [`WorkerState`], starts a
//! [`RunningWorker`] with its role's service, and hands it to [`run_until_stopped`].

pub mod admission;
pub mod args;
pub mod engine;
pub mod error;
pub mod events;
pub mod lifecycle;
pub mod logprobs;
pub mod main_body;
pub mod metrics;
pub mod process;
pub mod ready;
pub mod request;
pub mod server;
pub mod service;
pub mod state;
pub mod status;
pub mod stop_tokens;
pub mod subscribe;
pub mod telemetry;

pub use admission::{Admission, AdmissionGuard, Draining};
pub use args::{CommonArgs, EngineArgs, EngineKind, KvTransportKind};
pub use dolphin_cluster::signal::{StopSignal, StopSignals};
pub use engine::{build_engine, configure_compute_threads};
pub use error::{ConfigError, WorkerError};
pub use lifecycle::{Lifecycle, run_until_stopped};
pub use main_body::{ExitStatus, WorkerConfig, worker_main};
pub use process::{run_worker, run_worker_with};
pub use ready::{READY_PREFIX, print_ready, ready_line};
pub use request::{BadRequest, seq_request};
pub use server::{RunningWorker, bind};
pub use service::WorkerService;
pub use state::{WorkerIdentity, WorkerState};
pub use status::{engine_status, error_chain};
pub use stop_tokens::WithStopTokens;

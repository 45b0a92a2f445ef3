//! Errors of a worker process's life: configuration, binding, engine construction, serving,
//! registration.

use std::net::SocketAddr;

/// A flag value the worker cannot run with (exit code 64).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag is out of range or malformed.
    #[error("invalid --{flag}: {reason}")]
    Invalid {
        /// Flag name without dashes.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The simulation profile could not be loaded.
    #[error("cannot load sim profile {name:?}")]
    Profile {
        /// Name or path as given.
        name: String,
        /// Cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ConfigError {
    /// An out-of-range or malformed flag.
    pub fn invalid(flag: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            flag,
            reason: reason.into(),
        }
    }
}

/// Why a worker could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not be bound.
    #[error("cannot bind the {what} listener on {addr}")]
    Bind {
        /// Which listener ("gRPC", "KV transfer", "metrics").
        what: &'static str,
        /// Address asked for.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A listener has no address other hosts can connect to.
    #[error(transparent)]
    Advertise(#[from] dolphin_cluster::AdvertiseError),
    /// The engine refused to start.
    #[error("cannot start the engine")]
    Engine(#[source] dolphin_engine::EngineError),
    /// Registering in etcd failed (at start: the worker does not run unregistered).
    #[error("etcd registration failed")]
    Registration(#[source] dolphin_cluster::DiscoveryError),
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
    /// The gRPC server task panicked or was cancelled.
    #[error("gRPC server task failed")]
    ServerTask(#[source] tokio::task::JoinError),
    /// The gRPC server stopped while the worker was meant to run.
    #[error("gRPC server stopped unexpectedly")]
    ServerStopped,
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The ready line could not be written.
    #[error("cannot write the ready line to stdout")]
    Ready(#[source] std::io::Error),
}

impl WorkerError {
    /// The process exit code for this error: 64 (EX_USAGE) for bad configuration, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_)
            | Self::Advertise(_)
            | Self::Engine(dolphin_engine::EngineError::Config(_)) => 64,
            _ => 1,
        }
    }
}

impl crate::ExitStatus for WorkerError {
    fn exit_code(&self) -> u8 {
        WorkerError::exit_code(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configuration_exits_64_and_names_the_flag() {
        let err = WorkerError::from(ConfigError::invalid("block-size", "must be at least 1"));
        assert_eq!(err.exit_code(), 64);
        assert_eq!(err.to_string(), "invalid --block-size: must be at least 1");
        assert_eq!(WorkerError::ServerStopped.exit_code(), 1);
    }
}

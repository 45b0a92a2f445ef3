//! The signals that stop a worker.

/// The signal that asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM (what process managers and Kubernetes send).
    Terminate,
    /// SIGINT (Ctrl-C).
    Interrupt,
}

impl StopSignal {
    /// Signal name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        }
    }
}

/// SIGTERM and SIGINT handlers. Install them before the worker announces itself: a signal that
/// arrives before a handler exists kills the process with the default action, skipping the drain.
#[derive(Debug)]
pub struct StopSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers (needs a running tokio runtime).
    pub fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    /// Completes on the next SIGTERM or SIGINT.
    pub async fn recv(&mut self) -> StopSignal {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => StopSignal::Terminate,
                _ = self.int.recv() => StopSignal::Interrupt,
            }
        }
        #[cfg(not(unix))]
        {
            // ctrl_c only fails when the handler cannot be installed; then never complete.
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            StopSignal::Interrupt
        }
    }
}

//! The signals that stop a local cluster: SIGINT (Ctrl-C), SIGTERM, and SIGHUP (the terminal
//! went away; without a handler dolphinctl would die and leave its children behind).

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::error::CtlError;

/// Handlers for the stop signals, installed once; signals that arrive between `recv` calls are
/// not lost.
#[derive(Debug)]
pub struct StopSignals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl StopSignals {
    /// Installs the handlers (this replaces the default "terminate at once" action).
    pub fn install() -> Result<Self, CtlError> {
        let install = |kind| signal(kind).map_err(CtlError::Signal);
        Ok(Self {
            int: install(SignalKind::interrupt())?,
            term: install(SignalKind::terminate())?,
            hup: install(SignalKind::hangup())?,
        })
    }

    /// Waits for the next stop signal and returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

//! The signals that stop a Dolphin process (router, workers, dolphinctl), as one set of handlers.
//!
//! Install them before the process announces itself: a signal that arrives before a handler
//! exists kills the process with the default action, skipping its drain. Signals that arrive
//! between two `recv` calls are not lost.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The signal that asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM (what process managers and Kubernetes send).
    Terminate,
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGHUP (the terminal went away), for processes that ask for it.
    Hangup,
}

impl StopSignal {
    /// The signal's name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
            Self::Hangup => "SIGHUP",
        }
    }
}

impl std::fmt::Display for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Handlers for SIGTERM and SIGINT, and SIGHUP when asked.
#[derive(Debug)]
pub struct StopSignals {
    term: Signal,
    int: Signal,
    hup: Option<Signal>,
}

impl StopSignals {
    /// Installs SIGTERM and SIGINT handlers (needs a running tokio runtime).
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: None,
        })
    }

    /// The same and SIGHUP: for a process whose terminal may go away (dolphinctl), which
    /// would otherwise die at once and leave its children behind.
    pub fn install_with_hangup() -> std::io::Result<Self> {
        let mut signals = Self::install()?;
        signals.hup = Some(signal(SignalKind::hangup())?);
        Ok(signals)
    }

    /// Completes on the next stop signal.
    pub async fn recv(&mut self) -> StopSignal {
        let hup = async {
            match &mut self.hup {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.term.recv() => StopSignal::Terminate,
            _ = self.int.recv() => StopSignal::Interrupt,
            _ = hup => StopSignal::Hangup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_sent_to_the_process_is_received_by_name() {
        let mut signals = StopSignals::install_with_hangup().expect("install");
        // SIGHUP: the test harness neither sends nor expects it, and the handler is installed.
        let status = std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), signals.recv())
            .await
            .expect("received");
        assert_eq!(got, StopSignal::Hangup);
        assert_eq!(got.to_string(), "SIGHUP");
    }
}

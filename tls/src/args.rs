//! The TLS flags every Dolphin process takes.

use std::path::PathBuf;

use clap::Args;

use crate::{Tls, TlsError};

/// TLS flags, flattened into each binary's configuration. Without them nothing is encrypted (a
/// development cluster on one machine).
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// PEM certificate chain this process presents, as a server and as a client. Turns TLS on
    /// for every listener and connection of the process.
    #[arg(long, env = "DOLPHIN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "DOLPHIN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle the certificates of peers must chain to. Cluster listeners then require a
    /// client certificate from it (mutual TLS); clients verify servers against it. Alone (no
    /// certificate of its own) it makes a TLS client only, as `dolphinctl` is.
    #[arg(long, env = "DOLPHIN_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// The name every member's certificate carries (a SAN), checked instead of the address
    /// dialed: members dial each other by IP address.
    #[arg(long, env = "DOLPHIN_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

impl TlsArgs {
    /// Whether TLS is on.
    pub fn enabled(&self) -> bool {
        self.tls_cert.is_some() || self.tls_ca.is_some()
    }

    /// The TLS state these flags describe (files read and checked now), or `None` when TLS is off.
    pub fn load(&self) -> Result<Option<Tls>, TlsError> {
        if !self.enabled() {
            return Ok(None);
        }
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => {
                return Err(TlsError::Config(
                    "--tls-cert and --tls-key go together".into(),
                ));
            }
        };
        Tls::load(identity, self.tls_ca.clone(), self.tls_server_name.clone()).map(Some)
    }
}

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
    /// PEM CA bundle etcd's certificate chains to: turns TLS to etcd on (endpoints then
    /// `https://`). etcd usually has a CA of its own, hence a flag of its own.
    #[arg(long, env = "DOLPHIN_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd (`--client-cert-auth`); default: `--tls-cert`.
    #[arg(long, env = "DOLPHIN_ETCD_CERT", requires_all = ["etcd_key", "etcd_ca"])]
    pub etcd_cert: Option<PathBuf>,
    /// PEM key of `--etcd-cert`; default: `--tls-key`.
    #[arg(long, env = "DOLPHIN_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

impl TlsArgs {
    /// Whether TLS is on.
    pub fn enabled(&self) -> bool {
        self.tls_cert.is_some() || self.tls_ca.is_some()
    }

    /// For a cluster member (router, workers): it both serves and dials other members, so TLS
    /// needs its certificate, key and the CA. `None` when TLS is off.
    pub fn load_member(&self) -> Result<Option<Tls>, TlsError> {
        if self.enabled() && (self.tls_cert.is_none() || self.tls_ca.is_none()) {
            return Err(TlsError::Config(
                "TLS between cluster members needs --tls-cert, --tls-key and --tls-ca".into(),
            ));
        }
        self.load()
    }

    /// TLS to etcd, when `--etcd-ca` is given: (CA, the client certificate and key, which are
    /// `--etcd-cert/--etcd-key` or else this process's own).
    #[allow(clippy::type_complexity)]
    pub fn etcd(&self) -> Option<(PathBuf, Option<(PathBuf, PathBuf)>)> {
        let ca = self.etcd_ca.clone()?;
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            _ => self.tls_cert.clone().zip(self.tls_key.clone()),
        };
        Some((ca, identity))
    }

    /// These settings as command-line flags for a child process.
    pub fn to_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        let mut push = |flag: &str, value: Option<String>| {
            if let Some(v) = value {
                flags.push(flag.to_owned());
                flags.push(v);
            }
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        push("--tls-cert", path(&self.tls_cert));
        push("--tls-key", path(&self.tls_key));
        push("--tls-ca", path(&self.tls_ca));
        push("--tls-server-name", self.tls_server_name.clone());
        push("--etcd-ca", path(&self.etcd_ca));
        push("--etcd-cert", path(&self.etcd_cert));
        push("--etcd-key", path(&self.etcd_key));
        flags
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

//! etcd discovery: workers register a leased record, the router watches the prefix.
//!
//! The pattern (as in Dynamo's etcd transport): a lease tied to the process, the record written
//! with create-if-absent in a transaction so two processes cannot share an id, and a watcher that
//! takes a snapshot and then watches from the snapshot's revision + 1, re-snapshotting after any
//! disconnect so nothing that happened meanwhile is missed.

mod members;
mod registration;
mod watch;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

pub use registration::Registration;
pub use watch::watch_workers;

use crate::discovery::DiscoveryError;

/// Longest wait for one etcd request. etcd-client's balanced channel queues requests while no
/// endpoint is reachable instead of failing them, so every call goes through [`deadline`].
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Shortest and longest wait between reconnect attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Where etcd is and how this process uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Cluster name: the `<cluster>` in `/dolphin/<cluster>/...`.
    pub cluster: String,
    /// Lease TTL of a worker's registration: how long a crashed worker stays listed.
    pub lease_ttl_secs: i64,
    /// TLS to etcd; `None`: plaintext.
    pub tls: Option<EtcdTls>,
}

/// TLS to etcd: the CA etcd's certificate chains to and, where etcd requires client
/// certificates (`--client-cert-auth`), the certificate and key this process presents. The files
/// are read when the client connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM CA bundle.
    pub ca: PathBuf,
    /// PEM certificate chain and key.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name etcd's certificate must carry, when not the endpoint's host.
    pub domain: Option<String>,
}

impl EtcdConfig {
    /// A configuration with the default TTL (10 s).
    pub fn new(endpoints: Vec<String>, cluster: impl Into<String>) -> Self {
        EtcdConfig {
            endpoints,
            cluster: cluster.into(),
            ..EtcdConfig::default()
        }
    }

    fn validate(&self) -> Result<(), DiscoveryError> {
        if self.endpoints.is_empty() {
            return Err(DiscoveryError::InvalidConfig("no etcd endpoints".into()));
        }
        if self.cluster.is_empty() || self.cluster.contains('/') {
            return Err(DiscoveryError::InvalidConfig(format!(
                "cluster name {:?} must be non-empty and contain no '/'",
                self.cluster
            )));
        }
        match &self.tls {
            Some(_) => {
                if let Some(e) = self.endpoints.iter().find(|e| e.starts_with("http://")) {
                    return Err(DiscoveryError::InvalidConfig(format!(
                        "etcd endpoint {e} is http:// but TLS to etcd is on: use https://"
                    )));
                }
            }
            None => {
                if let Some(e) = self.endpoints.iter().find(|e| e.starts_with("https://")) {
                    return Err(DiscoveryError::InvalidConfig(format!(
                        "etcd endpoint {e} is https://: give --etcd-ca (the CA etcd's \
                         certificate chains to)"
                    )));
                }
            }
        }
        if self.lease_ttl_secs <= 0 {
            return Err(DiscoveryError::InvalidConfig(format!(
                "lease TTL must be positive, got {}",
                self.lease_ttl_secs
            )));
        }
        Ok(())
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            cluster: "default".into(),
            lease_ttl_secs: 10,
            tls: None,
        }
    }
}

impl EtcdConfig {
    /// How this process's etcd clients connect: timeouts, keep-alive, and TLS when configured
    /// (its files read now).
    pub fn connect_options(&self) -> Result<ConnectOptions, DiscoveryError> {
        self.validate()?;
        let options = base_options();
        let Some(tls) = &self.tls else {
            return Ok(options);
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| DiscoveryError::Io {
                path: path.clone(),
                source,
            })
        };
        let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
        if let Some((cert, key)) = &tls.identity {
            t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(domain) = &tls.domain {
            t = t.domain_name(domain.clone());
        }
        Ok(options.with_tls(t))
    }
}

/// A client for `cfg`. Connecting is lazy: errors surface on the first request.
async fn connect(cfg: &EtcdConfig) -> Result<Client, DiscoveryError> {
    let options = cfg.connect_options()?;
    deadline("connect", Client::connect(&cfg.endpoints, Some(options))).await
}

fn base_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(REQUEST_TIMEOUT)
        // HTTP/2 pings find a dead connection (network cut, etcd host gone) that no request
        // would notice while we only wait on a stream. etcd refuses pings more often than every
        // 5 s by default, hence 10 s.
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(true)
        // A member cut off from the others must not feed us a frozen view.
        .with_require_leader(true)
}

/// Runs one etcd request with [`REQUEST_TIMEOUT`].
async fn deadline<T>(
    op: &'static str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, DiscoveryError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(result) => result.map_err(DiscoveryError::Etcd),
        Err(_) => Err(DiscoveryError::Timeout { op }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        assert!(EtcdConfig::default().validate().is_ok());
        assert_eq!(EtcdConfig::default().lease_ttl_secs, 10);
        let no_endpoints = EtcdConfig::new(vec![], "c");
        assert!(matches!(
            no_endpoints.validate(),
            Err(DiscoveryError::InvalidConfig(_))
        ));
        let bad_cluster = EtcdConfig::new(vec!["http://x:1".into()], "a/b");
        assert!(bad_cluster.validate().is_err());
        let bad_ttl = EtcdConfig {
            lease_ttl_secs: 0,
            ..EtcdConfig::default()
        };
        assert!(bad_ttl.validate().is_err());
    }
}

//! Test helpers (feature `test-util`): a real single-member etcd on free loopback ports.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The etcd binary (Debian's `etcd-server`); `DOLPHIN_ETCD_BIN` overrides it.
const DEFAULT_ETCD_BIN: &str = "/usr/bin/etcd";
/// Longest wait for a fresh etcd to report healthy (about 1 s normally; the machine is noisy).
const HEALTH_DEADLINE: Duration = Duration::from_secs(30);
/// Fresh port pairs tried when another process takes a port between probe and etcd's bind.
const START_ATTEMPTS: usize = 5;

/// A single-member etcd in a temporary data directory, killed (SIGKILL) on drop.
///
/// `restart` reuses the ports and the data directory, so clients reconnect to the same
/// endpoint and find the same data (and leases).
#[derive(Debug)]
pub struct EtcdServer {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    /// Plain-HTTP `/health` (and metrics), so health is probed the same way with TLS on.
    metrics_port: u16,
    tls: Option<EtcdServerTls>,
    child: Option<Child>,
}

/// TLS on etcd's client port: its certificate and key, and the CA client certificates must
/// chain to (`--client-cert-auth`: a client without one is refused).
#[derive(Clone, Debug)]
pub struct EtcdServerTls {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM key.
    pub key: PathBuf,
    /// PEM CA bundle for client certificates.
    pub client_ca: PathBuf,
}

impl EtcdServer {
    /// Starts etcd and waits until it reports healthy. Panics if it cannot.
    pub async fn start() -> EtcdServer {
        Self::start_with(None).await
    }

    /// Starts etcd serving clients over TLS with client-certificate auth.
    pub async fn start_tls(tls: EtcdServerTls) -> EtcdServer {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<EtcdServerTls>) -> EtcdServer {
        let dir = tempfile::Builder::new()
            .prefix("dolphin-etcd-")
            .tempdir()
            .expect("create a temp dir for etcd");
        let mut server = EtcdServer {
            dir,
            client_port: 0,
            peer_port: 0,
            metrics_port: 0,
            tls,
            child: None,
        };
        for attempt in 1..=START_ATTEMPTS {
            server.client_port = free_port();
            server.peer_port = free_port();
            server.metrics_port = free_port();
            server.spawn();
            match server.wait_healthy().await {
                Ok(()) => return server,
                Err(why) if attempt < START_ATTEMPTS => {
                    eprintln!("etcd attempt {attempt} failed ({why}); retrying on other ports");
                    server.kill();
                    // A half-initialized data dir from a failed start would pin the old ports.
                    let _ = std::fs::remove_dir_all(server.data_dir());
                }
                Err(why) => panic!("etcd did not start: {why}\n{}", server.log_tail()),
            }
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// The client URL, e.g. `http://127.0.0.1:41234` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd with SIGKILL (no graceful shutdown, like a crash) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills etcd if it runs, starts it again on the same ports and data, waits until healthy.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn();
        if let Err(why) = self.wait_healthy().await {
            panic!("etcd did not restart: {why}\n{}", self.log_tail());
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn spawn(&mut self) {
        let bin = std::env::var("DOLPHIN_ETCD_BIN").unwrap_or_else(|_| DEFAULT_ETCD_BIN.into());
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the etcd log");
        let log_err = log.try_clone().expect("clone the etcd log handle");
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(&bin);
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()))
                .arg(format!("--trusted-ca-file={}", tls.client_ca.display()))
                .arg("--client-cert-auth");
        }
        let metrics = format!("http://127.0.0.1:{}", self.metrics_port);
        let child = command
            .arg("--name=n0")
            .arg(format!("--listen-metrics-urls={metrics}"))
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=n0={peer}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run {bin}: {err}"));
        self.child = Some(child);
    }

    /// Polls `GET /health` until etcd answers healthy, the process exits, or the deadline passes.
    async fn wait_healthy(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!("etcd exited with {status}"));
            }
            if health(self.metrics_port).await {
                return Ok(());
            }
            if started.elapsed() > HEALTH_DEADLINE {
                return Err(format!("not healthy after {HEALTH_DEADLINE:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        tail(&self.log_path(), 4000)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port that was free a moment ago (the OS picks it; etcd binds it right after).
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

async fn health(port: u16) -> bool {
    let probe = async {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.ok()?;
        let request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        Some(response.contains(r#""health":"true""#))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Some(true))
    )
}

fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}

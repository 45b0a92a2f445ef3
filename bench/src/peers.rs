//! The peer routers of `router_overhead`, in front of instant mock workers
//! (`mock_http_worker`): nginx as a plain HTTP reverse proxy with an upstream keepalive pool (the
//! floor of what forwarding costs), and SGLang's gateway `smg` 1.13.0 in cache-aware and in P/D
//! mode. `scripts/install-peers.sh` installs both; a peer that is not installed is reported as
//! missing, never replaced by something else. How each peer is run, and what the mock must answer
//! for smg, is in `bench/peers.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::http_client::HttpConn;
use crate::process::{ChildProcess, sibling_binary, spawn_plain, spawn_ready};

/// The smg release the benchmark is written against.
pub const SMG_VERSION: &str = "1.13.0";

/// How long a peer may take to answer its readiness check.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A started peer: its process (whose CPU time is measured) and its HTTP address.
#[derive(Debug)]
pub struct Peer {
    /// The router process.
    pub process: ChildProcess,
    /// `host:port` of its HTTP listener.
    pub http_addr: String,
}

/// Where the installed peers are, or why one is not there.
#[derive(Debug, Clone)]
pub struct PeerBins {
    /// The nginx binary.
    pub nginx: Result<PathBuf, String>,
    /// The `smg` launcher of the venv made by `scripts/install-peers.sh`.
    pub smg: Result<PathBuf, String>,
}

fn executable(path: &Path) -> Result<PathBuf, String> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(format!(
            "{} not found (run scripts/install-peers.sh)",
            path.display()
        ))
    }
}

impl PeerBins {
    /// The given paths, else nginx from `PATH` or `/usr/sbin`, and smg from
    /// `$DOLPHIN_PEERS_DIR/smg-venv` (default `~/.cache/dolphin/peers`).
    pub fn locate(nginx: Option<PathBuf>, smg: Option<PathBuf>) -> PeerBins {
        let nginx = match nginx {
            Some(p) => executable(&p),
            None => std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .chain([PathBuf::from("/usr/sbin")])
                .map(|dir| dir.join("nginx"))
                .find(|p| p.is_file())
                .ok_or_else(|| "nginx not found (run scripts/install-peers.sh)".to_string()),
        };
        let smg = match smg {
            Some(p) => executable(&p),
            None => executable(&peers_dir().join("smg-venv/bin/smg")),
        };
        PeerBins { nginx, smg }
    }
}

/// Where `scripts/install-peers.sh` puts the peers' venvs: `$DOLPHIN_PEERS_DIR`, default
/// `~/.cache/dolphin/peers`.
pub fn peers_dir() -> PathBuf {
    std::env::var_os("DOLPHIN_PEERS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dolphin/peers")))
        .unwrap_or_else(|| PathBuf::from(".cache/dolphin/peers"))
}

/// A loopback port that was free a moment ago (for programs that cannot report the port they
/// bound, such as nginx and smg).
pub fn free_port() -> Result<u16, BenchError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(BenchError::io("bind a port"))?;
    Ok(l.local_addr()
        .map_err(BenchError::io("local address"))?
        .port())
}

/// Starts a mock worker (`mock_http_worker`, built beside this benchmark).
pub async fn start_mock(log_dir: &Path, name: &str, model: &str) -> Result<Peer, BenchError> {
    let bin = sibling_binary("mock_http_worker")?;
    let args = ["--addr", "127.0.0.1:0", "--model", model].map(String::from);
    let process = spawn_ready(name, &bin, &args, &[], log_dir, READY_TIMEOUT).await?;
    let http_addr = process.http_addr()?.to_string();
    Ok(Peer { process, http_addr })
}

/// The nginx configuration: one process (no master), HTTP/1.1 to the upstream with a keepalive
/// pool, no buffering (as a router streams), no access log, every path inside `-p DIR`.
fn nginx_conf(listen: &str, upstream: &str) -> String {
    format!(
        "master_process off;\ndaemon off;\npid nginx.pid;\nerror_log error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path client_body_temp;\n  \
         proxy_temp_path proxy_temp;\n  fastcgi_temp_path fastcgi_temp;\n  uwsgi_temp_path uwsgi_temp;\n  \
         scgi_temp_path scgi_temp;\n  keepalive_requests 1000000;\n  \
         upstream workers {{ server {upstream}; keepalive 64; keepalive_requests 1000000; keepalive_timeout 60s; }}\n  \
         server {{\n    listen {listen};\n    location / {{\n      proxy_pass http://workers;\n      \
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      \
         proxy_buffering off;\n      proxy_request_buffering off;\n    }}\n  }}\n}}\n"
    )
}

/// Starts nginx in front of `upstream`, as one process (`master_process off`), so its CPU time
/// is the one process's.
pub async fn start_nginx(bin: &Path, log_dir: &Path, upstream: &str) -> Result<Peer, BenchError> {
    let dir = log_dir.join("nginx");
    std::fs::create_dir_all(&dir).map_err(BenchError::io(format!("create {}", dir.display())))?;
    let dir = dir
        .canonicalize()
        .map_err(BenchError::io("resolve the nginx dir"))?;
    let http_addr = format!("127.0.0.1:{}", free_port()?);
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&http_addr, upstream))
        .map_err(BenchError::io(format!("write {}", conf.display())))?;
    let args = vec![
        "-p".to_string(),
        format!("{}/", dir.display()),
        "-c".to_string(),
        conf.display().to_string(),
    ];
    let process = spawn_plain("nginx", bin, &args, log_dir)?;
    wait_ready(&process, &http_addr, "/health", |_| true).await?;
    Ok(Peer { process, http_addr })
}

/// Which smg mode.
#[derive(Clone, Debug)]
pub enum SmgMode {
    /// Cache-aware routing over these workers.
    Regular { workers: Vec<String> },
    /// P/D disaggregation: prefill and decode workers.
    Pd {
        prefill: Vec<String>,
        decode: Vec<String>,
    },
}

/// Starts smg (`smg launch`) quietly, with periodic health and load checks made rare (so they
/// do not count as per-request work), and waits until every worker is healthy.
pub async fn start_smg(
    bin: &Path,
    log_dir: &Path,
    name: &str,
    mode: &SmgMode,
) -> Result<Peer, BenchError> {
    let port = free_port()?;
    let http_addr = format!("127.0.0.1:{port}");
    let mut args: Vec<String> = ["launch", "--host", "127.0.0.1", "--port"]
        .map(String::from)
        .to_vec();
    args.push(port.to_string());
    args.extend(["--prometheus-host", "127.0.0.1", "--prometheus-port"].map(String::from));
    args.push(free_port()?.to_string());
    let quiet = [
        "--policy",
        "cache_aware",
        "--log-level",
        "error",
        "--disable-tokenizer-autoload",
        "--health-check-interval-secs",
        "3600",
        "--load-monitor-interval",
        "3600",
        "--worker-startup-check-interval",
        "1",
        "--shutdown-grace-period-secs",
        "0",
    ];
    args.extend(quiet.map(String::from));
    let workers = match mode {
        SmgMode::Regular { workers } => {
            args.push("--worker-urls".into());
            args.extend(workers.iter().map(|w| format!("http://{w}")));
            workers.len()
        }
        SmgMode::Pd { prefill, decode } => {
            args.push("--pd-disaggregation".into());
            for p in prefill {
                // The bootstrap port is where SGLang's KV handshake would listen; smg only
                // passes it on (and warns that nothing listens there).
                args.extend(["--prefill".into(), format!("http://{p}")]);
                args.push(free_port()?.to_string());
            }
            for d in decode {
                args.extend(["--decode".into(), format!("http://{d}")]);
            }
            prefill.len() + decode.len()
        }
    };
    let process = spawn_plain(name, bin, &args, log_dir)?;
    wait_ready(&process, &http_addr, "/readiness", |body| {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["healthy_workers"].as_u64())
            == Some(workers as u64)
    })
    .await?;
    Ok(Peer { process, http_addr })
}

/// Polls `GET path` until it answers 200 with a body `ok` accepts.
async fn wait_ready(
    process: &ChildProcess,
    addr: &str,
    path: &str,
    ok: impl Fn(&[u8]) -> bool,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        if let Some(e) = process.exited() {
            return Err(e);
        }
        match HttpConn::connect(addr).await {
            Ok(mut conn) => match conn.get(path).await {
                Ok((status, body)) if status.is_success() && ok(&body) => return Ok(()),
                Ok((status, body)) => {
                    last = format!("HTTP {status}: {}", String::from_utf8_lossy(&body));
                }
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(BenchError::NotReady {
        name: format!("peer at {addr}"),
        detail: format!("GET {path} not ready within {READY_TIMEOUT:?}: {last}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_conf_names_listen_and_upstream() {
        let c = nginx_conf("127.0.0.1:81", "127.0.0.1:82");
        assert!(c.contains("listen 127.0.0.1:81;"));
        assert!(c.contains("server 127.0.0.1:82;"));
        assert!(c.contains("master_process off;"));
        assert!(c.contains("keepalive 64;"));
    }

    #[test]
    fn a_missing_peer_is_reported_with_the_install_hint() {
        let bins = PeerBins::locate(
            Some(PathBuf::from("/nonexistent/nginx")),
            Some(PathBuf::from("/nonexistent/smg")),
        );
        assert!(bins.nginx.unwrap_err().contains("install-peers.sh"));
        assert!(bins.smg.unwrap_err().contains("/nonexistent/smg"));
    }
}

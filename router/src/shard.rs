//! Serving shards: the router answers clients on N threads, each with an event loop of its own
//! (a single-threaded tokio runtime) and its own connections to the workers, the way nginx runs
//! one process per core.
//!
//! A request never leaves the thread whose shard accepted its connection: the client's
//! connection, the call to the decode worker, that worker connection's HTTP/2 task and the
//! response all run there. On tokio's work-stealing runtime the same request woke the other
//! thread several times (futex and eventfd writes, a task migrating between cores), which cost
//! more than the request's own work: `router_overhead` on 2 cores measured the router's CPU per
//! request 1.3-2x lower on one thread than on two, at 1 and at 16 connections.
//!
//! The control runtime (where [`crate::start`] runs: discovery, event subscribers, etcd, signals)
//! accepts connections and deals them to the shards in turn; a shard serves each connection it is
//! handed until the connection closes. [`current`] tells code on a shard which one it is on, so
//! per-worker state such as [`crate::worker_channel::WorkerChannel`] keeps one client per shard.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use dolphin_tls::{MaybeTlsStream, accept_tls};
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Serving shards of this process, set once when the router starts (1 until then).
static COUNT: OnceLock<usize> = OnceLock::new();

/// The shard this thread serves: `1..=count()` on a shard's thread, 0 elsewhere (the control
/// runtime, tests).
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}

/// Serving shards of this process (each has index `1..=count()`).
pub fn count() -> usize {
    COUNT.get().copied().unwrap_or(1)
}

/// Sets the number of shards (first call wins: a process runs one router). Returns the
/// number in effect.
pub(crate) fn set_count(n: usize) -> usize {
    *COUNT.get_or_init(|| n.max(1))
}

/// A connection accepted for a shard, not yet registered with any runtime.
pub(crate) type Handoff = (std::net::TcpStream, SocketAddr);

/// A connection whose TLS handshake is done (or that has no TLS).
type Ready = (MaybeTlsStream, SocketAddr);

/// Receives the connections one listener deals to one shard.
#[derive(Debug)]
pub(crate) struct ShardListener {
    rx: mpsc::UnboundedReceiver<Handoff>,
    local: SocketAddr,
    /// TLS on this listener (no client certificates: public clients use API keys).
    tls: Option<Arc<ServerConfig>>,
    /// Handshakes run on tasks of this shard, so a slow client holds up only itself; finished
    /// ones come back here.
    ready_tx: mpsc::UnboundedSender<Ready>,
    ready_rx: mpsc::UnboundedReceiver<Ready>,
    dealer_gone: bool,
}

impl ShardListener {
    /// The next connection, registered with this thread's runtime and past its TLS handshake.
    /// Never returns once the acceptor has stopped and no handshake is pending (servers stop on
    /// their shutdown signal, not on a closed listener).
    pub(crate) async fn next(&mut self) -> (MaybeTlsStream, SocketAddr) {
        loop {
            tokio::select! {
                Some(ready) = self.ready_rx.recv() => return ready,
                dealt = self.rx.recv(), if !self.dealer_gone => {
                    let Some((std, addr)) = dealt else {
                        self.dealer_gone = true;
                        continue;
                    };
                    let tcp = match TcpStream::from_std(std) {
                        Ok(tcp) => tcp,
                        Err(e) => {
                            tracing::warn!(error = %e, %addr, "cannot adopt an accepted connection");
                            continue;
                        }
                    };
                    let Some(config) = self.tls.clone() else {
                        return (MaybeTlsStream::Plain(tcp), addr);
                    };
                    let ready = self.ready_tx.clone();
                    tokio::spawn(async move {
                        match accept_tls(tcp, Some(config)).await {
                            Ok(stream) => {
                                let _ = ready.send((stream, addr));
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, %addr, "TLS handshake failed");
                            }
                        }
                    });
                }
            }
        }
    }
}

impl axum::serve::Listener for ShardListener {
    type Io = MaybeTlsStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.next().await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Accepts on `listener` until `shutdown` and deals each connection (TCP_NODELAY set) to the
/// shards in turn; returns one [`ShardListener`] per shard, which does the TLS handshake when
/// `tls` is given. Runs on the caller's runtime.
pub(crate) fn deal(
    listener: TcpListener,
    shards: usize,
    tls: Option<Arc<ServerConfig>>,
    shutdown: CancellationToken,
) -> std::io::Result<Vec<ShardListener>> {
    let local = listener.local_addr()?;
    let (txs, listeners): (Vec<_>, Vec<_>) = (0..shards.max(1))
        .map(|_| {
            let (tx, rx) = mpsc::unbounded_channel();
            let (ready_tx, ready_rx) = mpsc::unbounded_channel();
            let listener = ShardListener {
                rx,
                local,
                tls: tls.clone(),
                ready_tx,
                ready_rx,
                dealer_gone: false,
            };
            (tx, listener)
        })
        .unzip();
    tokio::spawn(async move {
        let next = AtomicUsize::new(0);
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, addr) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, %local, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            let std = match stream.into_std() {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, %addr, "cannot hand off a connection");
                    continue;
                }
            };
            let i = next.fetch_add(1, Ordering::Relaxed) % txs.len();
            if txs[i].send((std, addr)).is_err() {
                return; // the shard stopped: shutting down
            }
        }
    });
    Ok(listeners)
}

/// Runs `serve(shard_index)` on a new thread with a single-threaded runtime of its own; the
/// thread ends when the future does.
pub(crate) fn spawn<F, Fut>(index: usize, serve: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("dolphin-shard-{index}"))
        .spawn(move || {
            CURRENT.with(|c| c.set(index));
            runtime.block_on(serve());
        })
}

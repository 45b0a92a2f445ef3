//! Logs and metrics setup shared by every Dolphin process, and the cluster crate's metric names.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use axum::serve::ListenerExt;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tracing_subscriber::EnvFilter;

/// Counter: leases granted after the first, i.e. registrations restored after a loss.
pub const ETCD_REREGISTRATIONS_TOTAL: &str = "dolphin_etcd_reregistrations_total";
/// Counter: membership snapshots retaken after a watch broke.
pub const ETCD_WATCH_RESYNCS_TOTAL: &str = "dolphin_etcd_watch_resyncs_total";

/// Every metric name of the cluster crate.
pub const ALL: &[&str] = &[ETCD_REREGISTRATIONS_TOTAL, ETCD_WATCH_RESYNCS_TOTAL];

/// Histogram buckets, by name suffix or full name: every histogram exports buckets (which
/// aggregate across replicas), never a summary. Latencies span 1 ms to 2 min; the routing
/// decision is microseconds; step times are sub-millisecond to a second.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const FAST_BUCKETS: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2,
];
const STEP_BUCKETS: &[f64] = &[
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
const BYTES_BUCKETS: &[f64] = &[
    1024.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
];
const COUNT_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// How often histogram buffers are folded so memory stays bounded between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Logs to stderr with tracing-subscriber's fmt (RUST_LOG / default "info"; JSON lines when
/// `json`), and, when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`), exports
/// the trace spans ([`crate::otel`]) as `service`. Call inside the tokio runtime and keep the
/// guard until the process ends (dropping it flushes the last spans). Idempotent: later calls
/// return an empty guard.
///
/// Logs go to stderr: stdout carries the `DOLPHIN_READY` line that tests and dolphinctl parse.
pub fn init_tracing(json: bool, service: &str) -> crate::otel::TraceGuard {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    static ONCE: OnceLock<()> = OnceLock::new();
    let mut guard = None;
    ONCE.get_or_init(|| {
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let fmt = if json {
            fmt.json().with_filter(filter).boxed()
        } else {
            fmt.with_filter(filter).boxed()
        };
        let provider = match crate::otel::provider(service) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{service}: traces are not exported: {e}");
                None
            }
        };
        let otel = provider.as_ref().map(crate::otel::layer);
        // Another subscriber (a test harness, an embedding program) may already be set; keep it.
        let _ = tracing_subscriber::registry()
            .with(fmt)
            .with(otel)
            .try_init();
        guard = provider;
    });
    crate::otel::TraceGuard(guard)
}

/// The handle of the recorder [`init_metrics`] installed.
static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Whether [`init_metrics`] has run: a global recorder is installed, for good.
pub(crate) fn metrics_installed() -> bool {
    METRICS.get().is_some()
}

/// Installs the Prometheus recorder (metrics-exporter-prometheus, no HTTP listener) and returns a
/// handle whose `render()` gives the exposition text; idempotent (returns the same handle).
///
/// If some other recorder was installed first, the returned handle renders an empty registry.
pub fn init_metrics() -> PrometheusHandle {
    METRICS
        .get_or_init(|| {
            let recorder = histogram_buckets(PrometheusBuilder::new()).build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            describe_metrics();
            let upkeep = handle.clone();
            // A plain thread: this may run before (or outside) any tokio runtime.
            let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(
                move || loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    upkeep.run_upkeep();
                },
            );
            if let Err(err) = spawned {
                tracing::warn!(error = %err, "no metrics upkeep thread; histograms grow until scraped");
            }
            handle
        })
        .clone()
}

/// The builder with explicit buckets for every Dolphin histogram.
fn histogram_buckets(b: PrometheusBuilder) -> PrometheusBuilder {
    use metrics_exporter_prometheus::Matcher;
    // Full names win over suffixes (the exporter's order): the two timings that are not request
    // latencies, named here as in their crates' metric modules.
    let rules: [(Matcher, &[f64]); 6] = [
        (
            Matcher::Full("dolphin_router_route_seconds".into()),
            FAST_BUCKETS,
        ),
        (
            Matcher::Full("dolphin_engine_step_seconds".into()),
            STEP_BUCKETS,
        ),
        (Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS),
        (Matcher::Suffix("_bytes".into()), BYTES_BUCKETS),
        (Matcher::Suffix("_batch_size".into()), COUNT_BUCKETS),
        (Matcher::Suffix("_batch_tokens".into()), COUNT_BUCKETS),
    ];
    rules.into_iter().fold(b, |b, (matcher, buckets)| {
        b.set_buckets_for_metric(matcher, buckets)
            .expect("bucket lists are non-empty constants")
    })
}

fn describe_metrics() {
    metrics::describe_counter!(
        ETCD_REREGISTRATIONS_TOTAL,
        "Worker registrations restored in etcd after the lease or key was lost."
    );
    metrics::describe_counter!(
        ETCD_WATCH_RESYNCS_TOTAL,
        "Membership snapshots retaken after the etcd watch broke."
    );
}

/// Serve `/metrics` (and `/health`) over HTTP on `addr` with the handle, until the token is cancelled.
pub async fn serve_metrics(
    addr: SocketAddr,
    handle: PrometheusHandle,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_metrics_on(TcpListener::bind(addr).await?, handle, shutdown).await
}

/// Like [`serve_metrics`] on a listener the caller bound, so it can learn the port first.
pub async fn serve_metrics_on(
    listener: TcpListener,
    handle: PrometheusHandle,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/health", get(|| std::future::ready("ok")));
    // Scrapes are small request/response exchanges: Nagle would only add latency.
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "cannot set TCP_NODELAY on a metrics connection");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// A tonic incoming stream over a bound listener, with TCP_NODELAY on accepted sockets: gRPC
/// servers bind first (to print the chosen port), then serve with
/// `serve_with_incoming(nodelay_incoming(listener))`.
pub fn nodelay_incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn http_get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    #[test]
    fn init_is_idempotent() {
        drop(init_tracing(false, "test"));
        drop(init_tracing(true, "test"));
        let a = init_metrics();
        metrics::counter!("dolphin_cluster_test_idempotent_total").increment(1);
        let b = init_metrics();
        // Same registry behind both handles: a counter bumped once shows in each.
        for handle in [a, b] {
            assert!(
                handle
                    .render()
                    .contains("dolphin_cluster_test_idempotent_total 1")
            );
        }
    }

    #[tokio::test]
    async fn serves_metrics_and_health_until_cancelled() {
        let handle = init_metrics();
        metrics::counter!("dolphin_cluster_test_served_total").increment(3);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_metrics_on(listener, handle, stop.clone()));

        let metrics = http_get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("dolphin_cluster_test_served_total 3"),
            "{metrics}"
        );
        let health = http_get(addr, "/health").await;
        assert!(
            health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
            "{health}"
        );
        assert!(http_get(addr, "/nope").await.starts_with("HTTP/1.1 404"));

        stop.cancel();
        server.await.expect("join").expect("serve");
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "listener closed after shutdown"
        );
    }
}

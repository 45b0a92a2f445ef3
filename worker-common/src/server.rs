//! Serving a worker's gRPC services: the role's service plus `Worker`, health and reflection, on
//! a listener bound beforehand (so port 0 works and the real port is known before announcing).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use dolphin_proto::v1::worker_server::WorkerServer;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{
    service::Routes,
    transport::{Server, server::TcpIncoming},
};
use tonic_health::server::HealthService;

use dolphin_tls::{Tls, accept_incoming};

use crate::{
    error::{ConfigError, WorkerError},
    service::WorkerService,
    state::WorkerState,
};

/// How long the server may take to close its connections once the worker is drained: what is
/// still open then (a client that never reads) is cut.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Once the drain grace period is over, how long aborted requests get to notice and clean up.
const ABORT_SETTLE: Duration = Duration::from_secs(2);

/// Binds a gRPC listener (port 0 picks a free port) and returns it with the address it got.
pub async fn bind(
    addr: SocketAddr,
    what: &'static str,
) -> Result<(TcpListener, SocketAddr), WorkerError> {
    let err = |source| WorkerError::Bind { what, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(err)?;
    let bound = listener.local_addr().map_err(err)?;
    Ok((listener, bound))
}

/// A worker whose gRPC server runs.
#[derive(Debug)]
pub struct RunningWorker {
    state: Arc<WorkerState>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    /// Tells the server to stop accepting and close connections gracefully.
    stop: CancellationToken,
    /// Cancelled when the server task ends, for whatever reason.
    exited: CancellationToken,
}

impl RunningWorker {
    /// Serves `role_routes` (the role's own service) plus `dolphin.v1.Worker`, `grpc.health.v1`
    /// and reflection on `listener`, with TCP_NODELAY on every accepted socket (token streams are
    /// many small writes; Nagle would hold them back). With `tls`, every connection is mutual
    /// TLS: a client certificate from the cluster's CA is required.
    pub async fn start(
        listener: TcpListener,
        state: Arc<WorkerState>,
        role_routes: Routes,
        tls: Option<&Tls>,
    ) -> Result<Self, WorkerError> {
        let tls = tls
            .map(|t| t.cluster_server_config(&[b"h2"]))
            .transpose()
            .map_err(|e| ConfigError::invalid("tls-cert", e.to_string()))?;
        state.mark_serving().await;
        let (reflection_v1, reflection_v1alpha) = dolphin_proto::reflection_services();
        let health = tonic_health::pb::health_server::HealthServer::new(
            HealthService::from_health_reporter(state.health().clone()),
        );
        let routes = role_routes
            .add_service(WorkerServer::new(WorkerService::new(Arc::clone(&state))))
            .add_service(health)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha);
        let stop = CancellationToken::new();
        let exited = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            let exited = exited.clone();
            tokio::spawn(async move {
                let _exited = exited.drop_guard();
                // Outermost: the call's span covers everything the server does for it.
                let server = Server::builder()
                    .layer(dolphin_cluster::layers::ServerSpanLayer)
                    .add_routes(routes);
                match tls {
                    None => {
                        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                        server
                            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                            .await
                    }
                    Some(config) => {
                        // Handshakes on tasks of their own, beside the accept loop.
                        let incoming = accept_incoming(listener, Some(config), stop.clone());
                        server
                            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                            .await
                    }
                }
            })
        };
        Ok(Self {
            state,
            task,
            stop,
            exited,
        })
    }

    /// The worker's shared state.
    pub fn state(&self) -> &Arc<WorkerState> {
        &self.state
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.state.identity().grpc_addr
    }

    /// Completes if the server stops on its own (an accept loop error): the worker is then dead.
    pub async fn server_exited(&self) {
        self.exited.cancelled().await;
    }

    /// Drains: stops admitting, waits up to `grace` for running requests, then aborts the rest.
    /// Returns whether every request finished within the grace period.
    pub async fn drain(&self, grace: Duration) -> bool {
        let running = self.state.begin_drain().await;
        let admission = self.state.admission();
        if admission.wait_idle(grace).await {
            tracing::info!("drained: no request running");
            return true;
        }
        tracing::warn!(
            running = admission.inflight(),
            initially = running,
            "drain grace period over; aborting the requests still running"
        );
        admission.abort_running();
        admission.wait_idle(ABORT_SETTLE).await;
        false
    }

    /// Stops the server: ends Subscribe streams, closes connections (cut after a timeout) and
    /// reports how the server ended. Call [`RunningWorker::drain`] first to let requests finish.
    pub async fn stop(self) -> Result<(), WorkerError> {
        self.state.closing().cancel();
        self.stop.cancel();
        let mut task = self.task;
        match tokio::time::timeout(CLOSE_TIMEOUT, &mut task).await {
            Ok(Ok(served)) => served.map_err(WorkerError::Serve),
            Ok(Err(join)) => Err(WorkerError::ServerTask(join)),
            Err(_elapsed) => {
                tracing::warn!("connections still open after the close timeout; cutting them");
                task.abort();
                Ok(())
            }
        }
    }
}

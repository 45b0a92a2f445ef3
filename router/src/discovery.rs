//! Where the router learns its workers: etcd, a static file, or addresses given as flags.
//!
//! Addresses given as flags (`--prefill ADDR`, `--decode ADDR`) carry no record, so the router asks
//! each worker's `Worker.Info` (retrying with backoff until it answers) and builds one.

use std::time::Duration;

use dolphin_cluster::{DiscoveryError, MembershipEvent, Role, WorkerId, WorkerRecord};
use dolphin_proto::v1::{self, worker_client::WorkerClient};
use dolphin_tls::GrpcConnector;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use crate::config::RouterConfig;

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Longest wait for a worker's `Worker.Info` answer once connected.
const INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens every membership source the configuration names.
pub async fn sources(
    cfg: &RouterConfig,
    connector: &GrpcConnector,
    shutdown: &CancellationToken,
) -> Result<Vec<mpsc::Receiver<MembershipEvent>>, DiscoveryError> {
    let mut out = Vec::new();
    if let Some(etcd) = cfg.etcd_config() {
        out.push(dolphin_cluster::watch_workers(&etcd).await?);
    }
    if let Some(path) = &cfg.static_workers {
        out.push(dolphin_cluster::static_workers(
            dolphin_cluster::load_static_file(path)?,
        ));
    }
    if !cfg.prefill.is_empty() || !cfg.decode.is_empty() {
        let addrs = cfg
            .prefill
            .iter()
            .map(|a| (Role::Prefill, a.clone()))
            .chain(cfg.decode.iter().map(|a| (Role::Decode, a.clone())))
            .collect();
        out.push(from_addresses(addrs, connector.clone(), shutdown.clone()));
    }
    Ok(out)
}

/// Asks each address's `Worker.Info` (retrying until it answers or `shutdown` fires) and yields
/// an `Up` event per worker.
pub fn from_addresses(
    addrs: Vec<(Role, String)>,
    connector: GrpcConnector,
    shutdown: CancellationToken,
) -> mpsc::Receiver<MembershipEvent> {
    let (tx, rx) = mpsc::channel(addrs.len().max(1));
    for (role, addr) in addrs {
        let tx = tx.clone();
        let shutdown = shutdown.clone();
        let connector = connector.clone();
        tokio::spawn(async move {
            let mut delay = RETRY_MIN;
            loop {
                match info(&addr, &connector).await {
                    Ok(rec) => {
                        if rec.role != role {
                            tracing::warn!(%addr, flag = %role, reported = %rec.role, "worker reports another role than its flag; using the reported one");
                        }
                        let _ = tx.send(MembershipEvent::Up(rec)).await;
                        return;
                    }
                    Err(e) => {
                        tracing::info!(%addr, error = %e, "worker not reachable yet; retrying")
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(RETRY_MAX);
            }
        });
    }
    rx
}

/// Why `Worker.Info` gave no record.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// Not a usable address.
    #[error("bad address {0:?}")]
    BadAddress(String),
    /// Could not connect.
    #[error("connect failed")]
    Connect(#[source] tonic::transport::Error),
    /// The call failed.
    #[error("Worker.Info failed: {0}")]
    Call(#[source] tonic::Status),
    /// The answer has no known role.
    #[error("worker reported no valid role")]
    Role(#[source] dolphin_cluster::UnknownRole),
}

/// Calls `Worker.Info` on `addr` and turns the answer into a record.
pub async fn info(addr: &str, connector: &GrpcConnector) -> Result<WorkerRecord, InfoError> {
    let channel = Endpoint::from_shared(format!("{}://{addr}", connector.scheme()))
        .map_err(|_| InfoError::BadAddress(addr.to_string()))?
        .timeout(INFO_TIMEOUT)
        .connect_with_connector(connector.clone())
        .await
        .map_err(InfoError::Connect)?;
    let info = WorkerClient::new(channel)
        .info(v1::InfoRequest {})
        .await
        .map_err(InfoError::Call)?
        .into_inner();
    let role = Role::try_from(info.role).map_err(InfoError::Role)?;
    Ok(WorkerRecord {
        id: WorkerId(info.worker_id),
        role,
        // The address we reached it on is the one that works from here.
        grpc_addr: addr.to_string(),
        kv_addr: (!info.kv_addr.is_empty()).then_some(info.kv_addr),
        model: info.model,
        block_size: info.block_size,
        version: info.version,
        kv_layout: info.kv_layout,
        context_length: info.context_length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Behavior, FakeWorker};

    #[tokio::test]
    async fn addresses_become_records_through_worker_info() {
        let fake = FakeWorker::start("prefill-1", Role::Prefill, Behavior::Hang).await;
        let shutdown = CancellationToken::new();
        let mut rx = from_addresses(
            vec![(Role::Prefill, fake.addr.to_string())],
            GrpcConnector::plain(Duration::from_secs(2)),
            shutdown.clone(),
        );
        let Some(MembershipEvent::Up(rec)) = rx.recv().await else {
            panic!("expected Up")
        };
        assert_eq!(rec.id, WorkerId::from("prefill-1"));
        assert_eq!(rec.role, Role::Prefill);
        assert_eq!(rec.grpc_addr, fake.addr.to_string());
        assert_eq!(
            (rec.model.as_str(), rec.block_size, rec.kv_addr),
            ("sim-model", 4, None)
        );
        shutdown.cancel();
    }

    #[tokio::test]
    async fn unreachable_workers_are_retried_until_shutdown() {
        // Bind and drop a listener: a port that refuses connections.
        let addr = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .local_addr()
            .expect("addr");
        let shutdown = CancellationToken::new();
        let mut rx = from_addresses(
            vec![(Role::Decode, addr.to_string())],
            GrpcConnector::plain(Duration::from_millis(200)),
            shutdown.clone(),
        );
        shutdown.cancel();
        // The task gives up at shutdown and drops its sender: the channel closes without events.
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn bad_address_is_an_error() {
        assert!(matches!(
            info(
                "not a host",
                &GrpcConnector::plain(Duration::from_millis(100))
            )
            .await,
            Err(InfoError::BadAddress(_) | InfoError::Connect(_))
        ));
    }
}

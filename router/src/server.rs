//! Assembles a running router from its configuration: registry, discovery, dispatcher, and the
//! HTTP and gRPC listeners.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dolphin_tls::{ClientAuth, GrpcConnector};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, RouterConfig};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::request_log::{RequestLog, RequestLogError};
use crate::workers::{RegistryConfig, WorkerRegistry};

/// How often the TLS files are checked for changes.
const TLS_RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Why the router could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not be bound.
    #[error("cannot bind {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Discovery could not start.
    #[error("worker discovery failed")]
    Discovery(#[from] dolphin_cluster::DiscoveryError),
    /// The routing-table store could not be reached.
    #[error("routing-table store failed")]
    TableStore(#[from] crate::dolphin::StoreError),
    /// The tokenizer could not be built (`--tokenizer gguf`: the model file).
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::BuildTokenizerError),
    /// The Responses API's store in etcd could not be reached.
    #[error("response store failed")]
    ResponseStore(#[from] crate::http::response_store::ResponseStoreError),
    /// The request log could not be opened.
    #[error(transparent)]
    RequestLog(#[from] RequestLogError),
    /// The HTTP server failed.
    #[error("HTTP server failed")]
    Http(#[source] std::io::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Grpc(#[source] tonic::transport::Error),
    /// A serving shard's thread could not start, or ended without saying how.
    #[error("serving shard failed")]
    Shard(#[source] std::io::Error),
    /// A flag the router cannot run with.
    #[error(transparent)]
    Config(crate::config::ConfigError),
    /// A listener has no address other hosts can connect to.
    #[error(transparent)]
    Advertise(dolphin_cluster::AdvertiseError),
}

/// A started router.
#[derive(Debug)]
pub struct RunningRouter {
    /// Bound HTTP address.
    pub http_addr: SocketAddr,
    /// Bound gRPC address.
    pub grpc_addr: SocketAddr,
    /// Bound admin gRPC address (`RouterAdmin`).
    pub admin_addr: SocketAddr,
    /// Bound address of `/metrics` and `/health`.
    pub metrics_addr: SocketAddr,
    /// Published HTTP address (`host:port`): the advertise host, else the bound address.
    pub public_http_addr: String,
    /// Published gRPC address.
    pub public_grpc_addr: String,
    /// Published admin address.
    pub public_admin_addr: String,
    /// Published `/metrics` and `/health` address.
    pub public_metrics_addr: String,
    /// The dispatcher (for in-process use and tests).
    pub dispatcher: Arc<Dispatcher>,
    /// Serving shards (see [`crate::shard`]).
    pub shards: usize,
    /// One per shard: what its servers ended with.
    stopped: Vec<oneshot::Receiver<Result<(), ServerError>>>,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Starts the router; both servers stop when `shutdown` fires.
pub async fn start(
    cfg: &RouterConfig,
    metrics: Option<PrometheusHandle>,
    shutdown: CancellationToken,
) -> Result<RunningRouter, ServerError> {
    let model = cfg.served_model();
    let tokenizer = cfg.tokenizer.build(cfg.model_path.as_deref())?;
    let tls_error = |e: dolphin_tls::TlsError| ServerError::Config(ConfigError(e.to_string()));
    let tls = cfg.tls.load_member().map_err(tls_error)?;
    if let Some(tls) = &tls {
        tls.watch(TLS_RELOAD_EVERY, shutdown.clone());
    }
    let connector = GrpcConnector::new(tls.as_ref(), cfg.connect_timeout()).map_err(tls_error)?;
    // Public listeners: the router's certificate, no client certificate (API keys identify
    // clients). ALPN: HTTP/1.1 for the OpenAI API, h2 for gRPC.
    let listener_tls = |alpn: &'static [u8]| {
        tls.as_ref()
            .map(|t| t.server_config(ClientAuth::None, &[alpn]))
            .transpose()
            .map_err(tls_error)
    };
    let (http_tls, grpc_tls) = (listener_tls(b"http/1.1")?, listener_tls(b"h2")?);
    let registry = WorkerRegistry::new(RegistryConfig {
        model: model.clone(),
        block_size: cfg.block_size,
        load_interval_ms: cfg.load_interval_ms,
        connector: connector.clone(),
    });
    let log = match &cfg.request_log {
        Some(path) => RequestLog::open(path).await?,
        None => RequestLog::disabled(),
    };
    let dispatcher = Arc::new(Dispatcher::new(
        registry.clone(),
        tokenizer,
        cfg.initial_policy(),
        DispatchConfig {
            model,
            max_prompt_tokens: cfg.max_prompt_tokens,
            max_output_tokens: cfg.max_output_tokens,
            overlap_weight: cfg.overlap_weight,
            block_size: cfg.block_size,
            max_migrations: cfg.max_migrations,
            tool_call_parser: cfg.tool_call_parser,
            reasoning_parser: cfg.reasoning_parser,
            trust_request_chat_template: cfg.trust_request_chat_template,
            request_timeout: cfg.request_timeout(),
        },
        log,
    ));
    let key_error = |e: crate::auth::KeyFileError| ServerError::Config(ConfigError(e.to_string()));
    let load_keys = |path: &Option<std::path::PathBuf>| {
        path.as_deref()
            .map(crate::auth::KeySet::load)
            .transpose()
            .map_err(key_error)
    };
    let (api_keys, admin_keys) = (
        load_keys(&cfg.api_key_file)?,
        load_keys(&cfg.admin_key_file)?,
    );
    for keys in api_keys.iter().chain(&admin_keys) {
        keys.watch(crate::auth::RELOAD_EVERY, shutdown.clone());
    }
    let http_listener = bind(cfg.http_addr).await?;
    let grpc_listener = bind(cfg.grpc_addr).await?;
    let admin_listener = bind(cfg.admin_addr).await?;
    let metrics_listener = bind(cfg.metrics_addr).await?;
    let bound = |l: &TcpListener, addr| {
        l.local_addr()
            .map_err(|source| ServerError::Bind { addr, source })
    };
    let admin_addr = bound(&admin_listener, cfg.admin_addr)?;
    let metrics_addr = bound(&metrics_listener, cfg.metrics_addr)?;
    if admin_keys.is_none() && !admin_addr.ip().is_loopback() {
        tracing::warn!(%admin_addr, "the admin listener takes anyone who reaches it: give --admin-key-file");
    }
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            addr: cfg.http_addr,
            source,
        })?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            addr: cfg.grpc_addr,
            source,
        })?;
    let advertise = cfg.advertise().map_err(ServerError::Config)?;
    let public_http_addr = dolphin_cluster::advertised(
        http_addr,
        advertise.as_ref().map(|a| a.host_only()).as_ref(),
        "HTTP",
    )
    .map_err(ServerError::Advertise)?;
    let public_grpc_addr = dolphin_cluster::advertised(grpc_addr, advertise.as_ref(), "gRPC")
        .map_err(ServerError::Advertise)?;
    // The operators' listeners are published on the advertise host too, when they are bound to
    // every address (loopback ones stay as bound).
    let host = advertise.as_ref().map(|a| a.host_only());
    let published = |addr: SocketAddr, what| match addr.ip().is_unspecified() {
        true => dolphin_cluster::advertised(addr, host.as_ref(), what),
        false => Ok(addr.to_string()),
    };
    let public_admin_addr = published(admin_addr, "admin").map_err(ServerError::Advertise)?;
    let public_metrics_addr = published(metrics_addr, "metrics").map_err(ServerError::Advertise)?;
    if let Some(etcd) = cfg.etcd_config() {
        // Tables and the classifier come from etcd: load them before serving, then follow.
        let store = crate::dolphin::EtcdStore::connect(&etcd, dispatcher.dolphin().clone()).await?;
        crate::dolphin::TableStore::refresh(&store).await?;
        store.spawn_watcher(shutdown.clone());
        dispatcher.set_table_store(Arc::new(store));
    }
    let responses = match cfg.etcd_config() {
        Some(etcd) if cfg.responses_etcd_ttl > 0 => {
            let ttl = Duration::from_secs(cfg.responses_etcd_ttl);
            let kept = crate::http::response_store_etcd::EtcdResponses::connect(&etcd, ttl).await?;
            crate::http::response_store::ResponseStore::etcd(kept)
        }
        _ => crate::http::response_store::ResponseStore::new(cfg.responses_store),
    };
    dispatcher.spawn_online(shutdown.clone());
    for rx in crate::discovery::sources(cfg, &connector, &shutdown).await? {
        registry.follow(rx, shutdown.clone());
    }
    let state = crate::http::AppState {
        dispatcher: dispatcher.clone(),
        metrics,
        api_keys: api_keys.clone(),
        limit: crate::admission::InflightLimit::new(cfg.max_inflight),
        responses,
    };
    let cors = cfg
        .cors()
        .map_err(|e| ServerError::Config(ConfigError(e.to_string())))?;
    let app = crate::http::router(state.clone()).with_cors(cors);
    let limit = state.limit.clone();
    // Operators' listeners, on the control runtime: plain HTTP for Prometheus and probes, and
    // the admin gRPC (TLS like the public one, its own keys).
    let mut stopped = Vec::new();
    {
        let (done, stopped_rx) = oneshot::channel();
        let ops = crate::http::ops_router(state);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let served = axum::serve(metrics_listener, ops)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
            let _ = done.send(served.map_err(ServerError::Http));
        });
        stopped.push(stopped_rx);
    }
    {
        let (done, stopped_rx) = oneshot::channel();
        let incoming =
            dolphin_tls::accept_incoming(admin_listener, grpc_tls.clone(), shutdown.clone());
        let served =
            crate::grpc::serve_admin(incoming, dispatcher.clone(), admin_keys, shutdown.clone());
        tokio::spawn(async move {
            let _ = done.send(served.await.map_err(ServerError::Grpc));
        });
        stopped.push(stopped_rx);
    }
    let shards = crate::shard::set_count(match cfg.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    });
    let http_shards = crate::shard::deal(http_listener, shards, http_tls, shutdown.clone())
        .map_err(|source| ServerError::Bind {
            addr: cfg.http_addr,
            source,
        })?;
    let grpc_shards = crate::shard::deal(grpc_listener, shards, grpc_tls, shutdown.clone())
        .map_err(|source| ServerError::Bind {
            addr: cfg.grpc_addr,
            source,
        })?;
    for (i, (http_l, grpc_l)) in http_shards.into_iter().zip(grpc_shards).enumerate() {
        let (done, stopped_rx) = oneshot::channel();
        let (app, dispatcher, shutdown) = (app.clone(), dispatcher.clone(), shutdown.clone());
        let (api_keys, limit) = (api_keys.clone(), limit.clone());
        crate::shard::spawn(i + 1, move || async move {
            let (http, grpc) = tokio::join!(
                crate::http::serve(http_l, app, shutdown.clone()),
                crate::grpc::serve(grpc_l, dispatcher, api_keys, limit, shutdown),
            );
            let result = http
                .map_err(ServerError::Http)
                .and(grpc.map_err(ServerError::Grpc));
            let _ = done.send(result);
        })
        .map_err(ServerError::Shard)?;
        stopped.push(stopped_rx);
    }
    tracing::info!(%public_http_addr, %public_grpc_addr, http_bound = %http_addr,
        grpc_bound = %grpc_addr, %admin_addr, %metrics_addr, api_keys = api_keys.is_some(), version = dolphin_cluster::BUILD_VERSION, shards,
        policy = dispatcher.policy().name(), "router started");
    Ok(RunningRouter {
        http_addr,
        grpc_addr,
        admin_addr,
        metrics_addr,
        public_http_addr,
        public_admin_addr,
        public_metrics_addr,
        public_grpc_addr,
        dispatcher,
        shards,
        stopped,
    })
}

impl RunningRouter {
    /// The `DOLPHIN_READY` line printed once the listeners are bound.
    pub fn ready_line(&self) -> String {
        #[derive(serde::Serialize)]
        struct Ready {
            role: &'static str,
            http_addr: String,
            grpc_addr: String,
            admin_addr: String,
            metrics_addr: String,
        }
        let ready = Ready {
            role: "router",
            http_addr: self.public_http_addr.clone(),
            grpc_addr: self.public_grpc_addr.clone(),
            admin_addr: self.public_admin_addr.clone(),
            metrics_addr: self.public_metrics_addr.clone(),
        };
        format!(
            "DOLPHIN_READY {}",
            serde_json::to_string(&ready).unwrap_or_default()
        )
    }

    /// Waits until both servers have stopped (after shutdown fired and connections drained),
    /// then stops following workers.
    pub async fn wait(self) -> Result<(), ServerError> {
        let mut result = Ok(());
        for shard in self.stopped {
            let ended = shard.await.unwrap_or_else(|_| {
                Err(ServerError::Shard(std::io::Error::other(
                    "a serving shard ended without a result (it panicked)",
                )))
            });
            if result.is_ok() {
                result = ended;
            }
        }
        self.dispatcher.registry().clear();
        result
    }
}

//! A test cluster of real processes: optional etcd, prefill and decode workers on the sim
//! engine (or another, see [`ClusterConfig::engine_args`]), and a router wired by static flags or etcd. Everything is killed on drop; unless the
//! test marked the cluster [`TestCluster::passed`] (or with `DOLPHIN_TEST_LOGS=1`), every
//! process's output is printed first.

use std::time::Duration;

use anyhow::Context;
use dolphin_cluster::testing::EtcdServer;
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::router_admin_client::RouterAdminClient;
use dolphinctl::process::{ManagedProcess, ProcessSpec};
use dolphinctl::ready::ReadyInfo;
use rustix::process::Signal;
use tonic::transport::Channel;

use crate::binaries;
use crate::grpc::{self, MODEL};
use crate::wait::{self, GENEROUS};

/// How long a process may take to print its READY line (a cold, busy machine is slow).
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Prefill workers.
    pub prefill: usize,
    /// Decode workers.
    pub decode: usize,
    /// Start etcd and use it for discovery (otherwise the router gets `--prefill/--decode`).
    pub etcd: bool,
    /// Workers' `--lease-ttl-secs` (with etcd).
    pub lease_ttl_secs: Option<u32>,
    /// `--sim-time-scale` of every worker (small: tests stay quick but timing code runs).
    pub time_scale: f64,
    /// Overrides `time_scale` for the prefill workers.
    pub prefill_time_scale: Option<f64>,
    /// The workers' engine flags, replacing the sim's (`--engine sim --sim-time-scale X`), e.g.
    /// `--engine candle --model-path P`.
    pub engine_args: Option<Vec<String>>,
    /// The model name given to every process (`--model`).
    pub model: String,
    /// Extra arguments for every worker.
    pub worker_args: Vec<String>,
    /// Extra arguments for the decode workers only (after `worker_args`).
    pub decode_args: Vec<String>,
    /// Extra arguments for prefill worker `i` only (after `worker_args`), where given.
    pub prefill_args_each: Vec<Vec<String>>,
    /// Extra arguments for the router.
    pub router_args: Vec<String>,
    /// Mutual TLS everywhere, with members' certificates from this CA (etcd too, when used):
    /// every process gets `--tls-cert/--tls-key/--tls-ca`, and the test's clients of the router
    /// use TLS (no client certificate: the router's public listeners ask for none).
    pub tls: Option<std::sync::Arc<dolphin_tls::testing::TestPki>>,
    /// The router's API key (`--api-key-file` with this one key).
    pub api_key: Option<String>,
    /// The router's admin key (`--admin-key-file` with this one key); the harness uses it.
    pub admin_key: Option<String>,
    /// Environment variables of every process (e.g. the OTLP endpoint).
    pub env: Vec<(String, String)>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            prefill: 1,
            decode: 1,
            etcd: false,
            lease_ttl_secs: None,
            time_scale: 0.01,
            prefill_time_scale: None,
            engine_args: None,
            model: MODEL.to_owned(),
            worker_args: Vec::new(),
            decode_args: Vec::new(),
            prefill_args_each: Vec::new(),
            router_args: Vec::new(),
            tls: None,
            api_key: None,
            admin_key: None,
            env: Vec::new(),
        }
    }
}

impl ClusterConfig {
    /// The workers' flags for the candle engine on the model at `model_path`: one compute
    /// thread (two shared cores), `kv_bytes` of KV memory, then `extra`.
    pub fn candle_engine(model_path: &str, kv_bytes: &str, extra: &[&str]) -> Vec<String> {
        [
            "--engine",
            "candle",
            "--model-path",
            model_path,
            "--threads",
            "1",
            "--kv-bytes",
            kv_bytes,
        ]
        .iter()
        .chain(extra)
        .map(|s| (*s).to_owned())
        .collect()
    }
}

/// One started process and what it announced.
#[derive(Debug)]
pub struct Node {
    /// The supervised process.
    pub process: ManagedProcess,
    /// Its READY line.
    pub ready: ReadyInfo,
}

impl Node {
    /// Worker id ("" for the router).
    pub fn id(&self) -> &str {
        self.ready.id.as_deref().unwrap_or_default()
    }

    /// gRPC address.
    pub fn grpc_addr(&self) -> &str {
        self.ready.grpc_addr.as_deref().unwrap_or_default()
    }

    /// SIGKILL: the process dies without draining or revoking its lease.
    pub fn kill(&self) -> anyhow::Result<()> {
        Ok(self.process.signal(Signal::KILL)?)
    }
}

/// The running cluster.
#[derive(Debug)]
pub struct TestCluster {
    /// The router.
    pub router: Node,
    /// Prefill workers, in start order.
    pub prefill: Vec<Node>,
    /// Decode workers, in start order.
    pub decode: Vec<Node>,
    /// TLS for the test's clients of the router (with `ClusterConfig::tls`).
    client_tls: Option<dolphin_tls::Tls>,
    /// The admin key the harness's own admin calls carry.
    admin_key: Option<String>,
    /// The router's key files.
    _keys: tempfile::TempDir,
    // Declared last: dropped after the processes that talk to it.
    etcd: Option<EtcdServer>,
    passed: bool,
}

impl TestCluster {
    /// Starts etcd (if asked), the workers, then the router, and waits until the router lists
    /// every worker with a live event stream.
    pub async fn start(cfg: ClusterConfig) -> anyhow::Result<Self> {
        // The helper panics with etcd's log if etcd cannot start.
        let etcd = match (cfg.etcd, &cfg.tls) {
            (false, _) => None,
            (true, None) => Some(EtcdServer::start().await),
            (true, Some(pki)) => {
                let server = pki.member("etcd");
                Some(
                    EtcdServer::start_tls(dolphin_cluster::testing::EtcdServerTls {
                        cert: server.tls_cert.context("cert")?,
                        key: server.tls_key.context("key")?,
                        client_ca: server.tls_ca.context("CA")?,
                    })
                    .await,
                )
            }
        };
        // Each process's TLS flags: its own member certificate, etcd's CA when etcd is used.
        let tls_flags = |name: &str| -> Vec<String> {
            let Some(pki) = &cfg.tls else {
                return Vec::new();
            };
            let mut args = pki.member(name);
            if cfg.etcd {
                args.etcd_ca = args.tls_ca.clone();
            }
            args.to_flags()
        };
        let client_tls = match &cfg.tls {
            Some(pki) => pki.anonymous("client").load()?,
            None => None,
        };
        let etcd_url = etcd.as_ref().map(EtcdServer::endpoint);
        let prefill_bin = binaries::binary(binaries::PREFILL_WORKER)?;
        let decode_bin = binaries::binary(binaries::DECODE_WORKER)?;
        let router_bin = binaries::binary(binaries::ROUTER)?;

        let mut started: Vec<(String, ManagedProcess)> = Vec::new();
        for i in 0..cfg.prefill {
            let scale = cfg.prefill_time_scale.unwrap_or(cfg.time_scale);
            let mut args = worker_args(&cfg, etcd_url.as_deref(), scale, false);
            args.extend(cfg.prefill_args_each.get(i).into_iter().flatten().cloned());
            args.extend(tls_flags(&format!("prefill-{i}")));
            started.push((
                format!("prefill-{i}"),
                spawn_with_env(&format!("prefill-{i}"), &prefill_bin, args, &cfg.env)?,
            ));
        }
        for i in 0..cfg.decode {
            let mut args = worker_args(&cfg, etcd_url.as_deref(), cfg.time_scale, true);
            args.extend(tls_flags(&format!("decode-{i}")));
            started.push((
                format!("decode-{i}"),
                spawn_with_env(&format!("decode-{i}"), &decode_bin, args, &cfg.env)?,
            ));
        }
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        let mut failure = None;
        for (name, mut process) in started {
            let ready = match process.wait_ready(READY_TIMEOUT).await {
                Ok(ready) => ready,
                Err(err) => {
                    failure.get_or_insert(anyhow::Error::from(err));
                    ReadyInfo::default()
                }
            };
            let node = Node { process, ready };
            if name.starts_with("prefill") {
                prefill.push(node);
            } else {
                decode.push(node);
            }
        }
        if let Some(err) = failure {
            return Err(err.context(format!(
                "a worker failed to start\n{}",
                render_logs(prefill.iter().chain(&decode))
            )));
        }

        let mut args = vec![
            "--http-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--grpc-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--admin-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--metrics-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--model".to_owned(),
            cfg.model.clone(),
        ];
        match &etcd_url {
            Some(url) => args.extend(["--etcd".to_owned(), url.clone()]),
            None => {
                for p in &prefill {
                    args.extend(["--prefill".to_owned(), p.grpc_addr().to_owned()]);
                }
                for d in &decode {
                    args.extend(["--decode".to_owned(), d.grpc_addr().to_owned()]);
                }
            }
        }
        args.extend(cfg.router_args.iter().cloned());
        args.extend(tls_flags("router"));
        let keys = tempfile::tempdir()?;
        for (flag, key) in [
            ("--api-key-file", &cfg.api_key),
            ("--admin-key-file", &cfg.admin_key),
        ] {
            if let Some(key) = key {
                let path = keys.path().join(flag.trim_start_matches('-'));
                std::fs::write(&path, format!("{key}\n"))?;
                args.extend([flag.to_owned(), path.display().to_string()]);
            }
        }
        let mut router = spawn_with_env("router", &router_bin, args, &cfg.env)?;
        let ready = router.wait_ready(READY_TIMEOUT).await;
        let router = Node {
            process: router,
            ready: ready.as_ref().cloned().unwrap_or_default(),
        };
        let cluster = Self {
            router,
            prefill,
            decode,
            client_tls,
            admin_key: cfg.admin_key.clone(),
            _keys: keys,
            etcd,
            passed: false,
        };
        if let Err(err) = ready {
            return Err(anyhow::Error::from(err)
                .context(format!("the router failed to start\n{}", cluster.logs())));
        }
        let prefill_ids: Vec<String> = cluster.prefill.iter().map(|n| n.id().to_owned()).collect();
        let decode_ids: Vec<String> = cluster.decode.iter().map(|n| n.id().to_owned()).collect();
        cluster
            .wait_for_workers(&prefill_ids, &decode_ids)
            .await
            .with_context(|| cluster.logs())?;
        Ok(cluster)
    }

    /// Router's HTTP address ("127.0.0.1:port").
    pub fn http_addr(&self) -> &str {
        self.router.ready.http_addr.as_deref().unwrap_or_default()
    }

    /// Router's gRPC address ("127.0.0.1:port").
    pub fn grpc_addr(&self) -> &str {
        self.router.grpc_addr()
    }

    /// Router's admin gRPC address (`RouterAdmin`).
    pub fn admin_addr(&self) -> &str {
        self.router.ready.admin_addr.as_deref().unwrap_or_default()
    }

    /// Router's `/metrics` and `/health` address.
    pub fn metrics_addr(&self) -> &str {
        self.router
            .ready
            .metrics_addr
            .as_deref()
            .unwrap_or_default()
    }

    /// A client of the router's public API.
    pub async fn inference(&self) -> anyhow::Result<InferenceClient<Channel>> {
        Ok(InferenceClient::new(
            grpc::channel_with(self.grpc_addr(), self.client_tls.as_ref()).await?,
        ))
    }

    /// A client of the router's admin API.
    pub async fn admin(&self) -> anyhow::Result<RouterAdminClient<Channel>> {
        Ok(RouterAdminClient::new(
            grpc::channel_with(self.admin_addr(), self.client_tls.as_ref()).await?,
        ))
    }

    /// TLS for clients of the router, when the cluster runs with TLS.
    pub fn client_tls(&self) -> Option<&dolphin_tls::Tls> {
        self.client_tls.as_ref()
    }

    /// Waits until the router lists exactly these workers, each with a live event stream.
    pub async fn wait_for_workers(
        &self,
        prefill_ids: &[String],
        decode_ids: &[String],
    ) -> anyhow::Result<()> {
        let mut want: Vec<String> = prefill_ids.iter().chain(decode_ids).cloned().collect();
        want.sort_unstable();
        let admin = self.admin().await?;
        wait::until("the router to list every worker live", GENEROUS, || {
            // Clients are cheap to clone (a shared channel); each poll owns one.
            let mut admin = admin.clone();
            let want = want.clone();
            let key = self.admin_key.clone();
            async move {
                let workers = grpc::list_workers_with_key(&mut admin, key.as_deref())
                    .await
                    .map_err(|e| e.to_string())?;
                let mut live: Vec<String> = workers
                    .iter()
                    .filter(|w| w.events_live)
                    .map(|w| w.worker_id.clone())
                    .collect();
                live.sort_unstable();
                if live == want && workers.len() == want.len() {
                    Ok(())
                } else {
                    Err(format!("{workers:?}"))
                }
            }
        })
        .await
    }

    /// etcd's URL, when the cluster uses etcd.
    pub fn etcd_url(&self) -> Option<String> {
        self.etcd.as_ref().map(EtcdServer::endpoint)
    }

    /// Marks the test as passed: the processes' output is not printed when the cluster drops
    /// (set `DOLPHIN_TEST_LOGS=1` to print it anyway).
    pub fn passed(mut self) {
        self.passed = true;
    }

    /// Every process's retained output, for failure reports.
    pub fn logs(&self) -> String {
        render_logs(
            std::iter::once(&self.router)
                .chain(&self.prefill)
                .chain(&self.decode),
        )
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        // The processes themselves are SIGKILLed by ManagedProcess's Drop right after this.
        // A test that returns an error (`?`) does not panic, hence the explicit `passed` mark.
        if !self.passed || std::env::var_os("DOLPHIN_TEST_LOGS").is_some() {
            eprintln!("{}", self.logs());
        }
    }
}

fn worker_args(cfg: &ClusterConfig, etcd: Option<&str>, scale: f64, decode: bool) -> Vec<String> {
    let mut a: Vec<String> = vec!["--grpc-addr".to_owned(), "127.0.0.1:0".to_owned()];
    if decode {
        a.extend(["--kv-addr".to_owned(), "127.0.0.1:0".to_owned()]);
    }
    match &cfg.engine_args {
        Some(engine) => a.extend(engine.iter().cloned()),
        None => a.extend([
            "--engine".to_owned(),
            "sim".to_owned(),
            "--sim-time-scale".to_owned(),
            scale.to_string(),
        ]),
    }
    a.extend(["--model".to_owned(), cfg.model.clone()]);
    if let Some(url) = etcd {
        a.extend(["--etcd".to_owned(), url.to_owned()]);
        if let Some(ttl) = cfg.lease_ttl_secs {
            a.extend(["--lease-ttl-secs".to_owned(), ttl.to_string()]);
        }
    }
    a.extend(cfg.worker_args.iter().cloned());
    if decode {
        a.extend(cfg.decode_args.iter().cloned());
    }
    a
}

/// Spawns a Dolphin process with its output kept in memory for failure reports.
pub fn spawn(
    name: &str,
    program: &std::path::Path,
    args: Vec<String>,
) -> anyhow::Result<ManagedProcess> {
    spawn_with_env(name, program, args, &[])
}

/// [`spawn`] with `env` added to the process's environment.
pub fn spawn_with_env(
    name: &str,
    program: &std::path::Path,
    args: Vec<String>,
    env: &[(String, String)],
) -> anyhow::Result<ManagedProcess> {
    let mut spec = ProcessSpec::new(name, program).args(args);
    spec.envs
        .extend(env.iter().map(|(k, v)| (k.into(), v.into())));
    spec.tail_lines = 5000;
    Ok(ManagedProcess::spawn(spec)?)
}

fn render_logs<'a>(nodes: impl Iterator<Item = &'a Node>) -> String {
    let mut out = String::new();
    for node in nodes {
        out.push_str(&format!(
            "===== {} (pid {}, {}) =====\n",
            node.process.name(),
            node.process.pid(),
            node.process
                .exit_status()
                .map_or("running".to_owned(), |s| s.to_string())
        ));
        for line in node.process.output() {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

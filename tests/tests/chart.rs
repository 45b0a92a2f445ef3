//! The Helm chart runs: `helm template` renders `deploy/helm/dolphin` with the CPU profile
//! (SmolLM2 on candle; bundled etcd with 3 members, 2 prefill workers), and this test runs what
//! it rendered. Every pod of the etcd StatefulSet and the router, prefill and decode Deployments
//! becomes a host (a network namespace, see `dolphin_tests::netns`) whose `/etc/hosts` answers
//! the Services' and the StatefulSet pods' cluster DNS names with the pods' addresses. Each
//! pod's init containers and then its main container are started as processes from their
//! `command`, `args` and `env`,
//! with the downward-API values (pod IP, pod name) replaced by the host's, `$(VAR)` references
//! expanded as the kubelet does, and volume mount paths mapped to directories here (the model
//! volume to the model directory; etcd runs Debian's etcd binary). Then: each readiness probe as
//! declared, requests through the router on both paths, the learn Job's command line as
//! `dolphinctl` parses it, and the decode pod's preStop hook (the drain).
//!
//! A flag the binary does not accept fails the process; a `DOLPHIN_*` variable the binary does
//! not read (not in its `--help`) fails the test. Needs helm (`DOLPHIN_HELM`, or
//! scripts/install-deploy-tools.sh's) and network namespaces; skips without either, unless
//! `DOLPHIN_REQUIRE_HELM=1` / `DOLPHIN_REQUIRE_NETNS=1` (CI).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::router_admin_client::RouterAdminClient;
use dolphin_proto::v1::{GenerateRequest, PrefillMode, SamplingParams, generate_request::Input};
use dolphin_tests::netns::{self, VirtualNet};
use dolphin_tests::wait::{self, GENEROUS};
use dolphin_tests::{binaries, grpc, http};
use dolphinctl::process::{ManagedProcess, ProcessSpec};
use serde::Deserialize;
use serde_yaml::Value;

const CHART: &str = "deploy/helm/dolphin";
const PROFILE: &str = "deploy/helm/dolphin/values-cpu-smollm2.yaml";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// The helm binary, or `None` (skip) when it is not installed and not required.
fn helm() -> anyhow::Result<Option<PathBuf>> {
    let candidates = [
        std::env::var_os("DOLPHIN_HELM").map(PathBuf::from),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dolphin-tools/bin/helm")),
    ];
    if let Some(path) = candidates.into_iter().flatten().find(|p| p.is_file()) {
        return Ok(Some(path));
    }
    if std::env::var("DOLPHIN_REQUIRE_HELM").is_ok_and(|v| v == "1") {
        bail!("DOLPHIN_REQUIRE_HELM=1 but no helm: run scripts/install-deploy-tools.sh");
    }
    eprintln!("skipping: no helm (scripts/install-deploy-tools.sh installs it)");
    Ok(None)
}

/// One container as rendered.
#[derive(Debug)]
struct Container {
    name: String,
    command: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, EnvValue)>,
    mounts: Vec<(String, String)>,
    readiness: Option<Value>,
    pre_stop: Option<Vec<String>>,
    ports: BTreeMap<String, u64>,
}

#[derive(Debug)]
enum EnvValue {
    Plain(String),
    Field(String),
}

/// One pod template of a Deployment or StatefulSet.
#[derive(Debug)]
struct Workload {
    name: String,
    component: String,
    replicas: u64,
    /// StatefulSets: the governing (headless) Service, for the pods' DNS names.
    service_name: Option<String>,
    labels: BTreeMap<String, String>,
    init: Vec<Container>,
    main: Container,
}

impl Workload {
    /// The name of replica `i` (a StatefulSet's; a Deployment's real pods get a hash suffix).
    fn pod_name(&self, i: u64) -> String {
        format!("{}-{i}", self.name)
    }
}

/// One replica of a workload, on its own host.
struct Placed<'a> {
    workload: &'a Workload,
    replica: u64,
    host: String,
}

/// A Service: its name and pod selector.
#[derive(Debug)]
struct Service {
    name: String,
    selector: BTreeMap<String, String>,
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v.as_str()?.to_owned())))
        .collect()
}

/// The Deployments, StatefulSets and Services of a render.
fn parse(rendered: &str) -> anyhow::Result<(Vec<Workload>, Vec<Service>, Vec<Value>)> {
    let (mut workloads, mut services, mut jobs) = (Vec::new(), Vec::new(), Vec::new());
    for doc in serde_yaml::Deserializer::from_str(rendered) {
        let doc = Value::deserialize(doc)?;
        match doc["kind"].as_str() {
            Some("Deployment" | "StatefulSet") => workloads.push(workload(&doc)?),
            Some("Service") => services.push(Service {
                name: doc["metadata"]["name"]
                    .as_str()
                    .context("Service name")?
                    .to_owned(),
                selector: string_map(&doc["spec"]["selector"]),
            }),
            Some("Job") => jobs.push(doc),
            _ => {}
        }
    }
    Ok((workloads, services, jobs))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => serde_yaml::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn container(c: &Value) -> anyhow::Result<Container> {
    let name = c["name"]
        .as_str()
        .context("container without a name")?
        .to_owned();
    let mut env = Vec::new();
    for e in c["env"].as_sequence().into_iter().flatten() {
        let key = e["name"].as_str().context("env without a name")?.to_owned();
        let value = if let Some(v) = e.get("value") {
            EnvValue::Plain(v.as_str().map(str::to_owned).unwrap_or_else(|| {
                serde_yaml::to_string(v)
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            }))
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            EnvValue::Field(path.to_owned())
        } else {
            bail!("{name}: env {key} has a source this test cannot provide: {e:?}");
        };
        env.push((key, value));
    }
    let mounts = c["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some((
                m["name"].as_str()?.to_owned(),
                m["mountPath"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let pre_stop = c["lifecycle"]["preStop"]["exec"]
        .get("command")
        .map(strings);
    let ports = c["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["name"].as_str()?.to_owned(), p["containerPort"].as_u64()?)))
        .collect();
    Ok(Container {
        name,
        command: strings(&c["command"]),
        args: strings(&c["args"]),
        env,
        mounts,
        readiness: c.get("readinessProbe").cloned(),
        pre_stop,
        ports,
    })
}

fn workload(doc: &Value) -> anyhow::Result<Workload> {
    let spec = &doc["spec"]["template"]["spec"];
    let component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        .as_str()
        .context("workload without a component label")?
        .to_owned();
    let mut containers = spec["containers"].as_sequence().into_iter().flatten();
    let main = container(containers.next().context("no container")?)?;
    ensure!(
        containers.next().is_none(),
        "{component}: more than one container"
    );
    Ok(Workload {
        name: doc["metadata"]["name"]
            .as_str()
            .context("no name")?
            .to_owned(),
        component,
        replicas: doc["spec"]["replicas"].as_u64().unwrap_or(1),
        service_name: doc["spec"]["serviceName"].as_str().map(str::to_owned),
        labels: string_map(&doc["spec"]["template"]["metadata"]["labels"]),
        init: spec["initContainers"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(container)
            .collect::<anyhow::Result<_>>()?,
        main,
    })
}

/// The `DOLPHIN_*` variables `program` reads: the `[env: NAME=...]` its `--help` lists.
fn accepted_env(program: &Path) -> anyhow::Result<BTreeSet<String>> {
    let out = std::process::Command::new(program).arg("--help").output()?;
    let help = String::from_utf8_lossy(&out.stdout);
    Ok(help
        .split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next())
        .map(str::to_owned)
        .collect())
}

/// Where a container's program comes from here: the built binaries, or the repo's scripts
/// for what the image installs from them.
fn program(command0: &str) -> anyhow::Result<PathBuf> {
    let base = Path::new(command0)
        .file_name()
        .and_then(|n| n.to_str())
        .context("empty command")?;
    match base {
        "dolphin-fetch-model" => Ok(repo_root().join("scripts/fetch-model.sh")),
        // The bundled etcd's image runs etcd; here Debian's (3.4) does.
        "etcd" => Ok(std::env::var_os("DOLPHIN_ETCD_BIN")
            .map_or_else(|| PathBuf::from("/usr/bin/etcd"), PathBuf::from)),
        b @ ("dolphin-router"
        | "dolphin-prefill-worker"
        | "dolphin-decode-worker"
        | "dolphinctl") => binaries::binary(b),
        other => bail!("the chart runs {other:?}, which the image does not ship"),
    }
}

/// A pod's view of paths: each mount path maps to a directory here.
struct Mounts(Vec<(String, PathBuf)>);

impl Mounts {
    /// `s` with a leading mount path replaced (also the value of `--flag=PATH`).
    fn map(&self, s: &str) -> String {
        if let Some((flag, value)) = s.split_once('=')
            && flag.starts_with("--")
        {
            return format!("{flag}={}", self.map_path(value));
        }
        self.map_path(s)
    }

    fn map_path(&self, s: &str) -> String {
        for (mount, dir) in &self.0 {
            if let Some(rest) = s.strip_prefix(mount.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", dir.display());
            }
        }
        s.to_owned()
    }
}

/// `$(VAR)` references expanded from the variables defined before (the kubelet's rule).
fn expand(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = s.to_owned();
    for (k, v) in vars {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

struct Pod {
    host: String,
    name: String,
    ip: String,
    dirs: Mounts,
}

/// The process spec of `c` in `pod`; checks its `DOLPHIN_*` variables against the program.
fn spec_of(net: &VirtualNet, pod: &Pod, c: &Container) -> anyhow::Result<ProcessSpec> {
    let program = program(c.command.first().context("no command")?)?;
    let mut vars = BTreeMap::new();
    for (key, value) in &c.env {
        let value = match value {
            EnvValue::Plain(v) => pod.dirs.map(&expand(v, &vars)),
            EnvValue::Field(path) => match path.as_str() {
                "status.podIP" => pod.ip.clone(),
                "metadata.name" => pod.name.clone(),
                other => bail!("{}: unsupported fieldRef {other}", c.name),
            },
        };
        vars.insert(key.clone(), value);
    }
    let accepted = if program.file_name().is_some_and(|n| n == "etcd") {
        BTreeSet::new()
    } else if program.extension().is_some_and(|e| e == "sh") {
        // The fetch script: the variables its text reads.
        let text = std::fs::read_to_string(&program)?;
        vars.keys()
            .filter(|k| text.contains(k.as_str()))
            .cloned()
            .collect()
    } else {
        accepted_env(&program)?
    };
    for key in vars.keys().filter(|k| k.starts_with("DOLPHIN_")) {
        ensure!(
            accepted.contains(key),
            "{} sets {key}, which {} does not read (it accepts {accepted:?})",
            c.name,
            program.display()
        );
    }
    let args: Vec<String> = c.command[1..]
        .iter()
        .chain(&c.args)
        .map(|a| pod.dirs.map(&expand(a, &vars)))
        .collect();
    let mut spec = net.spec(
        &pod.host,
        &format!("{}/{}", pod.name, c.name),
        &program,
        args,
    );
    // `ip netns exec` passes the environment on to the program.
    spec.envs
        .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
    Ok(spec)
}

/// Runs a container's readiness probe as declared (gRPC health or HTTP GET) from the client;
/// named ports are the container's.
async fn probe(net: &VirtualNet, ip: &str, c: &Container) -> anyhow::Result<()> {
    let readiness = c.readiness.as_ref().context("no readiness probe")?;
    let ports = &c.ports;
    let port_of = |v: &Value| -> anyhow::Result<u64> {
        match v {
            Value::Number(n) => n.as_u64().context("bad port"),
            Value::String(name) => ports.get(name).copied().context("unknown named port"),
            _ => bail!("bad port {v:?}"),
        }
    };
    if let Some(g) = readiness.get("grpc") {
        let addr = format!("{ip}:{}", port_of(&g["port"])?);
        let service = g["service"].as_str().unwrap_or_default().to_owned();
        net.run_in("client", move || async move {
            let mut health = tonic_health_client(&addr).await?;
            let status = health
                .check(tonic_health::pb::HealthCheckRequest { service })
                .await?;
            ensure!(status.into_inner().status == 1, "not SERVING");
            Ok(())
        })
        .await
    } else if let Some(h) = readiness.get("httpGet") {
        let addr = format!("{ip}:{}", port_of(&h["port"])?);
        let path = h["path"].as_str().unwrap_or("/").to_owned();
        net.run_in("client", move || async move {
            let resp = http::get(&addr, &path).await?;
            ensure!(resp.status == 200, "{path}: HTTP {}", resp.status);
            Ok(())
        })
        .await
    } else {
        bail!("readiness probe of an unknown kind: {readiness:?}")
    }
}

async fn tonic_health_client(
    addr: &str,
) -> anyhow::Result<tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>> {
    Ok(tonic_health::pb::health_client::HealthClient::new(
        grpc::channel(addr).await?,
    ))
}

/// The cluster DNS names of every pod and Service of the render, with the host each maps to.
fn dns_names(placed: &[Placed<'_>], services: &[Service]) -> BTreeMap<String, Vec<String>> {
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in placed {
        if let Some(svc) = &p.workload.service_name {
            let pod = p.workload.pod_name(p.replica);
            names.entry(p.host.clone()).or_default().extend([
                format!("{pod}.{svc}.{NAMESPACE}.svc.cluster.local"),
                format!("{pod}.{svc}.{NAMESPACE}.svc"),
                format!("{pod}.{svc}"),
            ]);
        }
    }
    for svc in services {
        let mut matching = placed.iter().filter(|p| {
            !svc.selector.is_empty()
                && svc
                    .selector
                    .iter()
                    .all(|(k, v)| p.workload.labels.get(k) == Some(v))
        });
        // A Service with one pod answers with that pod's address (there is no ClusterIP
        // here); those with several are reached by their pods' own names.
        if let (Some(p), None) = (matching.next(), matching.next()) {
            let n = &svc.name;
            names.entry(p.host.clone()).or_default().extend([
                format!("{n}.{NAMESPACE}.svc.cluster.local"),
                format!("{n}.{NAMESPACE}.svc"),
                format!("{n}.{NAMESPACE}"),
                n.clone(),
            ]);
        }
    }
    names
}

const NAMESPACE: &str = "dolphin";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_chart_serves_requests() -> anyhow::Result<()> {
    let Some(helm) = helm()? else { return Ok(()) };
    let model = dolphinctl::up::default_model_path();
    if !model.is_file() {
        bail!("{} is missing: run scripts/fetch-model.sh", model.display());
    }
    let root = repo_root();
    let out = std::process::Command::new(&helm)
        .current_dir(&root)
        .args([
            "template",
            "t",
            CHART,
            "--namespace",
            NAMESPACE,
            "-f",
            PROFILE,
        ])
        // The learn Job is rendered (its command line is checked below), not run. Three etcd
        // members (the GPU profile's) and two prefill workers: several replicas per workload.
        .args([
            "--set",
            "learn.enabled=true",
            "--set",
            "router.policy=dolphin",
            "--set",
            "etcd.bundled.replicas=3",
            "--set",
            "prefill.replicas=2",
            // Rendered as DOLPHIN_TOOL_CALL_PARSER, which the router must accept.
            "--set",
            "router.toolCallParser=hermes",
            "--set",
            "router.reasoningParser=qwen3",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (workloads, services, jobs) = parse(&String::from_utf8(out.stdout)?)?;
    // Start order: etcd, the workers (slow model loads), the router.
    let order = [
        ("etcd", "etcd"),
        ("prefill-worker", "prefill"),
        ("decode-worker", "decode"),
        ("router", "router"),
    ];
    let components: BTreeSet<&str> = workloads.iter().map(|w| w.component.as_str()).collect();
    ensure!(
        components == order.iter().map(|(c, _)| *c).collect(),
        "unexpected workloads {components:?}"
    );
    let mut placed = Vec::new();
    for (component, host) in order {
        let w = workloads
            .iter()
            .find(|w| w.component == component)
            .context("missing")?;
        for replica in 0..w.replicas {
            placed.push(Placed {
                workload: w,
                replica,
                host: format!("{host}-{replica}"),
            });
        }
    }
    let replicas = |component: &str| {
        placed
            .iter()
            .filter(|p| p.workload.component == component)
            .count()
    };
    ensure!(
        (
            replicas("etcd"),
            replicas("prefill-worker"),
            replicas("decode-worker")
        ) == (3, 2, 1),
        "the render has other replica counts than asked"
    );
    let workers = replicas("prefill-worker") + replicas("decode-worker");

    let hosts: Vec<&str> = placed
        .iter()
        .map(|p| p.host.as_str())
        .chain(["client"])
        .collect();
    let Some(mut net) = netns::create_or_skip(&hosts)? else {
        return Ok(());
    };
    let dns: Vec<_> = dns_names(&placed, &services)
        .into_iter()
        .map(|(host, names)| (net.host(&host).ip, names))
        .collect();
    net.set_hosts(&dns)?;

    let dir = tempfile::tempdir()?;
    let mut running: Vec<ManagedProcess> = Vec::new();
    let result = async {
        let mut pods: Vec<(&Workload, Pod)> = Vec::new();
        for (component, _) in order {
            // Every replica of a workload starts at once (etcd members need each other for
            // quorum; the chart's StatefulSet has podManagementPolicy Parallel), then each must
            // pass its readiness probe, as the kubelet sees readiness.
            let started = pods.len();
            for p in placed.iter().filter(|p| p.workload.component == component) {
                let w = p.workload;
                let mut dirs = Vec::new();
                for (volume, mount) in w
                    .main
                    .mounts
                    .iter()
                    .chain(w.init.iter().flat_map(|c| &c.mounts))
                {
                    let here = match volume.as_str() {
                        "model" => model.parent().context("model dir")?.to_path_buf(),
                        other => {
                            let d = dir.path().join(&p.host).join(other);
                            std::fs::create_dir_all(&d)?;
                            d
                        }
                    };
                    dirs.push((mount.clone(), here));
                }
                let pod = Pod {
                    name: w.pod_name(p.replica),
                    ip: net.host(&p.host).ip.to_string(),
                    host: p.host.clone(),
                    dirs: Mounts(dirs),
                };
                for init in &w.init {
                    let mut proc = ManagedProcess::spawn(spec_of(&net, &pod, init)?)?;
                    let status =
                        tokio::time::timeout(Duration::from_secs(300), proc.wait()).await?;
                    ensure!(
                        status.success(),
                        "{}: init {} failed: {}",
                        pod.name,
                        init.name,
                        proc.output_tail(20)
                    );
                }
                running.push(ManagedProcess::spawn(spec_of(&net, &pod, &w.main)?)?);
                pods.push((w, pod));
            }
            for (w, pod) in &pods[started..] {
                let what = format!("{} to pass its readiness probe", pod.name);
                wait::until(&what, Duration::from_secs(180), || async {
                    probe(&net, &pod.ip, &w.main)
                        .await
                        .map_err(|e| format!("{e:#}"))
                })
                .await?;
            }
        }
        let router_svc = services
            .iter()
            .find(|s| {
                s.selector
                    .get("app.kubernetes.io/component")
                    .is_some_and(|c| c == "router")
            })
            .context("no router Service")?;
        let router = format!("{}:50051", net.host("router-0").ip);
        // RouterAdmin is served on the router's admin listener (ports.routerAdmin).
        let admin = format!("{}:50052", net.host("router-0").ip);
        wait::until("the router to list every worker live", GENEROUS, || async {
            let admin = admin.clone();
            let ws = net
                .run_in("client", move || async move {
                    grpc::list_workers(&mut RouterAdminClient::new(grpc::channel(&admin).await?))
                        .await
                })
                .await
                .map_err(|e| format!("{e:#}"))?;
            match ws.iter().filter(|w| w.events_live).count() {
                n if n == workers => Ok(()),
                _ => Err(format!("{ws:?}")),
            }
        })
        .await?;

        // Requests through the router, on both paths, with the real model.
        for mode in [PrefillMode::Local, PrefillMode::Remote] {
            let router = router.clone();
            let g = net
                .run_in("client", move || async move {
                    let mut client = InferenceClient::new(grpc::channel(&router).await?);
                    let req = GenerateRequest {
                        input: Some(Input::Text("The capital of France is".to_owned())),
                        sampling: Some(SamplingParams {
                            max_tokens: 6,
                            ..SamplingParams::default()
                        }),
                        force_mode: mode as i32,
                        ..GenerateRequest::default()
                    };
                    grpc::generate(&mut client, req)
                        .await
                        .map_err(anyhow::Error::from)
                })
                .await
                .with_context(|| format!("{mode:?} request"))?;
            ensure!(g.tokens.len() == 6 && !g.text.is_empty(), "{mode:?}: {g:?}");
            if mode == PrefillMode::Remote {
                ensure!(
                    g.timings.is_some_and(|t| t.kv_bytes > 0),
                    "no KV moved: {g:?}"
                );
            }
        }

        // The learn Job: dolphinctl accepts its command line (--help after it: clap checks every
        // flag and value before it prints the help), and it names the router's Service.
        let job = jobs.first().context("learn.enabled rendered no Job")?;
        let c = container(&job["spec"]["template"]["spec"]["containers"][0])?;
        ensure!(
            c.args.iter().any(|a| a.contains(&router_svc.name)),
            "the learn Job does not address the router Service: {:?}",
            c.args
        );
        let out = std::process::Command::new(program(&c.command[0])?)
            .args(&c.command[1..])
            .args(&c.args)
            .arg("--help")
            .output()?;
        ensure!(
            out.status.success(),
            "dolphinctl refuses the learn Job's arguments {:?}: {}",
            c.args,
            String::from_utf8_lossy(&out.stderr)
        );

        // The decode pod's preStop hook drains it: readiness turns NOT_SERVING.
        let (w, pod) = pods
            .iter()
            .find(|(w, _)| w.component == "decode-worker")
            .context("decode")?;
        let hook = w
            .main
            .pre_stop
            .clone()
            .context("decode has no preStop hook")?;
        let hook_container = Container {
            name: "preStop".into(),
            command: hook,
            args: Vec::new(),
            env: Vec::new(),
            mounts: Vec::new(),
            readiness: None,
            pre_stop: None,
            ports: BTreeMap::new(),
        };
        let mut p = ManagedProcess::spawn(spec_of(&net, pod, &hook_container)?)?;
        let status = tokio::time::timeout(GENEROUS, p.wait()).await?;
        ensure!(status.success(), "preStop failed: {}", p.output_tail(20));
        ensure!(
            probe(&net, &pod.ip, &w.main).await.is_err(),
            "a drained decode worker still reports ready"
        );
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        for p in &running {
            eprintln!("----- {} -----\n{}", p.name(), p.output_tail(40));
        }
    }
    result
}

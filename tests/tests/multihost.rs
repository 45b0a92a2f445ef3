//! A cluster across hosts: etcd, the router, two prefill and two decode workers, each in its own
//! network namespace with its own address, bound to 0.0.0.0 and publishing an advertise
//! address, as in containers. Checks the local and remote paths with KV crossing hosts, then
//! pulls one decode host's cable: it leaves the router's view within its lease TTL, its
//! in-flight requests end with a clear error (or complete), new requests are served by the
//! other host; the cable goes back in and the worker rejoins and serves again. Then a prefill
//! host's cable: remote requests complete throughout (falling back to local prefill while the
//! router still lists it), and it rejoins.
//!
//! Needs root (network namespaces); skips without, unless `DOLPHIN_REQUIRE_NETNS=1` (CI).

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::router_admin_client::RouterAdminClient;
use dolphin_proto::v1::{FinishReason, PrefillMode, Role, WorkerStatus};
use dolphin_tests::netns::{self, VirtualNet};
use dolphin_tests::wait::{self, GENEROUS};
use dolphin_tests::{binaries, grpc};
use dolphinctl::process::{ManagedProcess, ProcessSpec};
use dolphinctl::ready::ReadyInfo;

const LEASE_TTL_SECS: u64 = 3;
const HOSTS: [&str; 7] = [
    "etcd",
    "router",
    "prefill-0",
    "prefill-1",
    "decode-0",
    "decode-1",
    "client",
];

/// Processes of the test; their output is printed on drop unless the test passed.
#[derive(Default)]
struct Procs {
    list: Vec<ManagedProcess>,
    passed: bool,
}

impl Procs {
    async fn start(&mut self, spec: ProcessSpec, ready: bool) -> anyhow::Result<ReadyInfo> {
        let name = spec.name.clone();
        self.list.push(ManagedProcess::spawn(spec)?);
        if !ready {
            return Ok(ReadyInfo::default());
        }
        let last = self.list.last_mut().context("just pushed")?;
        last.wait_ready(Duration::from_secs(90))
            .await
            .with_context(|| format!("{name} did not become ready"))
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        if self.passed && std::env::var_os("DOLPHIN_TEST_LOGS").is_none() {
            return;
        }
        for p in &self.list {
            eprintln!("----- {} -----\n{}", p.name(), p.output_tail(60));
        }
    }
}

async fn workers(net: &VirtualNet, admin: &str) -> anyhow::Result<Vec<WorkerStatus>> {
    let admin = admin.to_owned();
    net.run_in("client", move || async move {
        let mut admin = RouterAdminClient::new(grpc::channel(&admin).await?);
        grpc::list_workers(&mut admin).await
    })
    .await
}

/// Waits until the router lists worker `id` with a live event stream (`listed`) or no longer
/// lists it at all.
async fn until_listed(net: &VirtualNet, admin: &str, id: &str, listed: bool) -> anyhow::Result<()> {
    let what = match listed {
        true => format!("{id} to rejoin the router's view"),
        false => format!("{id} to leave the router's view"),
    };
    wait::until(&what, GENEROUS, || async {
        let ws = workers(net, admin).await.map_err(|e| format!("{e:#}"))?;
        let live = ws.iter().any(|w| w.worker_id == id && w.events_live);
        let present = ws.iter().any(|w| w.worker_id == id);
        match (listed, live, present) {
            (true, true, _) | (false, _, false) => Ok(()),
            _ => Err(format!("{ws:?}")),
        }
    })
    .await
}

/// One request from the client host; the status is kept, not turned into an error.
async fn request(
    net: &VirtualNet,
    router: &str,
    prompt: String,
    max_tokens: u32,
    mode: PrefillMode,
) -> anyhow::Result<Result<grpc::Generated, tonic::Status>> {
    let router = router.to_owned();
    net.run_in("client", move || async move {
        let mut client = InferenceClient::new(grpc::channel(&router).await?);
        Ok(grpc::generate(&mut client, grpc::text_request(&prompt, max_tokens, mode)).await)
    })
    .await
}

fn worker_flags(net: &VirtualNet, host: &str, etcd: &str, role: Role) -> Vec<String> {
    let ip = net.host(host).ip;
    let mut a: Vec<String> = [
        "--grpc-addr=0.0.0.0:7000",
        &format!("--advertise-addr={ip}"),
        &format!("--worker-id={host}"),
        &format!("--etcd={etcd}"),
        &format!("--lease-ttl-secs={LEASE_TTL_SECS}"),
        "--engine=sim",
        "--model=sim-model",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if role == Role::Decode {
        a.push("--kv-addr=0.0.0.0:7100".into());
        // Real decode step times (a few ms): long requests are still running when a cable is
        // pulled. Prefill stays fast.
        a.push("--sim-time-scale=1".into());
    } else {
        a.push("--sim-time-scale=0.01".into());
    }
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_across_hosts_survives_a_lost_host() -> anyhow::Result<()> {
    let Some(net) = netns::create_or_skip(&HOSTS)? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let mut procs = Procs::default();

    let (etcd_spec, etcd) = netns::etcd_spec(&net, "etcd", &dir.path().join("etcd"));
    procs.start(etcd_spec, false).await?;
    net.wait_etcd("client", &etcd).await?;

    for (host, role) in [
        ("prefill-0", Role::Prefill),
        ("prefill-1", Role::Prefill),
        ("decode-0", Role::Decode),
        ("decode-1", Role::Decode),
    ] {
        let bin = match role {
            Role::Decode => binaries::DECODE_WORKER,
            _ => binaries::PREFILL_WORKER,
        };
        let spec = net.spec(
            host,
            host,
            &binaries::binary(bin)?,
            worker_flags(&net, host, &etcd, role),
        );
        let ready = procs.start(spec, true).await?;
        // What the worker announces is its host's address, never the bound 0.0.0.0.
        let ip = net.host(host).ip;
        assert_eq!(
            ready.grpc_addr.as_deref(),
            Some(format!("{ip}:7000").as_str())
        );
        if role == Role::Decode {
            assert_eq!(
                ready.kv_addr.as_deref(),
                Some(format!("{ip}:7100").as_str())
            );
        }
    }
    let router_ip = net.host("router").ip;
    let spec = net.spec(
        "router",
        "router",
        &binaries::binary(binaries::ROUTER)?,
        [
            "--http-addr=0.0.0.0:8000".to_owned(),
            "--grpc-addr=0.0.0.0:50051".to_owned(),
            "--admin-addr=0.0.0.0:50052".to_owned(),
            format!("--advertise-addr={router_ip}"),
            format!("--etcd={etcd}"),
            "--policy=threshold".to_owned(),
        ],
    );
    let ready = procs.start(spec, true).await?;
    let router = ready
        .grpc_addr
        .context("router announced no gRPC address")?;
    assert_eq!(router, format!("{router_ip}:50051"));
    let admin = ready
        .admin_addr
        .context("router announced no admin address")?;
    assert_eq!(admin, format!("{router_ip}:50052"));

    // The router sees all four workers at their hosts' addresses, with live event streams.
    wait::until("the router to list 4 live workers", GENEROUS, || async {
        let ws = workers(&net, &admin).await.map_err(|e| format!("{e:#}"))?;
        if ws.len() == 4 && ws.iter().all(|w| w.events_live) {
            Ok(())
        } else {
            Err(format!("{ws:?}"))
        }
    })
    .await?;
    for w in workers(&net, &admin).await? {
        let ip = net.host(&w.worker_id).ip;
        assert_eq!(w.grpc_addr, format!("{ip}:7000"), "{w:?}");
        if w.role == Role::Decode as i32 {
            assert_eq!(w.kv_addr, format!("{ip}:7100"), "{w:?}");
        }
        assert_eq!(w.version, dolphin_cluster::BUILD_VERSION, "{w:?}");
        assert!(!w.kv_layout.is_empty(), "{w:?}");
    }

    // Both paths work across hosts; a remote prefill moves KV bytes from a prefill host to a
    // decode host.
    for (i, mode) in [PrefillMode::Local, PrefillMode::Remote, PrefillMode::Remote]
        .into_iter()
        .enumerate()
    {
        let prompt = format!("request {i} across hosts: the pod of dolphins swims north today");
        let g = request(&net, &router, prompt, 8, mode)
            .await?
            .map_err(|s| anyhow::anyhow!("{mode:?} request failed: {s}"))?;
        let routing = g.last_routing.clone().context("no routing")?;
        let kv_bytes = g.timings.as_ref().map_or(0, |t| t.kv_bytes);
        assert_eq!(g.tokens.len(), 8, "{g:?}");
        match mode {
            PrefillMode::Remote => {
                assert!(
                    routing.prefill_worker.starts_with("prefill-"),
                    "{routing:?}"
                );
                assert!(!routing.fell_back, "{routing:?}");
                assert!(kv_bytes > 0, "a remote prefill moved no KV: {g:?}");
            }
            _ => assert_eq!(kv_bytes, 0, "{g:?}"),
        }
    }

    // Long requests in flight on both decode hosts.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, String)>();
    let inflight = {
        let router = router.clone();
        net.run_in("client", move || async move {
            let mut tasks = Vec::new();
            for i in 0..6 {
                let (router, tx) = (router.clone(), tx.clone());
                tasks.push(tokio::spawn(async move {
                    let mut client = InferenceClient::new(grpc::channel(&router).await?);
                    let req = grpc::text_request(
                        &format!("long request {i}: write a very long story about dolphins"),
                        3000,
                        PrefillMode::Local,
                    );
                    let mut stream = match client.generate(req).await {
                        Ok(s) => s.into_inner(),
                        Err(status) => return Ok((i, Err(status))),
                    };
                    let mut tokens = 0usize;
                    let mut finish = None;
                    loop {
                        match stream.message().await {
                            Ok(Some(msg)) => {
                                if let Some(r) = &msg.routing
                                    && tokens == 0
                                {
                                    let _ = tx.send((i, r.decode_worker.clone()));
                                }
                                tokens += msg.token_ids.len();
                                if msg.finish_reason != FinishReason::Unspecified as i32 {
                                    finish = Some(msg.finish_reason);
                                }
                            }
                            Ok(None) => return anyhow::Ok((i, Ok((tokens, finish)))),
                            Err(status) => return Ok((i, Err(status))),
                        }
                    }
                }));
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await??);
            }
            Ok(out)
        })
    };
    tokio::pin!(inflight);
    let mut placed = std::collections::HashMap::new();
    while placed.len() < 6 {
        tokio::select! {
            Some((i, decode)) = rx.recv() => { placed.insert(i, decode); }
            done = &mut inflight => bail!("long requests ended before the cut: {done:?}"),
            () = tokio::time::sleep(GENEROUS) => bail!("long requests did not start: {placed:?}"),
        }
    }
    ensure!(
        placed.values().any(|d| d == "decode-1") && placed.values().any(|d| d == "decode-0"),
        "the long requests did not spread over both decode hosts: {placed:?}"
    );

    // Pull decode-1's cable.
    net.link_down("decode-1")?;
    let cut = Instant::now();
    until_listed(&net, &admin, "decode-1", false).await?;
    let left_after = cut.elapsed();
    eprintln!("decode-1 left the router's view {left_after:?} after its link went down");
    // The lease expires at most one TTL after the last keep-alive; etcd's expiry sweep and the
    // watch add a little. Generous against a busy machine, still far below the next TTL.
    ensure!(
        left_after <= Duration::from_secs(LEASE_TTL_SECS + 3),
        "decode-1 left the router's view {left_after:?} after its link went down (TTL {LEASE_TTL_SECS} s)"
    );

    // New requests are served by decode-0, on both paths, meanwhile.
    for (i, mode) in [
        PrefillMode::Local,
        PrefillMode::Remote,
        PrefillMode::Unspecified,
    ]
    .into_iter()
    .enumerate()
    {
        let prompt = format!("request {i} during the outage: where did the dolphins go");
        let g = request(&net, &router, prompt, 8, mode)
            .await?
            .map_err(|s| anyhow::anyhow!("request during the outage failed: {s}"))?;
        let routing = g.last_routing.context("no routing")?;
        assert_eq!(routing.decode_worker, "decode-0", "{routing:?}");
    }

    // In-flight requests: decode-0's complete; decode-1's end with a clear error (the router's
    // pings find the connection dead) or complete. None hangs.
    let results = tokio::time::timeout(Duration::from_secs(120), &mut inflight)
        .await
        .context("in-flight requests still hang two minutes after the cut")??;
    for (i, result) in results {
        let decode = &placed[&i];
        match (decode.as_str(), result) {
            (_, Ok((tokens, Some(reason)))) => {
                assert_eq!(
                    reason,
                    FinishReason::Length as i32,
                    "request {i} on {decode}"
                );
                assert!(tokens > 0, "request {i} on {decode}");
            }
            ("decode-1", Err(status)) => {
                eprintln!("request {i} on decode-1 ended: {status}");
                assert_eq!(
                    status.code(),
                    tonic::Code::Unavailable,
                    "request {i}: {status}"
                );
                assert!(
                    status
                        .message()
                        .contains("lost the connection to decode worker decode-1"),
                    "request {i}: {status}"
                );
            }
            (_, other) => bail!("request {i} on {decode} ended badly: {other:?}"),
        }
    }

    // The cable goes back in: decode-1 re-registers (its lease is gone: a new one) and rejoins.
    net.link_up("decode-1")?;
    until_listed(&net, &admin, "decode-1", true).await?;
    let mut served = false;
    for i in 0..40 {
        let prompt = format!("request {i} after the repair: the dolphins are back");
        let g = request(&net, &router, prompt, 4, PrefillMode::Remote)
            .await?
            .map_err(|s| anyhow::anyhow!("request after the repair failed: {s}"))?;
        let routing = g.last_routing.context("no routing")?;
        if routing.decode_worker == "decode-1" {
            assert!(g.timings.is_some_and(|t| t.kv_bytes > 0), "{routing:?}");
            served = true;
            break;
        }
    }
    ensure!(served, "decode-1 rejoined but served none of 40 requests");

    // A prefill host goes away: until its lease expires the router may still pick it, and the
    // decode worker then cannot reach it and prefills locally (the request completes
    // elsewhere, `fell_back`); afterwards every remote request goes to prefill-0.
    net.link_down("prefill-1")?;
    let cut = Instant::now();
    let during = {
        let router = router.clone();
        net.run_in("client", move || async move {
            let mut client = InferenceClient::new(grpc::channel(&router).await?);
            let mut out = Vec::new();
            for i in 0..6 {
                let req = grpc::text_request(
                    &format!("{i} prefill host gone: ship my KV anyway"),
                    4,
                    PrefillMode::Remote,
                );
                out.push(grpc::generate(&mut client, req).await);
            }
            anyhow::Ok(out)
        })
    };
    let gone = async {
        until_listed(&net, &admin, "prefill-1", false).await?;
        anyhow::Ok(cut.elapsed())
    };
    let (during, left_after) = tokio::join!(during, gone);
    let left_after = left_after?;
    ensure!(
        left_after <= Duration::from_secs(LEASE_TTL_SECS + 3),
        "prefill-1 left the router's view {left_after:?} after its link went down"
    );
    let mut fell_back = 0;
    for (i, g) in during?.into_iter().enumerate() {
        let g =
            g.map_err(|s| anyhow::anyhow!("remote request {i} with prefill-1 cut failed: {s}"))?;
        ensure!(g.tokens.len() == 4, "{g:?}");
        fell_back += usize::from(g.last_routing.is_some_and(|r| r.fell_back));
    }
    eprintln!(
        "prefill-1 left the router's view {left_after:?} after its link went down; 6 remote \
         requests sent meanwhile all completed, {fell_back} by falling back to local prefill"
    );
    for i in 0..4 {
        let prompt = format!("{i} with one prefill host: ship my KV");
        let g = request(&net, &router, prompt, 4, PrefillMode::Remote)
            .await?
            .map_err(|s| anyhow::anyhow!("remote request {i} failed: {s}"))?;
        let routing = g.last_routing.context("no routing")?;
        assert_eq!(routing.prefill_worker, "prefill-0", "{routing:?}");
        assert!(!routing.fell_back, "{routing:?}");
    }
    net.link_up("prefill-1")?;
    until_listed(&net, &admin, "prefill-1", true).await?;
    procs.passed = true;
    Ok(())
}

#[tokio::test]
async fn a_worker_bound_to_every_address_without_an_advertise_address_refuses_to_start()
-> anyhow::Result<()> {
    for (bin, flags) in [
        (binaries::DECODE_WORKER, vec!["--grpc-addr=0.0.0.0:0"]),
        (binaries::DECODE_WORKER, vec!["--kv-addr=[::]:0"]),
        (binaries::PREFILL_WORKER, vec!["--grpc-addr=0.0.0.0:0"]),
        (
            binaries::ROUTER,
            vec![
                "--http-addr=0.0.0.0:0",
                "--admin-addr=127.0.0.1:0",
                "--metrics-addr=127.0.0.1:0",
                "--decode=127.0.0.1:1",
            ],
        ),
    ] {
        let out = tokio::process::Command::new(binaries::binary(bin)?)
            .args(&flags)
            .output()
            .await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bin} {flags:?}: {stderr}");
        assert!(
            stderr.contains("--advertise-addr"),
            "{bin} {flags:?}: {stderr}"
        );
    }
    Ok(())
}

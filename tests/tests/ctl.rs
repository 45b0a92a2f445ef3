//! `dolphinctl up` end to end: it brings up a cluster that serves requests (also through
//! `dolphinctl workers` and `dolphinctl request`), stops every child on SIGINT, restarts a child
//! that dies while the rest keeps serving, and its children do not outlive it even when it is
//! SIGKILLed.

use anyhow::Context;
use dolphin_proto::v1::PrefillMode;
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_tests::binaries::dolphinctl;
use dolphin_tests::cluster::{READY_TIMEOUT, spawn};
use dolphin_tests::wait::{self, GENEROUS};
use dolphin_tests::{EtcdServer, binaries, grpc, http};
use dolphinctl::process::ManagedProcess;
use rustix::process::{Pid, Signal};
use serde_json::Value;

/// A running `dolphinctl up` and what its cluster READY line said.
struct Up {
    ctl: ManagedProcess,
    ready: Value,
    logs: tempfile::TempDir,
    passed: bool,
}

impl Up {
    async fn start() -> anyhow::Result<Self> {
        Self::start_with(&[]).await
    }

    async fn start_with(extra: &[&str]) -> anyhow::Result<Self> {
        let logs = tempfile::tempdir()?;
        let args = [
            "up",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--sim-time-scale",
            "0.01",
            "--model",
            grpc::MODEL,
            "--grace-secs",
            "30",
            "--log-dir",
        ]
        .map(str::to_owned)
        .into_iter()
        .chain([logs.path().display().to_string()])
        .chain(extra.iter().map(|a| (*a).to_owned()))
        .collect();
        let mut ctl = spawn("dolphinctl", &binaries::binary(binaries::DOLPHINCTL)?, args)?;
        let info = ctl.wait_ready(READY_TIMEOUT).await;
        if let Err(err) = info {
            anyhow::bail!("dolphinctl up failed: {err}\n{}", ctl.output().join("\n"));
        }
        let line = ctl
            .output()
            .into_iter()
            .find(|l| l.starts_with("DOLPHIN_READY "))
            .context("READY line not in the output")?;
        let ready: Value = serde_json::from_str(&line["DOLPHIN_READY ".len()..])?;
        Ok(Self {
            ctl,
            ready,
            logs,
            passed: false,
        })
    }

    fn grpc_addr(&self) -> String {
        self.ready["grpc_addr"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn admin_addr(&self) -> String {
        self.ready["admin_addr"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn http_addr(&self) -> String {
        self.ready["http_addr"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// (name, pid) of every child.
    fn children(&self) -> Vec<(String, Pid)> {
        self.ready["processes"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| {
                        let pid = i32::try_from(p["pid"].as_u64()?).ok()?;
                        Some((p["name"].as_str()?.to_owned(), Pid::from_raw(pid)?))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn output(&self) -> String {
        self.ctl.output().join("\n")
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // On failure, show dolphinctl's own output and every child's log file.
        if self.passed && std::env::var_os("DOLPHIN_TEST_LOGS").is_none() {
            return;
        }
        eprintln!("===== dolphinctl =====\n{}", self.output());
        let mut logs: Vec<_> = std::fs::read_dir(self.logs.path())
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            eprintln!("===== {} =====\n{text}", log.display());
        }
    }
}

/// Whether `pid` is gone (no such process, or a zombie nobody has reaped yet).
fn is_gone(pid: Pid) -> bool {
    if rustix::process::test_kill_process(pid).is_err() {
        return true;
    }
    let stat =
        std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap_or_default();
    stat.rsplit_once(')')
        .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z'))
}

#[tokio::test]
async fn up_serves_requests_and_sigint_stops_every_child() -> anyhow::Result<()> {
    let mut up = Up::start().await?;
    let children = up.children();
    let names: Vec<&str> = children.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["router", "prefill-0", "decode-0"],
        "{}",
        up.output()
    );

    let mut client = dolphin_proto::v1::inference_client::InferenceClient::new(
        grpc::channel(&up.grpc_addr()).await?,
    );
    let g = grpc::generate(
        &mut client,
        grpc::text_request("hello from the ctl test", 12, PrefillMode::Remote),
    )
    .await?;
    assert!(!g.tokens.is_empty(), "{g:?}");

    let body = serde_json::json!({"model": grpc::MODEL, "prompt": "hi there", "max_tokens": 8});
    let resp = http::post_json(&up.http_addr(), "/v1/completions", &body.to_string()).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());

    let url = format!("http://{}", up.grpc_addr());
    let admin = format!("http://{}", up.admin_addr());
    let out = dolphinctl(&["workers", "--json", "--router-admin", &admin]).await?;
    assert!(out.status.success(), "{out:?}");
    let rows: Value = serde_json::from_slice(&out.stdout)?;
    let mut roles: Vec<&str> = rows
        .as_array()
        .context("workers --json is an array")?
        .iter()
        .filter_map(|r| r["role"].as_str())
        .collect();
    roles.sort_unstable();
    assert_eq!(roles, ["decode", "prefill"], "{rows}");
    let out = dolphinctl(&["workers", "--router-admin", &admin]).await?;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.starts_with("ID "), "{out:?}");

    let out = dolphinctl(&[
        "request",
        "--router-grpc",
        &url,
        "--prompt",
        "hello dolphins",
        "--max-tokens",
        "8",
        "--mode",
        "remote",
    ])
    .await?;
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "{out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("mode=remote"),
        "{out:?}"
    );

    up.ctl.signal(Signal::INT)?;
    let status = tokio::time::timeout(GENEROUS, up.ctl.wait())
        .await
        .context("dolphinctl did not exit after SIGINT")?;
    assert!(status.success(), "{status}: {}", up.output());
    // dolphinctl waits for (and reaps) every child before it exits: no polling needed.
    for (name, pid) in &children {
        assert!(is_gone(*pid), "{name} ({pid:?}) outlived dolphinctl");
    }
    for log in ["router.log", "prefill-0.log", "decode-0.log"] {
        assert!(up.logs.path().join(log).is_file(), "{log} missing");
    }
    up.passed = true;
    Ok(())
}

#[tokio::test]
async fn up_restarts_a_dead_worker_and_keeps_serving() -> anyhow::Result<()> {
    let mut up = Up::start_with(&["--decode", "2"]).await?;
    let children = up.children();
    let (_, decode) = children
        .iter()
        .find(|(n, _)| n == "decode-0")
        .context("no decode-0")?;
    rustix::process::kill_process(*decode, Signal::KILL)?;
    wait::until("dolphinctl to report the death", GENEROUS, || async {
        let out = up.output();
        match out.contains("decode-0 exited unexpectedly") {
            true => Ok(()),
            false => Err(out),
        }
    })
    .await?;
    // While decode-0 is down (or coming back), the cluster keeps serving.
    let mut client = InferenceClient::new(grpc::channel(&up.grpc_addr()).await?);
    for i in 0..4 {
        let req = grpc::text_request(
            &format!("while one is down {i}"),
            4,
            PrefillMode::Unspecified,
        );
        let g = grpc::generate(&mut client, req)
            .await
            .map_err(|s| anyhow::anyhow!("request {i} with decode-0 dead failed: {s}"))?;
        assert!(!g.tokens.is_empty(), "{g:?}");
    }
    wait::until("decode-0 to be restarted", GENEROUS, || async {
        let out = up.output();
        match out.contains("decode-0 restarted") {
            true => Ok(()),
            false => Err(out),
        }
    })
    .await?;
    assert!(
        up.ctl.exit_status().is_none(),
        "dolphinctl exited: {}",
        up.output()
    );
    // The restarted worker is back where it was, under the same id: the router lists it
    // live again and routes to it.
    let id = up.ready["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "decode-0"))
        .and_then(|p| p["id"].as_str())
        .context("no id for decode-0")?
        .to_owned();
    wait::until(
        "the router to list every worker live again",
        GENEROUS,
        || async {
            let mut admin = dolphin_proto::v1::router_admin_client::RouterAdminClient::new(
                grpc::channel(&up.admin_addr())
                    .await
                    .map_err(|e| e.to_string())?,
            );
            let ws = grpc::list_workers(&mut admin)
                .await
                .map_err(|e| e.to_string())?;
            match ws.iter().filter(|w| w.events_live).count() {
                3 if ws.iter().any(|w| w.worker_id == id) => Ok(()),
                _ => Err(format!("{ws:?}")),
            }
        },
    )
    .await?;
    let mut served = false;
    for i in 0..40 {
        let req = grpc::text_request(
            &format!("{i}: after the restart"),
            4,
            PrefillMode::Unspecified,
        );
        let g = grpc::generate(&mut client, req)
            .await
            .map_err(|s| anyhow::anyhow!("request {i} after the restart failed: {s}"))?;
        if g.last_routing.is_some_and(|r| r.decode_worker == id) {
            served = true;
            break;
        }
    }
    assert!(
        served,
        "the restarted decode-0 ({id}) served none of 40 requests"
    );
    up.ctl.signal(Signal::INT)?;
    let status = tokio::time::timeout(GENEROUS, up.ctl.wait())
        .await
        .context("dolphinctl did not exit after SIGINT")?;
    assert!(status.success(), "{status}: {}", up.output());
    up.passed = true;
    Ok(())
}

#[tokio::test]
async fn children_die_with_a_sigkilled_dolphinctl() -> anyhow::Result<()> {
    assert!(
        dolphinctl::pdeathsig::setpriv_path().is_some(),
        "setpriv (util-linux) with --pdeathsig is required for this guarantee"
    );
    let mut up = Up::start().await?;
    let children = up.children();
    assert_eq!(children.len(), 3, "{}", up.output());
    up.ctl.signal(Signal::KILL)?;
    up.ctl.wait().await;
    // The kernel delivers the parent-death signal; the orphans are then reaped by init.
    wait::until("every child to die with dolphinctl", GENEROUS, || {
        let alive: Vec<String> = children
            .iter()
            .filter(|(_, pid)| !is_gone(*pid))
            .map(|(n, _)| n.clone())
            .collect();
        async move {
            if alive.is_empty() {
                Ok(())
            } else {
                Err(format!("still alive: {alive:?}"))
            }
        }
    })
    .await?;
    up.passed = true;
    Ok(())
}

#[tokio::test]
async fn up_with_etcd_registers_every_worker_and_stops_on_sigterm() -> anyhow::Result<()> {
    let etcd = EtcdServer::start().await;
    let endpoint = etcd.endpoint();
    let mut up = Up::start_with(&[
        "--etcd",
        &endpoint,
        "--cluster",
        "ctl-test",
        "--lease-ttl-secs",
        "3",
        "--decode",
        "2",
    ])
    .await?;
    let children = up.children();
    assert_eq!(children.len(), 4, "{}", up.output());
    assert_eq!(up.ready["discovery"], format!("etcd {endpoint}"));

    // The router learns the workers from etcd, not from flags: wait until it lists all three.
    let url = format!("http://{}", up.admin_addr());
    wait::until("the router to list 3 workers from etcd", GENEROUS, || {
        let url = url.clone();
        async move {
            let out = dolphinctl(&["workers", "--json", "--router-admin", &url])
                .await
                .map_err(|e| e.to_string())?;
            let rows: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
            match rows.as_array() {
                Some(a) if a.len() == 3 => Ok(()),
                _ => Err(format!("{out:?}")),
            }
        }
    })
    .await?;
    let mut client = dolphin_proto::v1::inference_client::InferenceClient::new(
        grpc::channel(&up.grpc_addr()).await?,
    );
    let g = grpc::generate(
        &mut client,
        grpc::text_request("hello over etcd", 8, PrefillMode::Unspecified),
    )
    .await?;
    assert!(!g.tokens.is_empty(), "{g:?}");

    up.ctl.signal(Signal::TERM)?;
    let status = tokio::time::timeout(GENEROUS, up.ctl.wait())
        .await
        .context("dolphinctl did not exit after SIGTERM")?;
    assert!(status.success(), "{status}: {}", up.output());
    for (name, pid) in &children {
        assert!(is_gone(*pid), "{name} ({pid:?}) outlived dolphinctl");
    }
    up.passed = true;
    Ok(())
}

//! `dolphinctl replay` end to end: a synthetic workload replayed on a live 1p1d cluster (sim
//! engine) reports every request with the router's features and writes its JSON and charts;
//! the simulator target does the same in-process; a replay with no router behind the URL fails
//! with a clear message and a non-zero exit.

use std::path::Path;
use std::process::Output;

use anyhow::Context;
use dolphin_tests::binaries::dolphinctl;
use dolphin_tests::{ClusterConfig, TestCluster};
use serde_json::Value;

const CHARTS: [&str; 4] = [
    "ttft_cdf.png",
    "tpot_cdf.png",
    "e2e_cdf.png",
    "cluster_attainment.png",
];

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The PNG signature and an IHDR chunk with a non-empty image.
fn check_png(path: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        bytes.len() > 33 && bytes.starts_with(b"\x89PNG\r\n\x1a\n") && &bytes[12..16] == b"IHDR",
        "{} is not a PNG",
        path.display()
    );
    let width = u32::from_be_bytes(bytes[16..20].try_into()?);
    let height = u32::from_be_bytes(bytes[20..24].try_into()?);
    anyhow::ensure!(width > 0 && height > 0, "{}: empty image", path.display());
    Ok(())
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Checks the JSON report of a replay of `n` requests that all completed.
fn check_report(v: &Value, n: usize) -> anyhow::Result<()> {
    let outcomes = v["outcomes"].as_array().context("no outcomes")?;
    assert_eq!(outcomes.len(), n);
    for (i, o) in outcomes.iter().enumerate() {
        assert_eq!(o["index"], i, "{o}");
        assert_eq!(o["ok"], true, "{o}");
        assert_eq!(o["kind"], "humaneval", "{o}");
        // HumanEval-like outputs are 64..512 tokens, all generated (ignore_eos).
        let tokens = o["output_tokens"].as_u64().context("output_tokens")?;
        assert!((64..=512).contains(&tokens), "{o}");
        // The router's features: the prompt length as sent, an output-length hint.
        assert_eq!(o["features"][0], o["prompt_tokens"], "{o}");
        assert!(o["features"][3].as_u64() > Some(0), "{o}");
        assert!(
            f(&o["ttft_ms"]) > 0.0 && f(&o["e2e_ms"]) >= f(&o["ttft_ms"]),
            "{o}"
        );
    }
    let s = &v["summary"];
    assert_eq!(s["requests"], n);
    assert_eq!(s["completed"], n);
    let count = |key: &str| outcomes.iter().filter(|o| o[key] == true).count();
    assert_eq!(s["remote"], count("remote"));
    let attainment = f(&s["attainment"]);
    assert!(
        (attainment - count("met") as f64 / n as f64).abs() < 1e-9,
        "{s}"
    );
    for metric in ["ttft", "tpot", "e2e"] {
        let p = &s[metric];
        assert!(
            f(&p["p50"]) <= f(&p["p90"]) && f(&p["p90"]) <= f(&p["p99"]),
            "{metric}: {p}"
        );
    }
    let per_cluster = s["per_cluster"].as_array().context("per_cluster")?;
    let total: u64 = per_cluster
        .iter()
        .filter_map(|c| c["requests"].as_u64())
        .sum();
    assert_eq!(total, n as u64);
    assert_eq!(s["per_kind"][0]["requests"], n);
    let makespan = f(&s["makespan_ms"]);
    assert!(makespan > 0.0, "{s}");
    let rps = n as f64 / (makespan / 1e3);
    assert!((f(&s["throughput_rps"]) - rps).abs() < 1e-6 * rps, "{s}");
    assert_eq!(v["config"]["workload"], "humaneval");
    assert_eq!(v["config"]["arrivals"], "closed:4");
    Ok(())
}

#[tokio::test]
async fn replays_a_synthetic_workload_on_a_live_cluster() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("replay.json");
    let plots = dir.path().join("plots");
    let out = dolphinctl(&[
        "replay",
        "--workload",
        "humaneval",
        "--requests",
        "40",
        "--arrivals",
        "closed:4",
        "--router-grpc",
        cluster.grpc_addr(),
        "--json",
        &json.display().to_string(),
        "--plots",
        &plots.display().to_string(),
    ])
    .await?;
    anyhow::ensure!(out.status.success(), "replay failed: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("completed 40/40"), "{}", text(&out));
    assert!(stdout.contains("failed: 0"), "{}", text(&out));
    // Progress goes to stderr as plain lines (stderr is a pipe here), ending at 40/40.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("replay: 40/40 done"), "{}", text(&out));

    let v: Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    check_report(&v, 40)?;
    assert_eq!(v["config"]["target"], "live");
    for name in CHARTS {
        check_png(&plots.join(name))?;
    }
    cluster.passed();
    Ok(())
}

/// With `--max-tokens-cap` the router sees only the workload's cap as `max_tokens`, and every
/// request still ends at its traced length (through `replay_output_tokens`).
#[tokio::test]
async fn a_capped_live_replay_ends_each_request_at_its_traced_length() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let mut runs = Vec::new();
    for cap in [false, true] {
        let json = dir.path().join(format!("replay-{cap}.json"));
        let json_arg = json.display().to_string();
        let mut args = vec![
            "replay",
            "--workload",
            "humaneval",
            "--requests",
            "12",
            "--arrivals",
            "closed:4",
            "--router-grpc",
            cluster.grpc_addr(),
            "--json",
            &json_arg,
        ];
        if cap {
            args.push("--max-tokens-cap");
        }
        let out = dolphinctl(&args).await?;
        anyhow::ensure!(out.status.success(), "replay failed: {}", text(&out));
        let v: Value = serde_json::from_slice(&std::fs::read(&json)?)?;
        check_report(&v, 12)?;
        // Recorded when set.
        let recorded = v["config"]["max_tokens_cap"].as_bool().unwrap_or(false);
        assert_eq!(recorded, cap, "{}", v["config"]);
        runs.push(v);
    }
    let tokens = |v: &Value| -> Vec<u64> {
        v["outcomes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| o["output_tokens"].as_u64().unwrap_or(0))
            .collect()
    };
    assert_eq!(tokens(&runs[0]), tokens(&runs[1]), "the traced lengths");
    cluster.passed();
    Ok(())
}

#[tokio::test]
async fn replays_on_the_simulator() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("sim.json");
    let out = dolphinctl(&[
        "replay",
        "--workload",
        "humaneval",
        "--requests",
        "40",
        "--arrivals",
        "closed:4",
        "--target",
        "sim",
        "--split",
        "1p1d",
        "--sim-profile",
        "dynamo-mocker",
        "--policy",
        "always-remote",
        "--json",
        &json.display().to_string(),
    ])
    .await?;
    anyhow::ensure!(out.status.success(), "sim replay failed: {}", text(&out));
    let v: Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    check_report(&v, 40)?;
    assert_eq!(v["config"]["split"], "1p1d");
    assert_eq!(v["summary"]["remote"], 40);
    Ok(())
}

#[tokio::test]
async fn no_router_and_bad_arguments_fail_clearly() -> anyhow::Result<()> {
    // Bind then drop a listener to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("127.0.0.1:{port}");
    let out = dolphinctl(&[
        "replay",
        "--workload",
        "humaneval",
        "--requests",
        "5",
        "--router-grpc",
        &url,
    ])
    .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.contains(&format!("cannot connect to the router at http://{url}")),
        "{}",
        text(&out)
    );

    let out = dolphinctl(&["replay", "--workload", "humaneval", "--target", "sim"]).await?;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs --split"),
        "{}",
        text(&out)
    );
    let out = dolphinctl(&["replay", "--workload", "humaneval", "--slo-ttft", "5"]).await?;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no unit"),
        "{}",
        text(&out)
    );
    Ok(())
}

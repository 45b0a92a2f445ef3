//! The official OpenAI and Anthropic Python SDKs against the router's HTTP API, on SmolLM2
//! through the real processes (router, prefill and decode worker on the candle engine):
//! `tests/sdk/check_sdks.py` runs its checks (completions, chat with streaming, usage, `n`,
//! seeds, stops, log probabilities, structured output and tool calls; the error shapes; the
//! Responses API stored and continued; Anthropic's Messages API; SGLang's `/generate` read as
//! its benchmark client reads it) and fails on the first shape the clients do not parse as
//! their API's.
//!
//! Skipped with a notice when the model is absent or the SDKs are not installed
//! (`scripts/install-sdks.sh`), unless `DOLPHIN_REQUIRE_MODEL` / `DOLPHIN_REQUIRE_SDK` is set
//! (CI): then that absence fails.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use dolphin_tests::{ClusterConfig, TestCluster};
use dolphin_tokenizer::{SMOLLM2_FILE, model_or_skip};

/// Set to 1 to make missing SDKs a failure.
const REQUIRE_ENV: &str = "DOLPHIN_REQUIRE_SDK";
/// Where scripts/install-sdks.sh puts them unless told otherwise.
const VENV_ENV: &str = "DOLPHIN_SDK_VENV";
/// The whole script: about 40 short requests, mostly greedy, on two shared cores in a debug
/// build.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

/// The venv's python, or `None` (skip) when it is absent and not required.
fn sdk_python() -> Option<PathBuf> {
    let venv = std::env::var_os(VENV_ENV).map(PathBuf::from).or_else(|| {
        std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/dolphin/sdk-venv"))
    })?;
    let python = venv.join("bin/python");
    if python.exists() {
        return Some(python);
    }
    let msg = format!(
        "no SDK venv at {} (run scripts/install-sdks.sh)",
        venv.display()
    );
    if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
        panic!("{REQUIRE_ENV}=1 but {msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

#[tokio::test]
async fn the_openai_and_anthropic_sdks_parse_every_answer() -> anyhow::Result<()> {
    let Some(model) = model_or_skip(SMOLLM2_FILE) else {
        return Ok(());
    };
    let Some(python) = sdk_python() else {
        return Ok(());
    };
    let path = model.display().to_string();
    let cluster = TestCluster::start(ClusterConfig {
        engine_args: Some(ClusterConfig::candle_engine(&path, "128MiB", &[])),
        router_args: [
            "--tokenizer",
            "gguf",
            "--model-path",
            &path,
            "--responses-store",
            "64",
        ]
        .map(str::to_owned)
        .to_vec(),
        ..ClusterConfig::default()
    })
    .await?;

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_sdks.py");
    let base = format!("http://{}", cluster.http_addr());
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&base)
        .arg("--responses-store")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, run)
        .await
        .context("the SDK checks did not finish")??;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({}):\n{report}\nrouter log:\n{}",
        script.display(),
        out.status,
        cluster.logs()
    );
    cluster.passed();
    Ok(())
}

//! The `dolphin-router` binary: exit 64 on bad configuration, one `DOLPHIN_READY` line after
//! binding, graceful exit 0 on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_dolphin-router");

/// Kills the router if the test fails before it exits.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn bad_configuration_exits_64() {
    for args in [
        &["--policy", "sometimes"][..],
        &[][..],
        &["--decode", "a:1", "--max-local-ratio", "3"][..],
        &[
            "--decode",
            "a:1",
            "--api-key-file",
            "/nonexistent/dolphin-keys",
        ][..],
        &["--decode", "a:1", "--admin-key-file", "/dev/null"][..],
    ] {
        let status = Command::new(BIN)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run");
        assert_eq!(status.code(), Some(64), "{args:?}");
    }
}

#[test]
fn prints_ready_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workers = dir.path().join("workers.json");
    std::fs::write(&workers, r#"{"workers": []}"#).expect("write");
    let child = Command::new(BIN)
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--static-workers",
        ])
        .arg(&workers)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut child = Reap(child);
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let json = line
        .trim()
        .strip_prefix("DOLPHIN_READY ")
        .unwrap_or_else(|| panic!("not a ready line: {line:?}"));
    let ready: serde_json::Value = serde_json::from_str(json).expect("json");
    assert_eq!(ready["role"], "router");
    assert!(
        ready["grpc_addr"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:"))
    );
    assert!(ready["admin_addr"].as_str().is_some(), "{ready}");
    let ops = ready["metrics_addr"].as_str().expect("metrics_addr");

    let mut conn = TcpStream::connect(ops).expect("connect");
    write!(
        conn,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut resp = String::new();
    conn.read_to_string(&mut resp).expect("read");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains(r#""decode_workers":0"#), "{resp}");

    let pid = child.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let status = child.0.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
}

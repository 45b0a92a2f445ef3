//! Starting the release binaries for a benchmark and killing them again.
//!
//! Every Dolphin process prints one `DOLPHIN_READY {json}` line on stdout once its ports are
//! bound (docs/dev/contracts.md). [`spawn_ready`] starts a binary, waits for that line, and
//! returns a [`ChildProcess`] that SIGKILLs the process when dropped, so a benchmark that fails
//! or panics leaves nothing running. Where `setpriv` exists the child also gets
//! `PDEATHSIG=KILL`, which covers the benchmark itself being killed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::BenchError;

const READY_PREFIX: &str = "DOLPHIN_READY ";
const SETPRIV: &str = "/usr/bin/setpriv";

/// Owned copies of `args`, for a command line.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A router's four listeners on free loopback ports (the READY line says which): public HTTP
/// and gRPC, admin, metrics.
pub fn router_listener_args() -> Vec<String> {
    [
        "--http-addr",
        "--grpc-addr",
        "--admin-addr",
        "--metrics-addr",
    ]
    .into_iter()
    .flat_map(|flag| [flag.to_owned(), "127.0.0.1:0".to_owned()])
    .collect()
}

/// Path of a release binary built beside the running benchmark (`target/release/<name>`).
pub fn sibling_binary(name: &str) -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe().map_err(BenchError::io("locate the benchmark binary"))?;
    let path = exe
        .parent()
        .map(|dir| dir.join(name))
        .unwrap_or_else(|| PathBuf::from(name));
    if path.is_file() {
        Ok(path)
    } else {
        Err(BenchError::MissingBinary(path))
    }
}

/// A started process; SIGKILLed and reaped on drop.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: std::process::Child,
    ready: serde_json::Value,
    log: PathBuf,
}

impl ChildProcess {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The JSON object of its `DOLPHIN_READY` line.
    pub fn ready(&self) -> &serde_json::Value {
        &self.ready
    }

    /// A string field of the ready line (e.g. `grpc_addr`).
    pub fn ready_field(&self, key: &str) -> Result<&str, BenchError> {
        self.ready[key].as_str().ok_or_else(|| BenchError::Parse {
            what: format!("{} ready line", self.name),
            detail: format!("no string field {key:?} in {}", self.ready),
        })
    }

    /// Where its stderr goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Stops the process gently: SIGTERM (Dolphin processes drain and exit), SIGKILL if it is
    /// still running after `grace`. Returns whether it exited on its own.
    pub fn stop(mut self, grace: Duration) -> bool {
        let Some(pid) = i32::try_from(self.pid()).ok().and_then(Pid::from_raw) else {
            return false;
        };
        if rustix::process::kill_process(pid, Signal::TERM).is_err() {
            return false;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => return false,
            }
        }
        false // the drop kills it
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // Already gone is fine; anything else has no one to report to during a drop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `bin` as a command that dies with the benchmark (`PDEATHSIG=KILL` through `setpriv`, where
/// it exists).
fn command(bin: &Path) -> Command {
    if Path::new(SETPRIV).is_file() {
        let mut c = Command::new(SETPRIV);
        c.arg("--pdeathsig").arg("KILL").arg("--").arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

/// Starts `bin args...` (with `envs` added to the environment) with stderr to
/// `log_dir/<name>.log` and waits up to `timeout` for its `DOLPHIN_READY` line.
pub fn spawn_ready(
    name: &str,
    bin: &Path,
    args: &[String],
    envs: &[(String, String)],
    log_dir: &Path,
    timeout: Duration,
) -> Result<ChildProcess, BenchError> {
    std::fs::create_dir_all(log_dir)
        .map_err(BenchError::io(format!("create {}", log_dir.display())))?;
    let log = log_dir.join(format!("{name}.log"));
    let stderr =
        std::fs::File::create(&log).map_err(BenchError::io(format!("create {}", log.display())))?;
    let mut cmd = command(bin);
    cmd.args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    let mut child = cmd
        .spawn()
        .map_err(BenchError::io(format!("start {}", bin.display())))?;
    let stdout = child.stdout.take();
    // Own the child from here on so every early return below kills it.
    let mut proc = ChildProcess {
        name: name.to_string(),
        child,
        ready: serde_json::Value::Null,
        log,
    };
    let stdout = stdout.ok_or_else(|| proc.not_ready("stdout was not captured"))?;
    let (tx, rx) = mpsc::channel();
    // The reader keeps draining stdout after the ready line so the child never blocks on it.
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(json) = line.strip_prefix(READY_PREFIX)
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(json.to_string());
            }
        }
    });
    let json = match rx.recv_timeout(timeout) {
        Ok(json) => json,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(proc.not_ready(&format!("no ready line within {timeout:?}")));
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let status = proc.child.wait().map(|s| s.to_string()).unwrap_or_default();
            return Err(proc.not_ready(&format!("closed stdout ({status})")));
        }
    };
    proc.ready = serde_json::from_str(&json).map_err(|e| BenchError::Parse {
        what: format!("{name} ready line"),
        detail: e.to_string(),
    })?;
    Ok(proc)
}

/// Starts a program that prints no ready line (a peer such as nginx or smg) with stdout and
/// stderr to `log_dir/<name>.log`; the caller checks readiness itself (e.g. over HTTP).
pub fn spawn_plain(
    name: &str,
    bin: &Path,
    args: &[String],
    log_dir: &Path,
) -> Result<ChildProcess, BenchError> {
    std::fs::create_dir_all(log_dir)
        .map_err(BenchError::io(format!("create {}", log_dir.display())))?;
    let log = log_dir.join(format!("{name}.log"));
    let out =
        std::fs::File::create(&log).map_err(BenchError::io(format!("create {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(BenchError::io(format!("open {}", log.display())))?;
    let mut cmd = command(bin);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    let child = cmd
        .spawn()
        .map_err(BenchError::io(format!("start {}", bin.display())))?;
    Ok(ChildProcess {
        name: name.to_string(),
        child,
        ready: serde_json::Value::Null,
        log,
    })
}

impl ChildProcess {
    /// Whether the process has exited: then the reason, with its log's tail.
    pub fn exited(&mut self) -> Option<BenchError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(self.not_ready(&format!("exited ({status})"))),
            _ => None,
        }
    }
}

impl ChildProcess {
    fn not_ready(&self, what: &str) -> BenchError {
        let tail = std::fs::read_to_string(&self.log)
            .map(|t| {
                let lines: Vec<&str> = t.lines().rev().take(5).collect();
                lines.into_iter().rev().collect::<Vec<_>>().join("\n")
            })
            .unwrap_or_default();
        BenchError::NotReady {
            name: self.name.clone(),
            detail: format!("{what}; log {}:\n{tail}", self.log.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_dir(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("dolphin-bench-{tag}-{}", std::process::id()))
    }

    #[test]
    fn reads_the_ready_line_and_stops_on_sigterm() {
        let dir = tmp_dir("proc-ok");
        let script = "echo starting >&2; echo hello; \
                      echo 'DOLPHIN_READY {\"role\":\"x\",\"grpc_addr\":\"127.0.0.1:1\"}'; \
                      exec sleep 600";
        let args = vec!["-c".to_string(), script.to_string()];
        let p = spawn_ready(
            "sh",
            Path::new("/bin/sh"),
            &args,
            &[],
            &dir,
            Duration::from_secs(20),
        )
        .expect("ready");
        assert_eq!(p.ready_field("grpc_addr").expect("field"), "127.0.0.1:1");
        assert!(p.ready_field("missing").is_err());
        let pid = p.pid();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        assert!(p.stop(Duration::from_secs(20)), "sleep ends on SIGTERM");
        // Reaped by stop: the pid no longer names our child (it may be reused, not as sh).
        let still_sleeping = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.contains("sleep"));
        assert!(!still_sleeping);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn drop_kills_a_process_that_ignores_sigterm() {
        let dir = tmp_dir("proc-kill");
        let script = "trap '' TERM; echo 'DOLPHIN_READY {}'; while :; do sleep 1; done";
        let args = vec!["-c".to_string(), script.to_string()];
        let p = spawn_ready(
            "sh",
            Path::new("/bin/sh"),
            &args,
            &[],
            &dir,
            Duration::from_secs(20),
        )
        .expect("ready");
        let pid = p.pid();
        assert!(!p.stop(Duration::from_millis(200)), "SIGTERM is ignored");
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!state.contains("(sh)"), "still running: {state}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn exit_before_ready_is_an_error_with_the_log() {
        let dir = tmp_dir("proc-fail");
        let args = vec![
            "-c".to_string(),
            "echo broken flag >&2; exit 64".to_string(),
        ];
        let err = spawn_ready(
            "sh",
            Path::new("/bin/sh"),
            &args,
            &[],
            &dir,
            Duration::from_secs(20),
        )
        .expect_err("not ready");
        let text = err.to_string();
        assert!(text.contains("broken flag"), "{text}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}

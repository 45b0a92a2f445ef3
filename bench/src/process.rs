//! Starting the release binaries for a benchmark and stopping them again, through dolphinctl's
//! supervisor ([`ManagedProcess`]): the one that `dolphinctl up` and the end-to-end tests use.
//!
//! Every Dolphin process prints one `DOLPHIN_READY {json}` line on stdout once its ports are
//! bound (docs/dev/contracts.md). [`spawn_ready`] starts a binary, waits for that line, and
//! returns a [`ChildProcess`]: the supervised process (its own process group, `PDEATHSIG=KILL`
//! where `setpriv` exists, output drained into `log_dir/<name>.log`, the group SIGKILLed on
//! drop, so a benchmark that fails or panics leaves nothing running) with what it announced.
//! Call these inside a multi-threaded Tokio runtime: the output is drained by tasks, and a
//! child whose pipe is not drained stops at its next log line.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dolphinctl::process::{ManagedProcess, ProcessSpec};
use dolphinctl::ready::ReadyInfo;
use rustix::process::Signal;

use crate::BenchError;

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

/// The cargo profile the running benchmark was built with: its directory's name
/// (`target/<profile>/`), which holds the binaries it starts.
pub fn build_profile() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The program to start for `bin` with `args` under `wrapper` (a command line split into
/// words, e.g. a profiler's; empty: none), and its arguments: the wrapper's words, then `bin`,
/// then `args`.
pub fn wrapped(wrapper: &[String], bin: PathBuf, args: Vec<String>) -> (PathBuf, Vec<String>) {
    match wrapper.split_first() {
        Some((program, rest)) => {
            let mut a = rest.to_vec();
            a.push(bin.display().to_string());
            a.extend(args);
            (PathBuf::from(program), a)
        }
        None => (bin, args),
    }
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

/// A supervised process and the ready line it printed.
#[derive(Debug)]
pub struct ChildProcess {
    process: ManagedProcess,
    ready: ReadyInfo,
}

impl ChildProcess {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// What its `DOLPHIN_READY` line announced (empty for [`spawn_plain`]).
    pub fn ready(&self) -> &ReadyInfo {
        &self.ready
    }

    /// Its public gRPC address.
    pub fn grpc_addr(&self) -> Result<&str, BenchError> {
        self.announced("grpc_addr", &self.ready.grpc_addr)
    }

    /// Its OpenAI-compatible HTTP address (routers).
    pub fn http_addr(&self) -> Result<&str, BenchError> {
        self.announced("http_addr", &self.ready.http_addr)
    }

    /// Its `RouterAdmin` address (routers).
    pub fn admin_addr(&self) -> Result<&str, BenchError> {
        self.announced("admin_addr", &self.ready.admin_addr)
    }

    /// Its Prometheus address.
    pub fn metrics_addr(&self) -> Result<&str, BenchError> {
        self.announced("metrics_addr", &self.ready.metrics_addr)
    }

    fn announced<'a>(&self, key: &str, value: &'a Option<String>) -> Result<&'a str, BenchError> {
        value.as_deref().ok_or_else(|| BenchError::Parse {
            what: format!("{} ready line", self.process.name()),
            detail: format!("no {key} in {:?}", self.ready),
        })
    }

    /// Where its stdout and stderr go.
    pub fn log(&self) -> Option<&Path> {
        self.process.log_path().map(PathBuf::as_path)
    }

    /// Stops the process gently: SIGTERM to its group (Dolphin processes drain and exit),
    /// SIGKILL if it is still running after `grace`. Returns whether it exited before the
    /// SIGKILL.
    pub async fn stop(mut self, grace: Duration) -> bool {
        let status = self.process.stop(grace).await;
        status.signal() != Some(Signal::KILL.as_raw())
    }

    /// Whether the process has exited: then the reason, with its output's tail.
    pub fn exited(&self) -> Option<BenchError> {
        let status = self.process.exit_status()?;
        Some(BenchError::NotReady {
            name: self.process.name().to_owned(),
            detail: format!(
                "exited ({status}); last output:\n{}",
                self.process.output_tail(5)
            ),
        })
    }
}

/// The supervisor's spec for `bin args...` with `envs` added, logging to `log_dir/<name>.log`
/// (a fresh file).
fn spec(
    name: &str,
    bin: &Path,
    args: &[String],
    envs: &[(String, String)],
    log_dir: &Path,
) -> Result<ProcessSpec, BenchError> {
    std::fs::create_dir_all(log_dir)
        .map_err(BenchError::io(format!("create {}", log_dir.display())))?;
    let log = log_dir.join(format!("{name}.log"));
    // The supervisor appends (for restarts); a benchmark's log starts empty.
    std::fs::File::create(&log).map_err(BenchError::io(format!("create {}", log.display())))?;
    let mut spec = ProcessSpec::new(name, bin).args(args);
    spec.envs
        .extend(envs.iter().map(|(k, v)| (k.into(), v.into())));
    spec.log_path = Some(log);
    Ok(spec)
}

/// Starts `bin args...` (with `envs` added to the environment), output to
/// `log_dir/<name>.log`, and waits up to `timeout` for its `DOLPHIN_READY` line.
pub async fn spawn_ready(
    name: &str,
    bin: &Path,
    args: &[String],
    envs: &[(String, String)],
    log_dir: &Path,
    timeout: Duration,
) -> Result<ChildProcess, BenchError> {
    let mut process = ManagedProcess::spawn(spec(name, bin, args, envs, log_dir)?)?;
    // On an error the process is dropped, which kills it.
    let ready = process.wait_ready(timeout).await?;
    Ok(ChildProcess { process, ready })
}

/// Starts a program that prints no ready line (a peer such as nginx or smg) with its output to
/// `log_dir/<name>.log`; the caller checks readiness itself (e.g. over HTTP).
pub fn spawn_plain(
    name: &str,
    bin: &Path,
    args: &[String],
    log_dir: &Path,
) -> Result<ChildProcess, BenchError> {
    let process = ManagedProcess::spawn(spec(name, bin, args, &[], log_dir)?)?;
    Ok(ChildProcess {
        process,
        ready: ReadyInfo::default(),
    })
}

#[cfg(test)]
mod tests {
    //! The supervisor itself is tested in dolphinctl (`ctl/src/process.rs`); these cover what
    //! the benchmarks add: the announced addresses, a fresh log, `stop`'s answer.
    use super::*;

    #[test]
    fn a_wrapper_runs_the_binary_with_its_arguments() {
        let (bin, args) = (PathBuf::from("/bin/router"), strings(&["--a", "1"]));
        assert_eq!(
            wrapped(&[], bin.clone(), args.clone()),
            (bin.clone(), args.clone())
        );
        let (program, a) = wrapped(&strings(&["perf", "record", "-g"]), bin, args);
        assert_eq!(program, PathBuf::from("perf"));
        assert_eq!(a, strings(&["record", "-g", "/bin/router", "--a", "1"]));
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["-c".to_string(), script.to_string()]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn reads_the_ready_line_and_stops_on_sigterm() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("sh.log"), "an earlier run\n").expect("old log");
        let script = "echo starting >&2; \
                      echo 'DOLPHIN_READY {\"role\":\"x\",\"grpc_addr\":\"127.0.0.1:1\"}'; \
                      exec sleep 600";
        let envs = [("DOLPHIN_BENCH_TEST".to_string(), "1".to_string())];
        let p = spawn_ready(
            "sh",
            Path::new("/bin/sh"),
            &sh(script),
            &envs,
            dir.path(),
            Duration::from_secs(20),
        )
        .await
        .expect("ready");
        assert_eq!(p.grpc_addr().expect("announced"), "127.0.0.1:1");
        let err = p.http_addr().expect_err("not announced").to_string();
        assert!(err.contains("http_addr"), "{err}");
        assert!(p.exited().is_none());
        let pid = p.pid();
        let log = p.log().expect("log").to_path_buf();
        assert!(
            p.stop(Duration::from_secs(20)).await,
            "sleep ends on SIGTERM"
        );
        // Reaped: the pid no longer names our child (it may be reused, not as sleep).
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!cmdline.contains("sleep"), "{cmdline}");
        let text = std::fs::read_to_string(log).expect("log");
        assert!(
            text.contains("starting") && !text.contains("earlier"),
            "{text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_process_that_ignores_sigterm_is_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script =
            "trap '' TERM; echo 'DOLPHIN_READY {\"role\":\"x\"}'; while :; do sleep 1; done";
        let p = spawn_ready(
            "sh",
            Path::new("/bin/sh"),
            &sh(script),
            &[],
            dir.path(),
            Duration::from_secs(20),
        )
        .await
        .expect("ready");
        assert!(
            !p.stop(Duration::from_millis(200)).await,
            "SIGTERM is ignored"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn exit_before_ready_is_an_error_with_the_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = spawn_ready(
            "sh",
            Path::new("/bin/sh"),
            &sh("echo broken flag >&2; exit 64"),
            &[],
            dir.path(),
            Duration::from_secs(20),
        )
        .await
        .expect_err("not ready");
        let text = err.to_string();
        assert!(text.contains("broken flag"), "{text}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_plain_process_reports_its_exit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = spawn_plain(
            "sh",
            Path::new("/bin/sh"),
            &sh("echo bye; exit 3"),
            dir.path(),
        )
        .expect("started");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let err = loop {
            if let Some(err) = p.exited() {
                break err.to_string();
            }
            assert!(std::time::Instant::now() < deadline, "never exited");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(err.contains("exit status: 3"), "{err}");
    }
}

//! One supervised child process: started in its own process group (and, where `setpriv` exists,
//! with a parent-death signal), its stdout and stderr drained into a log file and an in-memory
//! tail, its `DOLPHIN_READY` line caught, and a SIGTERM-then-SIGKILL stop. Dropping a
//! [`ManagedProcess`] whose child still runs kills the child's process group.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::CtlError;
use crate::pdeathsig;
use crate::ready::{ReadyInfo, ReadyParseError, parse_ready_line};

/// How to start a child.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    /// Name used in messages and errors ("decode-0", "router").
    pub name: String,
    /// The binary.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables.
    pub envs: Vec<(OsString, OsString)>,
    /// Where to append stdout and stderr lines; `None` keeps them in memory only.
    pub log_path: Option<PathBuf>,
    /// How many of the latest output lines to keep in memory (for error messages and test logs).
    pub tail_lines: usize,
    /// Wrap the child in `setpriv --pdeathsig KILL` when available (see [`crate::pdeathsig`]).
    pub parent_death_signal: bool,
}

impl ProcessSpec {
    /// A spec with no arguments, `NO_COLOR=1`, no log file, a 200-line tail and the
    /// parent-death signal on.
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            // Output goes to pipes and log files, not a terminal: no ANSI colour codes.
            envs: vec![("NO_COLOR".into(), "1".into())],
            log_path: None,
            tail_lines: 200,
            parent_death_signal: true,
        }
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
}

/// Where a child's output goes: a bounded tail in memory and, optionally, a log file.
#[derive(Debug)]
struct OutputSink {
    tail: VecDeque<String>,
    cap: usize,
    file: Option<File>,
}

impl OutputSink {
    fn push(&mut self, line: String) {
        if let Some(file) = &mut self.file {
            // A full disk must not take the cluster down: the tail still has the line.
            let _ = writeln!(file, "{line}");
        }
        if self.cap == 0 {
            return;
        }
        if self.tail.len() == self.cap {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }
}

type ReadyResult = Result<ReadyInfo, ReadyParseError>;

/// A running (or exited) child under supervision.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    pid: Pid,
    log_path: Option<PathBuf>,
    exit: watch::Receiver<Option<ExitStatus>>,
    ready: Option<oneshot::Receiver<ReadyResult>>,
    sink: Arc<Mutex<OutputSink>>,
    readers: Vec<JoinHandle<()>>,
}

impl ManagedProcess {
    /// Starts the child. Must be called inside a Tokio runtime, from a thread that outlives the
    /// child (the parent-death signal follows the spawning thread).
    pub fn spawn(spec: ProcessSpec) -> Result<Self, CtlError> {
        let file = match &spec.log_path {
            // Appended: a restarted child's lines follow those of the one before.
            Some(path) => Some(
                File::options()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| CtlError::Log {
                        path: path.clone(),
                        source,
                    })?,
            ),
            None => None,
        };
        let mut cmd = match pdeathsig::setpriv_path().filter(|_| spec.parent_death_signal) {
            Some(setpriv) => {
                let mut cmd = tokio::process::Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(&spec.program);
                cmd
            }
            None => tokio::process::Command::new(&spec.program),
        };
        cmd.args(&spec.args)
            .envs(spec.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group: a terminal's Ctrl-C reaches only dolphinctl, which then stops
            // the children in order; and one signal to the group reaches anything a child forks.
            .process_group(0)
            // Last resort if the supervisor task is dropped without a stop.
            .kill_on_drop(true);
        let spawn_err = |source| CtlError::Spawn {
            name: spec.name.clone(),
            program: spec.program.clone(),
            source,
        };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let raw_pid = child.id().and_then(|id| i32::try_from(id).ok());
        let pid = raw_pid.and_then(Pid::from_raw).ok_or_else(|| {
            spawn_err(std::io::Error::other("child has no pid right after spawn"))
        })?;

        let sink = Arc::new(Mutex::new(OutputSink {
            tail: VecDeque::new(),
            cap: spec.tail_lines,
            file,
        }));
        let (ready_tx, ready_rx) = oneshot::channel();
        let mut readers = Vec::with_capacity(2);
        if let Some(stdout) = child.stdout.take() {
            readers.push(tokio::spawn(drain(stdout, sink.clone(), Some(ready_tx))));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(tokio::spawn(drain(stderr, sink.clone(), None)));
        }

        let (exit_tx, exit_rx) = watch::channel(None);
        let name = spec.name.clone();
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status,
                Err(err) => {
                    // Practically impossible (the child is ours); report it as exit code 255.
                    tracing::error!(process = %name, error = %err, "waiting for child failed");
                    ExitStatus::from_raw(255 << 8)
                }
            };
            let _ = exit_tx.send(Some(status));
        });

        Ok(Self {
            name: spec.name,
            pid,
            log_path: spec.log_path,
            exit: exit_rx,
            ready: Some(ready_rx),
            sink,
            readers,
        })
    }

    /// The name given in the spec.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid.as_raw_nonzero().get().unsigned_abs()
    }

    /// The log file, when there is one.
    pub fn log_path(&self) -> Option<&PathBuf> {
        self.log_path.as_ref()
    }

    /// How the child ended, or `None` while it runs.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Waits for the child's `DOLPHIN_READY` line. Fails if the child exits first, if `timeout`
    /// passes, or if called a second time (the line is consumed).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<ReadyInfo, CtlError> {
        let Some(mut ready) = self.ready.take() else {
            return Err(CtlError::ReadyTaken {
                name: self.name.clone(),
            });
        };
        let mut exit = self.exit.clone();
        let outcome = tokio::time::timeout(timeout, async {
            tokio::select! {
                // Prefer the line if both are ready: a process may print it and exit at once.
                biased;
                res = &mut ready => Some(res),
                _ = exit.wait_for(Option::is_some) => None,
            }
        })
        .await;
        match outcome {
            Ok(Some(Ok(Ok(info)))) => Ok(info),
            Ok(Some(Ok(Err(source)))) => Err(CtlError::ReadyParse {
                name: self.name.clone(),
                source,
            }),
            // The child exited, or closed its stdout without the line (then it should exit
            // soon; if it does not, it is as good as never ready).
            Ok(Some(Err(_))) | Ok(None) => match tokio::time::timeout(timeout, self.wait()).await {
                Ok(status) => {
                    self.drain_output().await;
                    Err(CtlError::ExitedBeforeReady {
                        name: self.name.clone(),
                        status,
                        tail: self.output_tail(40),
                    })
                }
                Err(_) => Err(CtlError::ReadyTimeout {
                    name: self.name.clone(),
                    timeout,
                    tail: self.output_tail(40),
                }),
            },
            Err(_) => Err(CtlError::ReadyTimeout {
                name: self.name.clone(),
                timeout,
                tail: self.output_tail(40),
            }),
        }
    }

    /// Waits until the child exits.
    pub async fn wait(&mut self) -> ExitStatus {
        self.exited().await
    }

    /// A future that resolves when the child exits, independent of `self` (to watch many
    /// children at once).
    pub fn exited(&self) -> impl Future<Output = ExitStatus> + Send + 'static {
        let mut exit = self.exit.clone();
        async move {
            let status = exit.wait_for(Option::is_some).await.map(|s| *s);
            // The waiter task is gone only if the runtime is shutting down.
            status
                .ok()
                .flatten()
                .unwrap_or_else(|| ExitStatus::from_raw(255 << 8))
        }
    }

    /// Lets the output readers catch the last lines after an exit (bounded: a grandchild may
    /// still hold the pipes open).
    pub async fn drain_output(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
        }
    }

    /// Sends `sig` to the child's process group. A group that is already gone is not an error.
    pub fn signal(&self, sig: Signal) -> std::io::Result<()> {
        if self.exit_status().is_some() {
            return Ok(());
        }
        match rustix::process::kill_process_group(self.pid, sig) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Stops the child: SIGTERM to its group, then SIGKILL if it has not exited after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> ExitStatus {
        if let Some(status) = self.exit_status() {
            return status;
        }
        if let Err(err) = self.signal(Signal::TERM) {
            tracing::warn!(process = %self.name, error = %err, "SIGTERM failed");
        }
        if let Ok(status) = tokio::time::timeout(grace, self.wait()).await {
            return status;
        }
        tracing::warn!(process = %self.name, ?grace, "did not stop in time; sending SIGKILL");
        if let Err(err) = self.signal(Signal::KILL) {
            tracing::warn!(process = %self.name, error = %err, "SIGKILL failed");
        }
        self.wait().await
    }

    /// The last `n` retained output lines, joined with newlines.
    pub fn output_tail(&self, n: usize) -> String {
        let sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        let skip = sink.tail.len().saturating_sub(n);
        sink.tail
            .iter()
            .skip(skip)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every retained output line (up to the spec's `tail_lines`).
    pub fn output(&self) -> Vec<String> {
        let sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        sink.tail.iter().cloned().collect()
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        // Never leave a child behind: a supervisor that returns early (an error, a panic in a
        // test) still takes its children down.
        if self.exit_status().is_none() {
            let _ = rustix::process::kill_process_group(self.pid, Signal::KILL);
        }
    }
}

/// Reads `stream` line by line until EOF into `sink`; the first readiness line (or parse error)
/// goes to `ready`.
async fn drain(
    stream: impl AsyncRead + Unpin,
    sink: Arc<Mutex<OutputSink>>,
    mut ready: Option<oneshot::Sender<ReadyResult>>,
) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf)
            .trim_end_matches(['\n', '\r'])
            .to_owned();
        if ready.is_some() {
            match parse_ready_line(&line) {
                Ok(None) => {}
                Ok(Some(info)) => send_ready(&mut ready, Ok(info)),
                Err(err) => send_ready(&mut ready, Err(err)),
            }
        }
        sink.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }
}

fn send_ready(ready: &mut Option<oneshot::Sender<ReadyResult>>, value: ReadyResult) {
    if let Some(tx) = ready.take() {
        let _ = tx.send(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(name: &str, script: &str) -> ProcessSpec {
        ProcessSpec::new(name, "/bin/sh").args(["-c", script])
    }

    #[tokio::test]
    async fn catches_the_ready_line_and_keeps_output() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh(
            "echoer",
            "echo starting; echo oops >&2; echo 'DOLPHIN_READY {\"role\":\"decode\",\"grpc_addr\":\"127.0.0.1:1\"}'; echo after",
        );
        spec.log_path = Some(dir.path().join("echoer.log"));
        let mut p = ManagedProcess::spawn(spec).unwrap();
        let info = p.wait_ready(Duration::from_secs(30)).await.unwrap();
        assert_eq!(info.role, "decode");
        assert_eq!(info.grpc_addr.as_deref(), Some("127.0.0.1:1"));
        assert!(p.wait().await.success());
        p.drain_output().await;
        let out = p.output();
        assert!(out.contains(&"starting".to_owned()), "{out:?}");
        assert!(out.contains(&"oops".to_owned()), "{out:?}");
        assert!(out.contains(&"after".to_owned()), "{out:?}");
        let log = std::fs::read_to_string(dir.path().join("echoer.log")).unwrap();
        assert!(log.contains("starting") && log.contains("oops") && log.contains("after"));
    }

    #[tokio::test]
    async fn exit_before_ready_reports_status_and_tail() {
        let mut p = ManagedProcess::spawn(sh("dier", "echo 'bad flag --x' >&2; exit 64")).unwrap();
        let err = p.wait_ready(Duration::from_secs(30)).await.unwrap_err();
        match err {
            CtlError::ExitedBeforeReady { status, tail, .. } => {
                assert_eq!(status.code(), Some(64));
                assert!(tail.contains("bad flag --x"), "{tail}");
            }
            other => panic!("unexpected error: {other}"),
        }
    }

    #[tokio::test]
    async fn closed_stdout_without_ready_is_reported_once_the_child_exits() {
        let mut p = ManagedProcess::spawn(sh("closer", "exec 1>&-; sleep 0.2; exit 3")).unwrap();
        let err = p.wait_ready(Duration::from_secs(30)).await.unwrap_err();
        assert!(
            matches!(err, CtlError::ExitedBeforeReady { status, .. } if status.code() == Some(3)),
            "{err}"
        );
        let again = p.wait_ready(Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(again, CtlError::ReadyTaken { .. }), "{again}");
    }

    #[tokio::test]
    async fn malformed_ready_line_is_an_error() {
        let mut p =
            ManagedProcess::spawn(sh("bad", "echo 'DOLPHIN_READY {nope'; sleep 30")).unwrap();
        let err = p.wait_ready(Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(err, CtlError::ReadyParse { .. }), "{err}");
    }

    #[tokio::test]
    async fn stop_escalates_to_sigkill_when_sigterm_is_ignored() {
        let mut p = ManagedProcess::spawn(sh(
            "stubborn",
            "trap '' TERM; echo 'DOLPHIN_READY {\"role\":\"x\"}'; while true; do sleep 1; done",
        ))
        .unwrap();
        p.wait_ready(Duration::from_secs(30)).await.unwrap();
        let status = p.stop(Duration::from_millis(300)).await;
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }

    #[tokio::test]
    async fn stop_uses_sigterm_first() {
        let mut p = ManagedProcess::spawn(sh(
            "polite",
            "echo 'DOLPHIN_READY {\"role\":\"x\"}'; exec sleep 60",
        ))
        .unwrap();
        p.wait_ready(Duration::from_secs(30)).await.unwrap();
        let status = p.stop(Duration::from_secs(60)).await;
        assert_eq!(status.signal(), Some(15), "{status:?}");
    }

    #[tokio::test]
    async fn drop_kills_a_running_child() {
        let p = ManagedProcess::spawn(sh("orphan", "exec sleep 60")).unwrap();
        let pid = Pid::from_raw(i32::try_from(p.pid()).unwrap()).unwrap();
        drop(p);
        // The child is killed and then reaped by tokio's orphan reaper; poll until it is gone.
        for _ in 0..600 {
            if rustix::process::test_kill_process(pid).is_err() || is_zombie(p_stat(pid)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("child {pid:?} survived its supervisor");
    }

    fn p_stat(pid: Pid) -> String {
        std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap_or_default()
    }

    fn is_zombie(stat: String) -> bool {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    }
}

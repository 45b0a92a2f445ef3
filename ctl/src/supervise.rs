//! Keeping a local cluster up: a child that dies is restarted with exponential backoff on the
//! addresses (and, with static discovery, the worker id) it had, so the router finds it again;
//! the others keep serving meanwhile. A stop signal ends supervision, and restarts in progress
//! are killed with it.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::error::CtlError;
use crate::process::{ManagedProcess, ProcessSpec};
use crate::ready::ReadyInfo;
use dolphin_cluster::signal::{StopSignal, StopSignals};

/// The first restart waits this long; each further one twice as long as the one before.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait between restarts.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A child that ran this long before dying starts the backoff over.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// One supervised process: how to start it again and what it is now.
#[derive(Debug)]
pub struct Supervised {
    /// "router", "prefill" or "decode".
    pub role: &'static str,
    /// How to start it again (arguments pinned to the addresses it announced).
    pub spec: ProcessSpec,
    /// The running (or dead) process.
    pub process: ManagedProcess,
    /// What it announced in its READY line.
    pub ready: ReadyInfo,
    started: Instant,
    failures: u32,
    generation: u64,
}

impl Supervised {
    /// A started process that announced `ready`.
    pub fn new(
        role: &'static str,
        spec: ProcessSpec,
        process: ManagedProcess,
        ready: ReadyInfo,
    ) -> Self {
        Self {
            role,
            spec,
            process,
            ready,
            started: Instant::now(),
            failures: 0,
            generation: 0,
        }
    }

    /// Pins the restart command line to what the process announced: a listener asked for on
    /// port 0 gets the port it bound, so peers and the router find the restarted process where
    /// the old one was; with `pin_id`, the worker id too (static discovery keys on it).
    pub fn pin_announced(&mut self, pin_id: bool) {
        let pins = [
            ("--grpc-addr", self.ready.grpc_addr.clone()),
            ("--kv-addr", self.ready.kv_addr.clone()),
            ("--http-addr", self.ready.http_addr.clone()),
            ("--admin-addr", self.ready.admin_addr.clone()),
            ("--metrics-addr", self.ready.metrics_addr.clone()),
        ];
        for (flag, value) in pins {
            if let Some(value) = value {
                set_flag(&mut self.spec.args, flag, &value);
            }
        }
        if let (true, Some(id)) = (pin_id, self.ready.id.clone()) {
            set_flag(&mut self.spec.args, "--worker-id", &id);
        }
    }

    /// How long to wait before the next restart, given how long the process ran.
    fn next_delay(&mut self) -> Duration {
        if self.started.elapsed() >= STABLE_AFTER {
            self.failures = 0;
        }
        let delay = BACKOFF_MIN
            .saturating_mul(1 << self.failures.min(5))
            .min(BACKOFF_MAX);
        self.failures += 1;
        delay
    }
}

/// Replaces the value after `flag` (`--flag VALUE` or `--flag=VALUE`), or appends the pair.
fn set_flag(args: &mut Vec<OsString>, flag: &str, value: &str) {
    let eq = format!("{flag}=");
    let mut i = 0;
    let mut found = false;
    while i < args.len() {
        let arg = args[i].to_string_lossy().into_owned();
        if arg == flag && i + 1 < args.len() {
            args[i + 1] = value.into();
            found = true;
            i += 2;
            continue;
        }
        if arg.starts_with(&eq) {
            args[i] = format!("{eq}{value}").into();
            found = true;
        }
        i += 1;
    }
    if !found {
        args.push(flag.into());
        args.push(value.into());
    }
}

type Restarted = (usize, Result<(ManagedProcess, ReadyInfo), CtlError>);

/// Supervises `members` until a stop signal, which it returns. Each unexpected exit is
/// reported with the child's last output and followed by a restart after a backoff; a restart
/// that fails (exits before READY, times out) is retried the same way.
pub async fn supervise(
    members: &mut [Supervised],
    signals: &mut StopSignals,
    ready_timeout: Duration,
) -> StopSignal {
    let (died_tx, mut died_rx) = mpsc::unbounded_channel::<(usize, u64, ExitStatus)>();
    let watch = |i: usize, m: &Supervised| {
        let exited = m.process.exited();
        let (tx, generation) = (died_tx.clone(), m.generation);
        tokio::spawn(async move {
            let status = exited.await;
            let _ = tx.send((i, generation, status));
        });
    };
    for (i, m) in members.iter().enumerate() {
        watch(i, m);
    }
    let mut restarts: JoinSet<Restarted> = JoinSet::new();
    let schedule = |restarts: &mut JoinSet<Restarted>, i: usize, m: &mut Supervised| {
        let delay = m.next_delay();
        eprintln!(
            "dolphinctl: restarting {} in {:.0?} (attempt {})",
            m.process.name(),
            delay,
            m.failures
        );
        let spec = m.spec.clone();
        restarts.spawn(async move {
            tokio::time::sleep(delay).await;
            let started = async {
                let mut process = ManagedProcess::spawn(spec)?;
                match process.wait_ready(ready_timeout).await {
                    Ok(ready) => Ok((process, ready)),
                    Err(err) => {
                        process.stop(Duration::from_secs(2)).await;
                        Err(err)
                    }
                }
            };
            (i, started.await)
        });
    };
    loop {
        tokio::select! {
            sig = signals.recv() => {
                // Dropping a restart in progress drops its ManagedProcess, which kills it.
                restarts.shutdown().await;
                return sig;
            }
            Some((i, generation, status)) = died_rx.recv() => {
                let m = &mut members[i];
                if generation != m.generation {
                    continue;
                }
                m.process.drain_output().await;
                eprintln!(
                    "dolphinctl: {} exited unexpectedly ({status}); the rest of the cluster keeps \
                     serving. Its last output:\n{}",
                    m.process.name(),
                    m.process.output_tail(20)
                );
                schedule(&mut restarts, i, m);
            }
            Some(done) = restarts.join_next() => {
                let Ok((i, result)) = done else { continue };
                let m = &mut members[i];
                match result {
                    Ok((process, ready)) => {
                        eprintln!(
                            "dolphinctl: {} restarted (pid {}, {})",
                            process.name(),
                            process.pid(),
                            ready.grpc_addr.as_deref().unwrap_or("no gRPC address"),
                        );
                        m.process = process;
                        m.ready = ready;
                        m.started = Instant::now();
                        m.generation += 1;
                        watch(i, m);
                    }
                    Err(err) => {
                        eprintln!("dolphinctl: restarting {} failed: {err}", m.process.name());
                        schedule(&mut restarts, i, m);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn set_flag_replaces_both_spellings_or_appends() {
        let mut args: Vec<OsString> = ["--grpc-addr", "127.0.0.1:0", "--kv-addr=127.0.0.1:0"]
            .iter()
            .map(OsString::from)
            .collect();
        set_flag(&mut args, "--grpc-addr", "127.0.0.1:7000");
        set_flag(&mut args, "--kv-addr", "127.0.0.1:7001");
        set_flag(&mut args, "--worker-id", "decode-0");
        assert_eq!(
            strings(&args),
            [
                "--grpc-addr",
                "127.0.0.1:7000",
                "--kv-addr=127.0.0.1:7001",
                "--worker-id",
                "decode-0"
            ]
        );
    }

    #[tokio::test]
    async fn backoff_doubles_up_to_its_cap_and_resets_after_a_stable_run() {
        let spec = ProcessSpec::new("t", "/bin/true");
        let process = ManagedProcess::spawn(spec.clone()).expect("spawns");
        let mut m = Supervised::new("decode", spec, process, ReadyInfo::default());
        let delays: Vec<u64> = (0..8).map(|_| m.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        m.started = Instant::now() - STABLE_AFTER;
        assert_eq!(m.next_delay(), BACKOFF_MIN);
    }
}

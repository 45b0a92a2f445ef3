//! Closed-loop load: N clients, each sending its next request as soon as the previous one is
//! done, for a fixed time; per-request latency is recorded.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::BenchError;

/// One client connection that can send the benchmark's request.
pub trait Requester: Send + 'static {
    /// Sends one request and waits for the whole response (checking that it is well formed).
    fn call(&mut self) -> impl Future<Output = Result<(), BenchError>> + Send;
}

/// What one timed run produced.
#[derive(Debug, Default)]
pub struct RunResult {
    /// Requests that completed successfully.
    pub ok: u64,
    /// Requests that failed.
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// Latency of each successful request, in nanoseconds.
    pub latencies_ns: Vec<u64>,
    /// From the start until the last client finished its last request.
    pub elapsed: Duration,
}

impl RunResult {
    /// Successful requests per second.
    pub fn rps(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs every client in its own task for `duration` (each finishes the request it has in
/// flight at the deadline) and hands the clients back for the next run.
pub async fn run_for<R: Requester>(clients: Vec<R>, duration: Duration) -> (Vec<R>, RunResult) {
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut r = RunResult::default();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match client.call().await {
                        Ok(()) => {
                            r.latencies_ns.push(t.elapsed().as_nanos() as u64);
                            r.ok += 1;
                        }
                        Err(e) => {
                            r.errors += 1;
                            r.first_error.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
                (client, r)
            })
        })
        .collect();
    let mut clients = Vec::with_capacity(tasks.len());
    let mut total = RunResult::default();
    for task in tasks {
        match task.await {
            Ok((client, r)) => {
                clients.push(client);
                total.ok += r.ok;
                total.errors += r.errors;
                total.latencies_ns.extend(r.latencies_ns);
                if total.first_error.is_none() {
                    total.first_error = r.first_error;
                }
            }
            Err(e) => {
                total.errors += 1;
                total
                    .first_error
                    .get_or_insert_with(|| format!("client task: {e}"));
            }
        }
    }
    total.elapsed = start.elapsed();
    (clients, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter {
        calls: u32,
        fail_every: u32,
    }

    impl Requester for Counter {
        async fn call(&mut self) -> Result<(), BenchError> {
            self.calls += 1;
            tokio::task::yield_now().await;
            if self.calls.is_multiple_of(self.fail_every) {
                return Err(BenchError::Http("planned failure".into()));
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn counts_successes_and_failures_and_returns_clients() {
        let clients = (0..3)
            .map(|_| Counter {
                calls: 0,
                fail_every: 4,
            })
            .collect();
        let (clients, r) = run_for(clients, Duration::from_millis(30)).await;
        assert_eq!(clients.len(), 3);
        let calls: u64 = clients.iter().map(|c| u64::from(c.calls)).sum();
        assert_eq!(r.ok + r.errors, calls);
        assert_eq!(r.latencies_ns.len() as u64, r.ok);
        // Every fourth call of each client failed (how many calls fit in 30 ms is up to the
        // machine, so only the bookkeeping is checked).
        let failed: u64 = clients.iter().map(|c| u64::from(c.calls / 4)).sum();
        assert_eq!(r.errors, failed);
        if failed > 0 {
            assert_eq!(r.first_error.as_deref(), Some("HTTP: planned failure"));
        }
    }
}

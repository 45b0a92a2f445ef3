//! Polling with a generous bound: conditions are checked until true, and the bound only turns a
//! hang into a readable failure (never a timing assertion).

use std::future::Future;
use std::time::Duration;

/// The default bound for anything that should happen "soon" on a busy 2-core machine.
pub const GENEROUS: Duration = Duration::from_secs(60);

/// Calls `check` every 50 ms until it yields `Ok`, or fails after `limit` naming `what` and
/// the last observation (`check`'s latest `Err`, saying what it saw instead).
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut last;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(observed) => last = observed,
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("gave up after {limit:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

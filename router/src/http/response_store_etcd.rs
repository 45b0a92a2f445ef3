//! The Responses API's kept responses in the cluster's etcd (`--responses-etcd-ttl SECS`), so
//! that every router replica continues and reads what any of them kept: one key per response
//! under [`responses_prefix`](dolphin_cluster::responses_prefix), its JSON as the value,
//! attached to a lease that ends it after the TTL.
//!
//! Responses share leases: a lease is granted for the TTL plus a window (a tenth of the TTL,
//! from 1 to 60 s) and new responses attach to it until the window has passed, so a busy
//! router grants one lease a window rather than one a response, and each response lives from
//! the TTL to the TTL plus the window. A lease etcd no longer knows (it expired while the
//! router was away, or etcd's were lost) is replaced and the write retried once. A response
//! larger than etcd accepts in one request (`--max-request-bytes`, 1.5 MiB by default) is
//! not kept; the answer then says `store: false`.

use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions};

use super::response_store::{ResponseStoreError, Stored};

/// Longest wait for one etcd request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

async fn deadline<T>(
    op: &'static str,
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ResponseStoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => r.map_err(ResponseStoreError::Etcd),
        Err(_) => Err(ResponseStoreError::Timeout { op }),
    }
}

/// Kept responses in etcd.
pub struct EtcdResponses {
    client: Client,
    prefix: String,
    /// How long new responses attach to one lease.
    window: Duration,
    /// A lease's TTL in seconds: the responses' TTL plus the window.
    lease_secs: i64,
    /// The lease new responses attach to, and when it was granted.
    lease: tokio::sync::Mutex<Option<(i64, Instant)>>,
}

impl std::fmt::Debug for EtcdResponses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdResponses")
            .field("prefix", &self.prefix)
            .field("lease_secs", &self.lease_secs)
            .finish_non_exhaustive()
    }
}

impl EtcdResponses {
    /// Connects to the etcd of `cfg` (with discovery's timeouts, keep-alive and TLS), keeping
    /// each response for at least `ttl`.
    pub async fn connect(
        cfg: &dolphin_cluster::EtcdConfig,
        ttl: Duration,
    ) -> Result<Self, ResponseStoreError> {
        let options = cfg.connect_options()?;
        let client = deadline("connect", Client::connect(&cfg.endpoints, Some(options))).await?;
        let window = (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        Ok(Self {
            client,
            prefix: dolphin_cluster::responses_prefix(&cfg.cluster),
            window,
            lease_secs: (ttl + window).as_secs_f64().ceil() as i64,
            lease: tokio::sync::Mutex::new(None),
        })
    }

    fn key(&self, id: &str) -> String {
        format!("{}{id}", self.prefix)
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<Stored>, ResponseStoreError> {
        let got = deadline("get", self.client.clone().get(self.key(id), None)).await?;
        let Some(kv) = got.kvs().first() else {
            return Ok(None);
        };
        serde_json::from_slice(kv.value())
            .map(Some)
            .map_err(|source| ResponseStoreError::Corrupt {
                id: id.to_owned(),
                source,
            })
    }

    pub(crate) async fn put(&self, id: &str, stored: &Stored) -> Result<(), ResponseStoreError> {
        let value = serde_json::to_vec(stored).map_err(|source| ResponseStoreError::Corrupt {
            id: id.to_owned(),
            source,
        })?;
        let mut fresh = false;
        loop {
            let lease = self.lease(fresh).await?;
            let mut client = self.client.clone();
            let put = client.put(
                self.key(id),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            );
            match deadline("put", put).await {
                Err(ResponseStoreError::Etcd(e)) if !fresh && lease_gone(&e) => fresh = true,
                done => return done.map(drop),
            }
        }
    }

    pub(crate) async fn delete(&self, id: &str) -> Result<bool, ResponseStoreError> {
        let deleted = deadline("delete", self.client.clone().delete(self.key(id), None)).await?;
        Ok(deleted.deleted() > 0)
    }

    /// The lease to attach a response to: the current one while its window lasts (and
    /// `fresh` is not asked), else a new one. Callers wait for one grant rather than each
    /// granting their own.
    async fn lease(&self, fresh: bool) -> Result<i64, ResponseStoreError> {
        let mut held = self.lease.lock().await;
        if !fresh
            && let Some((id, at)) = *held
            && at.elapsed() < self.window
        {
            return Ok(id);
        }
        let granted = deadline(
            "grant lease",
            self.client.clone().lease_grant(self.lease_secs, None),
        )
        .await?;
        *held = Some((granted.id(), Instant::now()));
        Ok(granted.id())
    }
}

/// Whether etcd refused a write for its lease being unknown.
fn lease_gone(e: &etcd_client::Error) -> bool {
    e.to_string().contains("requested lease not found")
}

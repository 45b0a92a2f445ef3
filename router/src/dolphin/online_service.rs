//! The router's online learner at work (see [`super::online`]): finished requests arrive on a
//! bounded channel, one task credits them, and each change of a bit is published to the table
//! store (etcd with `--etcd`) as a new, activated table version with its evidence, as an
//! operator's `dolphinctl tables put` and `activate` would. A live split without a table gets
//! one seeded from the nearest split's.
//!
//! The request path only schedules exploration ([`ActiveExplorer`], read under a lock held to
//! clone an `Arc`) and hands its outcome to the channel with `try_send`: a full channel drops
//! the outcome (counted), never the request.
//!
//! Several routers learning from their own traffic each publish their own versions; the last
//! activation wins. Enable online learning on one router of a fleet.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::online::{self, Explorer, Neighbourhood, OnlineLearner, nearest_split, seed_table};
use super::routing::DolphinRouting;
use super::split::Split;
use super::store::{StoreError, TableStore};
use crate::metrics as m;
use crate::policy::{DecidedBy, Decision, Policy};

/// Outcomes waiting for the learner; beyond it they are dropped.
pub const QUEUE: usize = 8192;
/// How long a split that could not be seeded waits before the next try.
pub const SEED_RETRY: Duration = Duration::from_secs(30);

/// What the learner needs to know about a request it routed, set when the request was routed
/// under the `dolphin` policy with online learning on.
#[derive(Clone, Debug, PartialEq)]
pub struct LearnTicket {
    /// The live split.
    pub split: Split,
    /// The version of the split's table when the request was routed (`None`: none).
    pub version: Option<Arc<str>>,
}

/// A finished request, as the learner takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// How it was routed.
    pub ticket: LearnTicket,
    /// Its cluster.
    pub cluster: Option<u32>,
    /// The path decided.
    pub decision: Decision,
    /// Who decided it.
    pub decided_by: DecidedBy,
    /// The decode worker it finished on.
    pub decode_worker: Arc<str>,
    /// Unix time of its arrival and end, ms.
    pub arrived_ms: f64,
    /// See `arrived_ms`.
    pub done_ms: f64,
    /// Time to first token, ms (infinite: none came).
    pub ttft_ms: f64,
    /// Mean time per output token after the first, ms.
    pub tpot_ms: f64,
    /// Tokens generated.
    pub tokens: u32,
    /// It completed (a failed request never meets its SLO).
    pub ok: bool,
}

/// The explorer of the table the learner follows.
#[derive(Debug)]
pub struct ActiveExplorer {
    /// The split.
    pub split: Split,
    /// The table version it schedules for.
    pub version: Arc<str>,
    /// The schedule.
    pub explorer: Arc<Explorer>,
}

/// The request path's end of the channel.
#[derive(Clone, Debug)]
pub struct OnlineSink(mpsc::Sender<Finished>);

impl OnlineSink {
    /// A sink and the receiver [`OnlineService::run`] drains.
    pub fn channel() -> (OnlineSink, mpsc::Receiver<Finished>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (OnlineSink(tx), rx)
    }

    /// Hands a finished request to the learner (dropped, and counted, when it is behind).
    pub fn send(&self, f: Finished) {
        if self.0.try_send(f).is_err() {
            metrics::counter!(m::ONLINE_OUTCOMES_TOTAL, "decision" => "dropped", "met" => "")
                .increment(1);
        }
    }
}

/// Where the learner reads the policy and writes tables.
pub struct OnlineHost {
    /// The router's tables.
    pub routing: Arc<DolphinRouting>,
    /// The active policy (it can change at run time).
    pub policy: Box<dyn Fn() -> Policy + Send + Sync>,
    /// The table store (etcd or memory).
    pub store: Box<dyn Fn() -> Arc<dyn TableStore> + Send + Sync>,
}

impl std::fmt::Debug for OnlineHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnlineHost")
            .field("routing", &self.routing)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Learning {
    split: Split,
    version: Arc<str>,
    learner: OnlineLearner,
    explorer: Arc<Explorer>,
}

/// The learner task's state.
#[derive(Debug)]
pub struct OnlineService {
    host: OnlineHost,
    learning: Option<Learning>,
    neighbourhood: Neighbourhood<Arc<str>>,
    seeded: HashMap<Split, Instant>,
}

impl OnlineService {
    /// A service over `host`.
    pub fn new(host: OnlineHost) -> Self {
        OnlineService {
            host,
            learning: None,
            neighbourhood: Neighbourhood::default(),
            seeded: HashMap::new(),
        }
    }

    /// Credits outcomes until `shutdown` fires or every sink is gone.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Finished>, shutdown: CancellationToken) {
        loop {
            let f = tokio::select! {
                _ = shutdown.cancelled() => return,
                f = rx.recv() => f,
            };
            let Some(f) = f else { return };
            self.handle(f).await;
        }
    }

    /// Credits one finished request: follows the live table, seeds a split without one, and
    /// publishes a changed bit.
    pub async fn handle(&mut self, f: Finished) {
        let Policy::Dolphin(cfg) = (self.host.policy)() else {
            return;
        };
        if !cfg.online.enabled {
            return;
        }
        let split = f.ticket.split;
        let Some(loaded) = self.host.routing.table(split) else {
            self.seed(split).await;
            return;
        };
        // Publishing refreshes the router before it returns, so the loaded version is the
        // learner's own unless someone else changed it since.
        let follows = self
            .learning
            .as_ref()
            .is_some_and(|l| l.split == split && l.version == loaded.version);
        if !follows {
            // A new table (an operator's activation or rollback, a seed, another split's):
            // learn on it afresh.
            let learner = OnlineLearner::new(cfg.online, cfg.trust, loaded.table.table().clone());
            let explorer = Arc::new(Explorer::new(&cfg.online, loaded.table.k()));
            for c in 0..loaded.table.k() as u32 {
                explorer.set_share(c, learner.share(c));
            }
            self.host.routing.set_explorer(Some(ActiveExplorer {
                split,
                version: loaded.version.clone(),
                explorer: explorer.clone(),
            }));
            tracing::info!(%split, version = %loaded.version, "online learning on the live split's table");
            self.learning = Some(Learning {
                split,
                version: loaded.version.clone(),
                learner,
                explorer,
            });
        }
        let Some(l) = self.learning.as_mut() else {
            return;
        };
        let table = l.learner.table();
        let e2e_ms = f.done_ms - f.arrived_ms;
        let met = f.ok
            && online::met(
                table.slo,
                table.provenance.reward,
                f.ttft_ms,
                f.tpot_ms,
                e2e_ms,
                f.tokens,
            );
        let reward =
            self.neighbourhood
                .complete(f.decode_worker.clone(), f.arrived_ms, f.done_ms, met);
        let (Some(cluster), true, true) = (
            f.cluster,
            online::learns_from(f.decided_by),
            f.ticket.version.as_deref() == Some(&*l.version),
        ) else {
            return;
        };
        metrics::counter!(m::ONLINE_OUTCOMES_TOTAL,
            "decision" => f.decision.as_str(),
            "met" => if met { "true" } else { "false" })
        .increment(1);
        let flip = l.learner.observe(cluster, f.decision, reward);
        l.explorer.set_share(cluster, l.learner.share(cluster));
        let Some(flip) = flip else {
            return;
        };
        metrics::counter!(m::ONLINE_FLIPS_TOTAL,
            "split" => split.to_string(),
            "cluster" => m::cluster_label(Some(flip.cluster)),
            "to" => flip.to.as_str())
        .increment(1);
        tracing::info!(%split, cluster = flip.cluster, to = flip.to.as_str(), adopted = flip.adopted,
            gain = flip.gain, z = flip.z, "online learning changed a bit");
        let json = l.learner.table().to_json_pretty();
        match self.publish(split, &json).await {
            Ok(version) => {
                let version: Arc<str> = Arc::from(version);
                if let Some(l) = self.learning.as_mut() {
                    l.version = version.clone();
                    self.host.routing.set_explorer(Some(ActiveExplorer {
                        split,
                        version,
                        explorer: l.explorer.clone(),
                    }));
                }
            }
            Err(e) => {
                tracing::error!(%split, error = %e, "could not publish the online learner's table; it keeps learning and publishes at its next change");
            }
        }
    }

    /// Stores and activates `json` as `split`'s next version.
    async fn publish(&self, split: Split, json: &str) -> Result<String, StoreError> {
        let store = (self.host.store)();
        let result = async {
            let version = store.put(split, None, json).await?;
            store.activate(split, &version).await?;
            store.refresh().await?;
            Ok(version)
        }
        .await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!(m::ONLINE_PUBLISHED_TOTAL, "outcome" => outcome).increment(1);
        if let Ok(v) = &result {
            tracing::info!(%split, version = %v, store = store.kind(), "online learning published a table");
        }
        result
    }

    /// Gives `split` a table seeded from the nearest split's, unless tried recently.
    async fn seed(&mut self, split: Split) {
        if self
            .seeded
            .get(&split)
            .is_some_and(|t| t.elapsed() < SEED_RETRY)
        {
            return;
        }
        self.seeded.insert(split, Instant::now());
        let routing = &self.host.routing;
        let loaded = routing
            .status()
            .into_iter()
            .filter_map(|(s, st)| (!st.loaded.is_empty()).then_some(s));
        let Some(from) = nearest_split(split, loaded).and_then(|s| routing.table(s)) else {
            tracing::info!(%split, "no table for the live split and none to seed it from; the fallback routes");
            return;
        };
        let seed = seed_table(from.table.table(), split, &from.version);
        tracing::info!(%split, from = %from.split, version = %from.version, "seeding the live split's table from the nearest split's");
        if let Err(e) = self.publish(split, &seed.to_json_pretty()).await {
            tracing::error!(%split, error = %e, "could not store the seeded table; retrying later");
        }
    }
}

#[cfg(test)]
#[path = "online_service_tests.rs"]
mod tests;

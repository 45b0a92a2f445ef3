//! Measuring periods on the live cluster: each round stores the candidate bits as a new table
//! version, makes it active, waits until the router has loaded it for the live split, then
//! replays the next `period_requests` requests of the workload and reads every request's
//! cluster from the router's routing info. Afterwards, unless the learned table is activated,
//! the table active before learning is made active again ([`LiveTarget::restore`]).

use std::time::{Duration, Instant};

use dolphin_learn::measure::period_of;
use dolphin_learn::search::{Evaluator, Period};
use dolphin_proto::v1;
use dolphin_router::dolphin::RoutingTable;
use dolphin_workload::{Arrivals, RequestOutcome, Slo, Workload};
use tokio::runtime::Handle;

use super::{LearnArgs, LearnCmdError};
use crate::client::admin;
use crate::error::CtlError;
use crate::replay::{LiveConfig, replay_live};

/// How long the router may take to load a stored table.
const LOAD_TIMEOUT: Duration = Duration::from_secs(15);

/// The live cluster as a learning target.
#[derive(Debug)]
pub struct LiveTarget {
    /// The router and the replay bounds.
    pub cfg: LiveConfig,
    /// The router's admin URL.
    pub router_admin: String,
    /// The workload periods are cut from, in turn.
    pub workload: Workload,
    /// The arrivals of each period.
    pub arrivals: Arrivals,
    /// The SLO requests are judged against.
    pub slo: Slo,
    /// Requests per period.
    pub period_requests: usize,
    /// Where the next period starts in the workload.
    pub next: usize,
    /// Version names are `<prefix>-r<round>`.
    pub version_prefix: String,
    /// Rounds stored so far.
    pub stored: u32,
    /// The live split ("1p1d").
    pub split: String,
    /// The split's active version before learning, if any: learning activates each round's
    /// table, so [`LiveTarget::restore`] makes this one active again afterwards.
    pub active_before: Option<String>,
}

impl LiveTarget {
    /// Replays the next period under whatever the router decides now.
    pub async fn period(&mut self) -> Result<Vec<RequestOutcome>, LearnCmdError> {
        let n = self.workload.requests.len();
        let mut w = self.workload.clone();
        w.requests = (0..self.period_requests.min(n))
            .map(|i| self.workload.requests[(self.next + i) % n].clone())
            .collect();
        // Each period starts its own clock.
        let t0 = w.requests.first().map_or(0.0, |r| r.arrival_ms);
        for r in &mut w.requests {
            r.arrival_ms = (r.arrival_ms - t0).max(0.0);
        }
        w.requests
            .sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
        self.next = (self.next + self.period_requests) % n.max(1);
        let run = replay_live(&self.cfg, &w, self.arrivals, self.slo).await?;
        Ok(run.outcomes)
    }

    /// Stores `table` as a new version, activates it, and waits until the router has loaded it
    /// for the live split.
    pub async fn install(&mut self, table: &RoutingTable) -> Result<String, LearnCmdError> {
        let mut admin = admin(&self.router_admin).await?;
        self.stored += 1;
        let version = format!("{}-r{}", self.version_prefix, self.stored);
        let put = admin
            .put_table(v1::PutTableRequest {
                split: table.split.to_string(),
                version: version.clone(),
                json: table.to_json_pretty(),
                activate: true,
            })
            .await
            .map_err(|s| CtlError::rpc("PutTable", s))?
            .into_inner();
        let deadline = Instant::now() + LOAD_TIMEOUT;
        loop {
            let list = admin
                .list_tables(v1::ListTablesRequest {})
                .await
                .map_err(|s| CtlError::rpc("ListTables", s))?
                .into_inner();
            if list.live_split != put.split {
                return Err(LearnCmdError::Live(format!(
                    "the live cluster is {}, the table is for {}: learn for the live split",
                    list.live_split, put.split
                )));
            }
            if list.live_version == put.version {
                return Ok(put.version);
            }
            if let Some(s) = list.splits.iter().find(|s| s.split == put.split)
                && !s.refused.is_empty()
            {
                return Err(LearnCmdError::Live(format!(
                    "the router refused table {}: {}",
                    put.version, s.refused
                )));
            }
            if Instant::now() > deadline {
                return Err(LearnCmdError::Live(format!(
                    "the router did not load table {} within {LOAD_TIMEOUT:?}",
                    put.version
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// After learning without activating its result (or after a failure): makes the version
    /// that was active before learning active again, or, when there was none, says which
    /// round's table the router keeps. Nothing to do when no round was stored.
    pub async fn restore(&self) -> Result<(), LearnCmdError> {
        if self.stored == 0 {
            return Ok(());
        }
        let Some(version) = &self.active_before else {
            eprintln!(
                "the router keeps {}/{}-r{} (the last round's table) active: no table was active \
                 before learning; `dolphinctl tables activate` another",
                self.split, self.version_prefix, self.stored
            );
            return Ok(());
        };
        admin(&self.router_admin)
            .await?
            .activate_table(v1::ActivateTableRequest {
                split: self.split.clone(),
                version: version.clone(),
            })
            .await
            .map_err(|s| CtlError::rpc("ActivateTable", s))?;
        eprintln!(
            "re-activated {}/{version}, the table active before learning",
            self.split
        );
        Ok(())
    }

    /// Connects to the router of `args`, checks that it can learn there (the dolphin policy,
    /// the split of `args` live) and notes the split's active table.
    pub async fn connect(
        args: &LearnArgs,
        workload: &Workload,
        slo: Slo,
    ) -> Result<LiveTarget, LearnCmdError> {
        let mut client = admin(&args.router_admin).await?;
        let policy = client
            .get_policy(v1::GetPolicyRequest {})
            .await
            .map_err(|s| CtlError::rpc("GetPolicy", s))?
            .into_inner();
        if policy.name != "dolphin" {
            return Err(LearnCmdError::Live(format!(
                "the router's policy is {}; learning installs tables, which only the dolphin policy reads (start the router with --policy dolphin)",
                policy.name
            )));
        }
        let split = client
            .get_split(v1::GetSplitRequest {})
            .await
            .map_err(|s| CtlError::rpc("GetSplit", s))?
            .into_inner();
        if split.name != args.split.to_string() {
            return Err(LearnCmdError::Live(format!(
                "the live cluster is {}, not {}: learn for the live split",
                split.name, args.split
            )));
        }
        let tables = client
            .list_tables(v1::ListTablesRequest {})
            .await
            .map_err(|s| CtlError::rpc("ListTables", s))?
            .into_inner();
        let stored = tables.splits.iter().find(|s| s.split == split.name);
        let active_before = stored
            .filter(|s| !s.active.is_empty())
            .map(|s| s.active.clone());
        // Versions are immutable: a run started in the same second as an earlier one on
        // this split takes the next free prefix.
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let taken = |prefix: &str| {
            stored.is_some_and(|s| {
                s.versions
                    .iter()
                    .any(|v| v.starts_with(&format!("{prefix}-r")))
            })
        };
        let mut version_prefix = format!("learn-{stamp}");
        for n in 2.. {
            if !taken(&version_prefix) {
                break;
            }
            version_prefix = format!("learn-{stamp}-{n}");
        }
        Ok(LiveTarget {
            router_admin: args.router_admin.clone(),
            cfg: LiveConfig {
                router_grpc: args.router_grpc.clone(),
                model: None,
                vocab_size: None,
                max_in_flight: args.max_in_flight,
                progress: false,
                cap_max_tokens: args.max_tokens_cap,
            },
            workload: workload.clone(),
            arrivals: args.arrivals,
            slo,
            period_requests: args.period_requests as usize,
            next: 0,
            version_prefix,
            stored: 0,
            split: split.name,
            active_before,
        })
    }
}

/// Measures bits on the live cluster (see the module docs). Runs on a blocking thread of a
/// multi-threaded runtime: the search is synchronous, each period is async.
#[derive(Debug)]
pub struct LiveEvaluator<'a> {
    /// The target.
    pub target: &'a mut LiveTarget,
    /// The fitted table (its bits are replaced each period).
    pub table: RoutingTable,
    /// The runtime periods run on.
    pub handle: Handle,
}

impl Evaluator for LiveEvaluator<'_> {
    fn evaluate(&mut self, bits: &[u8]) -> Result<Period, dolphin_learn::LearnError> {
        let table = dolphin_learn::measure::under_measurement(&self.table, bits);
        let k = table.k;
        let target = &mut *self.target;
        let outcomes = self
            .handle
            .block_on(async {
                target.install(&table).await?;
                target.period().await
            })
            .map_err(|e| dolphin_learn::LearnError::Target(dolphin_cluster::error_chain(&e)))?;
        Ok(period_of(&outcomes, k, self.table.provenance.reward))
    }
}

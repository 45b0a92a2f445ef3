//! Replay on the cluster simulator (`dolphin-sim`): the router's routing code and the engines'
//! timing profiles, in this process, in simulated time.

use std::path::Path;

use dolphin_engine::SimProfile;
use dolphin_router::dolphin::{
    CompiledTable, OnlineConfig, OutputClassifier, RoutingTable, Split, TrustConfig,
};
use dolphin_router::policy::{DolphinConfig, Policy as RouterPolicy, ThresholdConfig};
use dolphin_sim::{SimCluster, SimClusterConfig, SimRequest};
use dolphin_workload::{Arrivals, Slo, Workload};

use super::{ReplayError, ReplayRun};
use crate::cli::Policy;

/// The profile `--target sim` uses without `--sim-profile`.
pub const DEFAULT_SIM_PROFILE: &str = "qwen72b-h20";
/// KV blocks per worker without `--total-blocks`: 1.6M tokens of 16-token blocks, about what
/// an 8-GPU H20 node holds for a 72B model after the weights.
pub const DEFAULT_TOTAL_BLOCKS: u32 = 100_000;

/// A simulated cluster to replay on.
#[derive(Clone, Debug)]
pub struct SimTargetConfig {
    /// Prefill and decode workers.
    pub split: Split,
    /// Every worker's timing.
    pub profile: SimProfile,
    /// The prefill policy (`Dolphin` decides by `table`).
    pub policy: RouterPolicy,
    /// A compiled routing table.
    pub table: Option<CompiledTable>,
    /// KV blocks per worker.
    pub total_blocks: u32,
    /// Seed of the simulator's tie-breaking.
    pub seed: u64,
    /// The router's output classifier (`None`: its prior, which reads `max_tokens`).
    pub classifier: Option<OutputClassifier>,
    /// The router sees each request's workload cap as `max_tokens`, not its output length.
    pub cap_max_tokens: bool,
    /// Tokens per engine step (`None`: the simulator's default, the sim engine's 2048); set it
    /// to model an engine run with another `--max-batched-tokens` (candle's is 256).
    pub max_batched_tokens: Option<u32>,
}

impl SimTargetConfig {
    /// Loads `profile` (a shipped name or a JSON file) and the table at `table` (compiled with
    /// the router's code), and maps `policy` to the router's policy with `threshold` and (for
    /// `dolphin`) its trust checks and online learning.
    pub fn load(
        split: Split,
        profile: &str,
        policy: Policy,
        threshold: ThresholdConfig,
        (trust, online): (TrustConfig, OnlineConfig),
        table: Option<&Path>,
        total_blocks: u32,
    ) -> Result<Self, ReplayError> {
        let profile = SimProfile::load(profile).map_err(|source| ReplayError::Profile {
            name: profile.to_owned(),
            source,
        })?;
        let table = table.map(load_table).transpose()?;
        let mut policy = router_policy(policy, threshold);
        if let RouterPolicy::Dolphin(cfg) = &mut policy {
            cfg.trust = trust;
            cfg.online = online;
        }
        Ok(SimTargetConfig {
            split,
            profile,
            policy,
            table,
            total_blocks,
            seed: 1,
            classifier: None,
            cap_max_tokens: false,
            max_batched_tokens: None,
        })
    }

    /// The split the table was learned for, if there is a table.
    pub fn table_split(&self) -> Option<Split> {
        self.table.as_ref().map(|t| t.table().split)
    }

    fn cluster_config(&self) -> SimClusterConfig {
        let mut cfg =
            SimClusterConfig::new(self.split.prefill, self.split.decode, self.profile.clone());
        cfg.total_blocks = self.total_blocks;
        if let Some(n) = self.max_batched_tokens {
            cfg.max_batched_tokens = n;
        }
        cfg.policy = self.policy;
        cfg.table = self.table.clone();
        if let Some(c) = &self.classifier {
            cfg.classifier = c.clone();
        }
        cfg.seed = self.seed;
        cfg
    }
}

/// The router's policy for a `--policy` value; `threshold` parameterizes the threshold rule
/// (and the `dolphin` policy's threshold fallback).
pub fn router_policy(policy: Policy, threshold: ThresholdConfig) -> RouterPolicy {
    match policy {
        Policy::AlwaysLocal => RouterPolicy::AlwaysLocal,
        Policy::AlwaysRemote => RouterPolicy::AlwaysRemote,
        Policy::Threshold => RouterPolicy::Threshold(threshold),
        Policy::Dolphin => RouterPolicy::Dolphin(DolphinConfig {
            threshold,
            ..DolphinConfig::default()
        }),
    }
}

/// Reads an output classifier file (`dolphinctl classifier train --out`).
pub fn load_classifier(path: &Path) -> Result<OutputClassifier, ReplayError> {
    let err = |detail: String| ReplayError::Classifier {
        path: path.to_path_buf(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    OutputClassifier::from_json(&text).map_err(|e| err(e.to_string()))
}

/// Reads, validates and compiles a routing table file.
pub fn load_table(path: &Path) -> Result<CompiledTable, ReplayError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReplayError::TableRead {
        path: path.to_path_buf(),
        source,
    })?;
    RoutingTable::from_json(&text)
        .and_then(CompiledTable::compile)
        .map_err(|source| ReplayError::Table {
            path: path.to_path_buf(),
            source,
        })
}

/// Replays `workload` under `arrivals` on a cold simulated cluster and judges every request
/// against `slo`. Closed-loop arrivals keep `concurrency` requests in flight; the others send
/// each request at its arrival time. Outcomes are in the workload's order after `arrivals` is
/// applied (the order the requests are sent in); nothing fails in the simulator, so
/// `failures` is empty.
pub fn replay_sim(
    cfg: &SimTargetConfig,
    workload: &Workload,
    arrivals: Arrivals,
    slo: Slo,
) -> Result<ReplayRun, ReplayError> {
    let mut w = workload.clone();
    arrivals.apply(&mut w);
    let mut cluster = SimCluster::new(cfg.cluster_config())?;
    let block_size = cluster.config().block_size;
    let mut requests = SimRequest::from_workload(&w, slo, block_size);
    if cfg.cap_max_tokens {
        requests.iter_mut().for_each(SimRequest::cap_max_tokens);
    }
    let started = std::time::Instant::now();
    let report = match arrivals.concurrency() {
        Some(c) => cluster.run_closed(&requests, c)?,
        None => cluster.run(&requests)?,
    };
    if let Some(o) = &report.online {
        eprintln!(
            "online learning: {} requests explored, {} bits changed",
            o.explored,
            o.flips.len()
        );
        for f in &o.flips {
            let how = if f.adopted { "adopted" } else { "to" };
            eprintln!(
                "  at {:.1} min: cluster {} {how} {} (+{:.3})",
                f.at_ms / 60_000.0,
                f.cluster,
                f.to.as_str(),
                f.gain
            );
        }
    }
    Ok(ReplayRun {
        outcomes: report.outcomes(),
        failures: Default::default(),
        wall_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_map_to_the_router_defaults() {
        assert_eq!(
            router_policy(Policy::AlwaysLocal, ThresholdConfig::default()),
            RouterPolicy::AlwaysLocal
        );
        assert_eq!(
            router_policy(Policy::Threshold, ThresholdConfig::default()),
            RouterPolicy::Threshold(ThresholdConfig::default())
        );
        let llm_d = ThresholdConfig {
            variant: dolphin_router::policy::ThresholdVariant::LlmD,
            ..ThresholdConfig::default()
        };
        assert_eq!(
            router_policy(Policy::Threshold, llm_d),
            RouterPolicy::Threshold(llm_d)
        );
        assert_eq!(
            router_policy(Policy::Dolphin, ThresholdConfig::default()).name(),
            "dolphin"
        );
    }

    #[test]
    fn table_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.json");
        let err = load_table(&missing).unwrap_err();
        assert!(matches!(err, ReplayError::TableRead { .. }));
        assert!(err.to_string().contains("none.json"), "{err}");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{\"schema_version\": 1}").unwrap();
        let err = load_table(&bad).unwrap_err();
        assert!(matches!(err, ReplayError::Table { .. }), "{err}");
    }
}

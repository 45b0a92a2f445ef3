//! Fitting a routing table from the request log: standardizer, clustering model, initial bits.
//!
//! The bits of a new table are a starting point for learning by measurement (DESIGN.md section
//! 1: per-cluster scans, then epsilon-greedy refinement): by default each cluster starts with
//! the decision the Dynamo 1.6 rule takes for most of its requests, so a fresh table routes
//! like the baseline until learning improves it.

use dolphin_router::dolphin::assign::CompiledTable;
use dolphin_router::dolphin::split::Split;
use dolphin_router::dolphin::table::{
    ClusterMethod, ClusterModel, FEATURE_NAMES, LoadRule, N_FEATURES, Provenance, Reward,
    RoutingTable, TABLE_SCHEMA_VERSION, TableSlo,
};
use dolphin_router::dolphin::trust::ClusterEvidence;
use dolphin_router::policy::{Decision, Policy, PoolState, ThresholdConfig};

use crate::error::LearnError;
use crate::kmeans::{self, KMeansConfig, Point};
use crate::log::LogRecord;
use crate::{gmm, stats};

/// How a new table's bits are set.
#[derive(Clone, Debug, PartialEq)]
pub enum InitBits {
    /// Each cluster takes the majority decision of the threshold rule over its requests.
    Threshold(ThresholdConfig),
    /// Every cluster local.
    Local,
    /// Every cluster remote.
    Remote,
    /// Given bits (K of them).
    Explicit(Vec<u8>),
}

/// What to fit.
#[derive(Clone, Debug)]
pub struct FitConfig {
    /// The split the table is for.
    pub split: Split,
    /// Clusters.
    pub k: usize,
    /// k-means or a Gaussian mixture.
    pub method: ClusterMethod,
    /// The SLOs the table is for.
    pub slo: TableSlo,
    /// Workload name for the provenance.
    pub workload: String,
    /// Initial bits.
    pub bits: InitBits,
    /// Random seed.
    pub seed: u64,
    /// Which features take part, in [`FEATURE_NAMES`] order (ablation "no output-length
    /// feature": `[true, true, true, false]`). A disabled feature cannot influence assignment:
    /// see [`stats::DISABLED_FEATURE_STD`]. At least one must be enabled.
    pub features: [bool; N_FEATURES],
    /// What counts as meeting the SLO while the table's bits are learned (recorded in its
    /// provenance, read by the evaluators).
    pub reward: Reward,
    /// The load rule the table's bits are learned under (`None`: the bits alone decide).
    pub load_rule: Option<LoadRule>,
}

/// A fitted table and how the requests fell into it.
#[derive(Clone, Debug)]
pub struct FitReport {
    /// The table (validated).
    pub table: RoutingTable,
    /// Requests used.
    pub samples: usize,
    /// Requests per cluster (assigned with the router's own code).
    pub cluster_sizes: Vec<usize>,
    /// Remote share of the threshold rule per cluster.
    pub threshold_remote_share: Vec<f64>,
}

/// Fits a table to the features of the logged requests.
pub fn fit_table(records: &[LogRecord], cfg: &FitConfig) -> Result<FitReport, LearnError> {
    if !cfg.features.iter().any(|f| *f) {
        return Err(LearnError::Invalid(
            "at least one feature must be enabled".into(),
        ));
    }
    let used: Vec<&LogRecord> = records.iter().filter(|r| r.features.isl > 0).collect();
    if used.len() < cfg.k.max(2) * 5 {
        return Err(LearnError::NotEnoughData(format!(
            "{} requests for {} clusters (need at least 5 per cluster)",
            used.len(),
            cfg.k
        )));
    }
    let raw: Vec<Point> = used
        .iter()
        .map(|r| CompiledTable::raw(&r.features))
        .collect();
    let standardizer = stats::fit_standardizer(&raw, &cfg.features);
    // Disabled features are exactly 0 here (the router's z is below 1e-297 for them), so the
    // model's coordinates for them are 0 and the fit does not depend on their values.
    let z: Vec<Point> = raw
        .iter()
        .map(|x| {
            let mut z = stats::standardize(&standardizer, x);
            for (zd, on) in z.iter_mut().zip(cfg.features) {
                if !on {
                    *zd = 0.0;
                }
            }
            z
        })
        .collect();
    let model = match cfg.method {
        ClusterMethod::Kmeans => {
            let m = kmeans::fit(
                &z,
                KMeansConfig {
                    seed: cfg.seed,
                    ..KMeansConfig::new(cfg.k)
                },
            )?;
            ClusterModel {
                centroids: Some(m.centroids.iter().map(|c| c.to_vec()).collect()),
                ..Default::default()
            }
        }
        ClusterMethod::Gmm => {
            let g = gmm::fit(&z, cfg.k, 300, cfg.seed)?;
            ClusterModel {
                weights: Some(g.weights),
                means: Some(g.means.iter().map(|c| c.to_vec()).collect()),
                variances: Some(g.variances.iter().map(|c| c.to_vec()).collect()),
                ..Default::default()
            }
        }
    };
    let mut table = RoutingTable {
        schema_version: TABLE_SCHEMA_VERSION,
        split: cfg.split,
        slo: cfg.slo,
        k: cfg.k,
        method: cfg.method,
        standardizer,
        model,
        bits: vec![0; cfg.k],
        evidence: Vec::new(),
        load_rule: cfg.load_rule,
        provenance: Provenance {
            workload: cfg.workload.clone(),
            date: stats::now_rfc3339(),
            rounds: 0,
            rewards: Vec::new(),
            reward: cfg.reward,
            notes: String::new(),
        },
    };
    // Assign with the router's code, so sizes and bits match what serving will do.
    let compiled = CompiledTable::compile(table.clone())?;
    let k = cfg.k;
    let (mut sizes, mut remote, mut met, mut judged) = (
        vec![0usize; k],
        vec![0usize; k],
        vec![0usize; k],
        vec![0usize; k],
    );
    let rule = match &cfg.bits {
        InitBits::Threshold(t) => Policy::Threshold(*t),
        _ => Policy::Threshold(ThresholdConfig::default()),
    };
    let idle = PoolState::IDLE;
    let mut ranges = vec![0.0f64; k];
    for r in &used {
        let (c, distance) = compiled.locate(&r.features);
        sizes[c] += 1;
        ranges[c] = ranges[c].max(distance);
        remote[c] += usize::from(rule.decide(&r.features, idle) == Decision::Remote);
        if let Some(ok) = r.slo_met {
            judged[c] += 1;
            met[c] += usize::from(ok);
        }
    }
    let share: Vec<f64> = (0..k)
        .map(|c| {
            if sizes[c] == 0 {
                0.0
            } else {
                remote[c] as f64 / sizes[c] as f64
            }
        })
        .collect();
    table.bits = match &cfg.bits {
        InitBits::Threshold(_) => share.iter().map(|s| u8::from(*s > 0.5)).collect(),
        InitBits::Local => vec![0; k],
        InitBits::Remote => vec![1; k],
        InitBits::Explicit(b) => b.clone(),
    };
    // The evidence a learned bit will carry: its training requests and range now, its reward
    // margin once learning has measured both paths. Bits an operator gives carry none (the
    // router takes them as given), nor do tables that are fitted and not learned
    // (`dolphinctl tables fit` drops it).
    table.evidence = match &cfg.bits {
        InitBits::Explicit(_) => Vec::new(),
        _ => sizes
            .iter()
            .zip(&ranges)
            .map(|(&n, &range)| ClusterEvidence {
                requests: n as u64,
                margin: None,
                range,
            })
            .collect(),
    };
    table.provenance.notes = match &cfg.bits {
        InitBits::Threshold(_) => {
            "initial bits: majority decision of the threshold rule per cluster".into()
        }
        InitBits::Local => "initial bits: all local".into(),
        InitBits::Remote => "initial bits: all remote".into(),
        InitBits::Explicit(_) => "bits given by the operator".into(),
    };
    let disabled: Vec<&str> = (0..N_FEATURES)
        .filter(|d| !cfg.features[*d])
        .map(|d| FEATURE_NAMES[d])
        .collect();
    if !disabled.is_empty() {
        table.provenance.notes.push_str(&format!(
            "; features disabled (mean 0, std {:e}): {}",
            stats::DISABLED_FEATURE_STD,
            disabled.join(", ")
        ));
    }
    if judged.iter().all(|j| *j > 0) {
        table.provenance.rewards = (0..k).map(|c| met[c] as f64 / judged[c] as f64).collect();
        table.provenance.notes.push_str(
            "; rewards: SLO attainment of the logged requests (under the logging policy)",
        );
    }
    table.validate()?;
    Ok(FitReport {
        table,
        samples: used.len(),
        cluster_sizes: sizes,
        threshold_remote_share: share,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic;

    fn cfg(method: ClusterMethod, bits: InitBits) -> FitConfig {
        FitConfig {
            split: Split::new(3, 1),
            k: 4,
            method,
            slo: TableSlo {
                ttft_ms: 5000.0,
                tpot_ms: 250.0,
            },
            workload: "synthetic".into(),
            bits,
            seed: 1,
            features: [true; N_FEATURES],
            reward: Reward::E2e,
            load_rule: None,
        }
    }

    #[test]
    fn fits_valid_tables_the_router_loads() {
        let log = synthetic::log(600, 5);
        for method in [ClusterMethod::Kmeans, ClusterMethod::Gmm] {
            let r = fit_table(
                &log,
                &cfg(method, InitBits::Threshold(ThresholdConfig::default())),
            )
            .expect("fit");
            assert_eq!(r.samples, 600);
            assert_eq!(r.cluster_sizes.iter().sum::<usize>(), 600);
            let json = r.table.to_json_pretty();
            let c = CompiledTable::from_json(&json).expect("router accepts it");
            assert_eq!(c.k(), 4);
            assert_eq!(r.table.provenance.rewards.len(), 4);
            // Threshold-initialized bits follow the rule's majority.
            for (bit, share) in r.table.bits.iter().zip(&r.threshold_remote_share) {
                assert_eq!(*bit == 1, *share > 0.5);
            }
            // Every cluster's evidence: its training requests, and a range that holds each
            // of them (no margin before learning).
            let sizes: Vec<u64> = r.table.evidence.iter().map(|e| e.requests).collect();
            let expected: Vec<u64> = r.cluster_sizes.iter().map(|&n| n as u64).collect();
            assert_eq!(sizes, expected);
            assert!(r.table.evidence.iter().all(|e| e.margin.is_none()));
            for rec in &log {
                let (cl, d) = c.locate(&rec.features);
                assert!(d <= r.table.evidence[cl].range + 1e-9, "{method:?}");
            }
        }
        let r = fit_table(&log, &cfg(ClusterMethod::Kmeans, InitBits::Remote)).expect("fit");
        assert_eq!(r.table.bits, vec![1; 4]);
        // An operator's bits carry no evidence: the router takes them as given.
        let r = fit_table(
            &log,
            &cfg(ClusterMethod::Kmeans, InitBits::Explicit(vec![0, 1, 0, 1])),
        )
        .expect("fit");
        assert!(r.table.evidence.is_empty());
        let bad = fit_table(
            &log,
            &cfg(ClusterMethod::Kmeans, InitBits::Explicit(vec![1])),
        );
        assert!(matches!(bad, Err(LearnError::Table(_))));
        assert!(fit_table(&log[..10], &cfg(ClusterMethod::Kmeans, InitBits::Local)).is_err());
    }

    #[test]
    fn a_disabled_feature_does_not_influence_assignment() {
        let log = synthetic::log(600, 11);
        // The same requests with other output-length hints.
        let mut other = log.clone();
        for (i, r) in other.iter_mut().enumerate() {
            r.features.output_len_hint = [1, 64, 900, 30_000][i % 4];
        }
        let hints = [0, 1, 16, 512, 4096, u32::MAX];
        let varies = |c: &CompiledTable, r: &LogRecord| {
            let mut f = r.features;
            let first = c.lookup(&f).0;
            hints.iter().any(|h| {
                f.output_len_hint = *h;
                c.lookup(&f).0 != first
            })
        };
        for method in [ClusterMethod::Kmeans, ClusterMethod::Gmm] {
            let all = fit_table(&log, &cfg(method, InitBits::Local)).expect("fit");
            let all = CompiledTable::compile(all.table).expect("compiles");
            assert!(
                log.iter().any(|r| varies(&all, r)),
                "{method:?}: with the feature on, the output length matters"
            );
            let no_out = FitConfig {
                features: [true, true, true, false],
                ..cfg(method, InitBits::Local)
            };
            let a = fit_table(&log, &no_out).expect("fit");
            assert!(a.table.provenance.notes.contains("output_len"));
            let b = fit_table(&other, &no_out).expect("fit");
            assert_eq!(a.table.standardizer, b.table.standardizer);
            assert_eq!(a.table.model, b.table.model, "{method:?}: same model");
            assert_eq!(a.cluster_sizes, b.cluster_sizes);
            // The router's assignment ignores the feature, whatever its value.
            let c = CompiledTable::from_json(&a.table.to_json_pretty()).expect("router loads it");
            for r in &log {
                assert!(!varies(&c, r), "{method:?}: {:?}", r.features);
            }
        }
        let none = FitConfig {
            features: [false; N_FEATURES],
            ..cfg(ClusterMethod::Kmeans, InitBits::Local)
        };
        assert!(matches!(
            fit_table(&log, &none),
            Err(LearnError::Invalid(_))
        ));
    }
}

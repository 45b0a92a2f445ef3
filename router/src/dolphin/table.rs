//! The routing table of DolphinRouting as operators see it: a JSON document with a schema
//! version, the split and SLOs it was learned for, the standardizer, the clustering model
//! (k-means centroids or a Gaussian mixture), one bit per cluster and provenance.
//!
//! ```json
//! {"schema_version": 1, "split": "3p1d", "slo": {"ttft_ms": 5000, "tpot_ms": 250},
//!  "k": 2, "method": "kmeans",
//!  "standardizer": {"transform": "log1p", "mean": [8, 7, 7, 5], "std": [1, 1, 1, 1]},
//!  "model": {"centroids": [[-1, -1, -1, 0], [1, 1, 1, 0]]},
//!  "bits": [0, 1],
//!  "provenance": {"workload": "arxiv", "date": "2026-11-29T12:00:00Z", "rounds": 26, "rewards": [0.9, 0.8]}}
//! ```
//!
//! Features, in this order: prompt length, uncached length on the chosen prefill worker, on the
//! chosen decode worker, and the output class's representative length ([`FEATURE_NAMES`]).
//! Each is transformed with `ln(1 + x)` then standardized: `z = (ln(1 + x) - mean) / std`.
//!
//! Mixtures use **diagonal** covariances (`variances` per component and dimension): the four
//! features are standardized logs, the clusters are few, and a diagonal model cannot become
//! singular on a small cluster the way a full 4x4 covariance can, while it still lets clusters
//! differ in spread per feature.
//!
//! Loading validates everything ([`RoutingTable::validate`]); [`super::assign::CompiledTable`]
//! is the form the request path uses.

use serde::{Deserialize, Serialize};

use super::split::Split;
use super::trust::ClusterEvidence;

/// The table schema this router reads.
pub const TABLE_SCHEMA_VERSION: u32 = 1;
/// Largest K a table may have (cluster ids are metric labels, so they must stay a small set).
pub const MAX_CLUSTERS: usize = 64;
/// Number of features.
pub const N_FEATURES: usize = 4;
/// The features, in the order of every vector in a table.
pub const FEATURE_NAMES: [&str; N_FEATURES] =
    ["isl", "eff_isl_prefill", "eff_isl_decode", "output_len"];

/// A routing table document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingTable {
    /// Must be [`TABLE_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The P/D split the table was learned for (e.g. "3p1d").
    pub split: Split,
    /// The SLOs the bits were learned against.
    pub slo: TableSlo,
    /// Number of clusters.
    pub k: usize,
    /// Clustering method.
    pub method: ClusterMethod,
    /// Feature transform and standardization.
    pub standardizer: Standardizer,
    /// Parameters of the clustering model (the fields of `method`).
    pub model: ClusterModel,
    /// One bit per cluster: 0 local prefill, 1 remote prefill.
    pub bits: Vec<u8>,
    /// Per cluster, the evidence behind its bit and its training range (empty: none recorded,
    /// and every bit is trusted; see [`super::trust`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<ClusterEvidence>,
    /// The load rule the bits were learned under (`None`: the bits alone decide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_rule: Option<LoadRule>,
    /// Where the table came from.
    pub provenance: Provenance,
}

/// What a table's bits cannot see: the chosen prefill worker's backlog. Under this rule a
/// request whose bit says remote prefills locally while that worker is busy (Dynamo's
/// `prefill_load` signal: prompt tokens pending above `prefill_busy_threshold` times its step
/// size). The bits are learned with the rule in force, so they are the best bits given it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadRule {
    /// Steps of prefill work pending above which the chosen prefill worker is busy (>= 0).
    pub prefill_busy_threshold: f64,
}

/// How every command names a rule: `local while prefill busy > X` (`none` where there is no
/// rule is the caller's).
impl std::fmt::Display for LoadRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "local while prefill busy > {}",
            self.prefill_busy_threshold
        )
    }
}

/// SLO targets of a table, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSlo {
    /// Time to first token.
    pub ttft_ms: f64,
    /// Time per output token.
    pub tpot_ms: f64,
}

/// How requests are clustered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMethod {
    /// Nearest centroid.
    Kmeans,
    /// Most likely component of a diagonal-covariance Gaussian mixture.
    Gmm,
}

impl ClusterMethod {
    /// "kmeans" / "gmm".
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterMethod::Kmeans => "kmeans",
            ClusterMethod::Gmm => "gmm",
        }
    }
}

/// The transform applied to raw feature values before standardization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transform {
    /// `ln(1 + x)`: lengths span orders of magnitude.
    Log1p,
}

/// `z = (transform(x) - mean) / std`, per feature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Standardizer {
    /// The transform.
    pub transform: Transform,
    /// Per-feature mean of the transformed values.
    pub mean: Vec<f64>,
    /// Per-feature standard deviation of the transformed values (> 0).
    pub std: Vec<f64>,
}

/// Model parameters; which fields are present depends on the method.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterModel {
    /// k-means: K centroids in standardized space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub centroids: Option<Vec<Vec<f64>>>,
    /// Mixture: K component weights (positive, summing to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Vec<f64>>,
    /// Mixture: K component means in standardized space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub means: Option<Vec<Vec<f64>>>,
    /// Mixture: K diagonal covariances (per-dimension variances, > 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variances: Option<Vec<Vec<f64>>>,
}

/// Where a table came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Workload it was learned on.
    pub workload: String,
    /// When (RFC 3339).
    pub date: String,
    /// Learning rounds run.
    pub rounds: u32,
    /// Per-cluster reward (share of requests meeting the SLO) at the end of learning; empty
    /// when unknown, else K values in [0, 1].
    #[serde(default)]
    pub rewards: Vec<f64>,
    /// What counted as meeting the SLO while learning (tables from before it was recorded:
    /// the end-to-end criterion).
    #[serde(default)]
    pub reward: Reward,
    /// Free-form notes (how the bits were set, by whom).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
}

/// When a request counts as meeting its SLO, for learning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Reward {
    /// DolphinRouting's criterion: `e2e <= TTFT_slo + (n - 1) x TPOT_slo`, so a slow first
    /// token can be made up by fast decoding.
    #[default]
    E2e,
    /// TaiChi's: TTFT and TPOT each within their SLO.
    PerMetric,
}

impl Reward {
    /// Its name ("e2e", "per-metric").
    pub fn as_str(self) -> &'static str {
        match self {
            Reward::E2e => "e2e",
            Reward::PerMetric => "per-metric",
        }
    }
}

/// Why a table was refused.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// Not JSON, or JSON of the wrong shape.
    #[error("the table is not a valid table document: {0}")]
    Json(#[source] serde_json::Error),
    /// A schema this router does not know.
    #[error(
        "unknown table schema_version {} (this router reads version {supported})",
        version_text(*.found)
    )]
    UnknownVersion {
        /// What the document says (`None`: missing or not a number).
        found: Option<u64>,
        /// [`TABLE_SCHEMA_VERSION`].
        supported: u32,
    },
    /// K out of range.
    #[error("k must be between 1 and {max}, got {k}")]
    BadK {
        /// The table's K.
        k: usize,
        /// [`MAX_CLUSTERS`].
        max: usize,
    },
    /// A vector or list of the wrong length.
    #[error("{field} has {found} entries, expected {expected}")]
    Dimension {
        /// Which field.
        field: String,
        /// Its length.
        found: usize,
        /// The length it must have.
        expected: usize,
    },
    /// NaN or infinity.
    #[error("{field} is not a finite number ({value})")]
    NotFinite {
        /// Which field.
        field: String,
        /// The value.
        value: f64,
    },
    /// A value that must be positive is not.
    #[error("{field} must be positive, got {value}")]
    NotPositive {
        /// Which field.
        field: String,
        /// The value.
        value: f64,
    },
    /// A bit other than 0 or 1.
    #[error("bits[{index}] is {value}; bits are 0 (local) or 1 (remote)")]
    BadBit {
        /// Cluster index.
        index: usize,
        /// The value.
        value: u8,
    },
    /// A reward outside [0, 1].
    #[error("provenance.rewards[{index}] is {value}; rewards are shares in [0, 1]")]
    BadReward {
        /// Cluster index.
        index: usize,
        /// The value.
        value: f64,
    },
    /// Model fields that do not match the method.
    #[error("{0}")]
    Model(String),
    /// Mixture weights that do not sum to 1.
    #[error("model.weights sum to {0}, expected 1")]
    WeightSum(f64),
    /// The table was learned for another split than the one it is stored under.
    #[error("the table is for split {table}, not {expected}")]
    SplitMismatch {
        /// The document's split.
        table: Split,
        /// The split it was put under.
        expected: Split,
    },
}

impl RoutingTable {
    /// Parses and validates a table document.
    pub fn from_json(text: &str) -> Result<RoutingTable, TableError> {
        // Check the schema version first: a future schema should be reported as such, not as
        // whatever field happens to fail to parse.
        let value: serde_json::Value = serde_json::from_str(text).map_err(TableError::Json)?;
        let found = value
            .get("schema_version")
            .and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(TABLE_SCHEMA_VERSION)) {
            return Err(TableError::UnknownVersion {
                found,
                supported: TABLE_SCHEMA_VERSION,
            });
        }
        let table: RoutingTable = serde_json::from_value(value).map_err(TableError::Json)?;
        table.validate()?;
        Ok(table)
    }

    /// Pretty JSON (what `dolphinctl tables show` prints and `put` stores).
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks every invariant the request path relies on.
    pub fn validate(&self) -> Result<(), TableError> {
        if self.schema_version != TABLE_SCHEMA_VERSION {
            return Err(TableError::UnknownVersion {
                found: Some(u64::from(self.schema_version)),
                supported: TABLE_SCHEMA_VERSION,
            });
        }
        let k = self.k;
        if k == 0 || k > MAX_CLUSTERS {
            return Err(TableError::BadK {
                k,
                max: MAX_CLUSTERS,
            });
        }
        positive("slo.ttft_ms", self.slo.ttft_ms)?;
        positive("slo.tpot_ms", self.slo.tpot_ms)?;
        vector("standardizer.mean", &self.standardizer.mean)?;
        vector("standardizer.std", &self.standardizer.std)?;
        for (i, s) in self.standardizer.std.iter().enumerate() {
            positive(&format!("standardizer.std[{i}]"), *s)?;
        }
        let m = &self.model;
        match self.method {
            ClusterMethod::Kmeans => {
                if m.weights.is_some() || m.means.is_some() || m.variances.is_some() {
                    return Err(TableError::Model(
                        "a kmeans table has model.centroids only (no weights, means, variances)"
                            .into(),
                    ));
                }
                let c = m.centroids.as_ref().ok_or_else(|| {
                    TableError::Model("a kmeans table needs model.centroids".into())
                })?;
                matrix("model.centroids", c, k)?;
            }
            ClusterMethod::Gmm => {
                if m.centroids.is_some() {
                    return Err(TableError::Model(
                        "a gmm table has model.weights, means and variances (no centroids)".into(),
                    ));
                }
                let missing = |f: &str| TableError::Model(format!("a gmm table needs model.{f}"));
                let w = m.weights.as_ref().ok_or_else(|| missing("weights"))?;
                let means = m.means.as_ref().ok_or_else(|| missing("means"))?;
                let vars = m.variances.as_ref().ok_or_else(|| missing("variances"))?;
                length("model.weights", w.len(), k)?;
                for (i, x) in w.iter().enumerate() {
                    positive(&format!("model.weights[{i}]"), *x)?;
                }
                let sum: f64 = w.iter().sum();
                if (sum - 1.0).abs() > 1e-6 {
                    return Err(TableError::WeightSum(sum));
                }
                matrix("model.means", means, k)?;
                matrix("model.variances", vars, k)?;
                for (i, row) in vars.iter().enumerate() {
                    for (j, v) in row.iter().enumerate() {
                        positive(&format!("model.variances[{i}][{j}]"), *v)?;
                    }
                }
            }
        }
        length("bits", self.bits.len(), k)?;
        if let Some((index, &value)) = self.bits.iter().enumerate().find(|(_, b)| **b > 1) {
            return Err(TableError::BadBit { index, value });
        }
        if !self.evidence.is_empty() {
            length("evidence", self.evidence.len(), k)?;
            for (i, e) in self.evidence.iter().enumerate() {
                finite(&format!("evidence[{i}].range"), e.range)?;
                if e.range < 0.0 {
                    return Err(TableError::Model(format!(
                        "evidence[{i}].range is negative ({})",
                        e.range
                    )));
                }
                if let Some(m) = e.margin
                    && !(m.is_finite() && (-1.0..=1.0).contains(&m))
                {
                    return Err(TableError::Model(format!(
                        "evidence[{i}].margin must be within [-1, 1], got {m}"
                    )));
                }
            }
        }
        if let Some(rule) = self.load_rule {
            let t = rule.prefill_busy_threshold;
            finite("load_rule.prefill_busy_threshold", t)?;
            if t < 0.0 {
                return Err(TableError::Model(format!(
                    "load_rule.prefill_busy_threshold must be >= 0, got {t}"
                )));
            }
        }
        let rewards = &self.provenance.rewards;
        if !rewards.is_empty() {
            length("provenance.rewards", rewards.len(), k)?;
            for (index, &value) in rewards.iter().enumerate() {
                if !(0.0..=1.0).contains(&value) {
                    return Err(TableError::BadReward { index, value });
                }
            }
        }
        Ok(())
    }
}

/// A schema version as an error message shows it.
pub(crate) fn version_text(found: Option<u64>) -> String {
    found.map_or_else(|| "(missing or not a number)".to_owned(), |v| v.to_string())
}

fn length(field: &str, found: usize, expected: usize) -> Result<(), TableError> {
    if found == expected {
        Ok(())
    } else {
        Err(TableError::Dimension {
            field: field.to_owned(),
            found,
            expected,
        })
    }
}

fn finite(field: &str, value: f64) -> Result<(), TableError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(TableError::NotFinite {
            field: field.to_owned(),
            value,
        })
    }
}

fn positive(field: &str, value: f64) -> Result<(), TableError> {
    finite(field, value)?;
    if value > 0.0 {
        Ok(())
    } else {
        Err(TableError::NotPositive {
            field: field.to_owned(),
            value,
        })
    }
}

/// A feature vector: [`N_FEATURES`] finite values.
fn vector(field: &str, v: &[f64]) -> Result<(), TableError> {
    length(field, v.len(), N_FEATURES)?;
    for (i, x) in v.iter().enumerate() {
        finite(&format!("{field}[{i}]"), *x)?;
    }
    Ok(())
}

/// `k` feature vectors.
fn matrix(field: &str, rows: &[Vec<f64>], k: usize) -> Result<(), TableError> {
    length(field, rows.len(), k)?;
    for (i, row) in rows.iter().enumerate() {
        vector(&format!("{field}[{i}]"), row)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A valid two-cluster k-means table for `split`.
    pub(crate) fn kmeans_table(split: Split, bits: [u8; 2]) -> RoutingTable {
        RoutingTable {
            schema_version: TABLE_SCHEMA_VERSION,
            split,
            slo: TableSlo {
                ttft_ms: 5000.0,
                tpot_ms: 250.0,
            },
            k: 2,
            method: ClusterMethod::Kmeans,
            standardizer: Standardizer {
                transform: Transform::Log1p,
                mean: vec![5.0; 4],
                std: vec![1.0; 4],
            },
            model: ClusterModel {
                centroids: Some(vec![vec![-1.0; 4], vec![1.0; 4]]),
                ..Default::default()
            },
            bits: bits.to_vec(),
            evidence: Vec::new(),
            load_rule: None,
            provenance: Provenance {
                workload: "test".into(),
                date: "2026-11-29T00:00:00Z".into(),
                rounds: 0,
                rewards: vec![],
                reward: Reward::E2e,
                notes: String::new(),
            },
        }
    }

    fn refused(t: &RoutingTable) -> TableError {
        let text = serde_json::to_string(t).expect("json");
        RoutingTable::from_json(&text).expect_err("must be refused")
    }

    #[test]
    fn roundtrips_through_json() {
        let t = kmeans_table(Split::new(3, 1), [0, 1]);
        let back = RoutingTable::from_json(&t.to_json_pretty()).expect("valid");
        assert_eq!(back, t);
        assert!(t.to_json_pretty().contains("\"split\": \"3p1d\""));
    }

    #[test]
    fn refuses_bad_tables_with_a_precise_error() {
        let good = kmeans_table(Split::new(1, 1), [0, 1]);
        let mut t = good.clone();
        t.schema_version = 2;
        assert!(matches!(
            refused(&t),
            TableError::UnknownVersion { found: Some(2), .. }
        ));
        assert!(
            refused(&t)
                .to_string()
                .starts_with("unknown table schema_version 2 (")
        );
        assert!(matches!(
            RoutingTable::from_json(r#"{"split": "1p1d"}"#),
            Err(TableError::UnknownVersion { found: None, .. })
        ));
        assert!(matches!(
            RoutingTable::from_json("not json"),
            Err(TableError::Json(_))
        ));
        let mut t = good.clone();
        t.bits = vec![0, 1, 1];
        assert!(matches!(refused(&t), TableError::Dimension { field, .. } if field == "bits"));
        let mut t = good.clone();
        t.bits = vec![0, 2];
        assert!(matches!(
            refused(&t),
            TableError::BadBit { index: 1, value: 2 }
        ));
        let mut t = good.clone();
        t.k = 0;
        assert!(matches!(refused(&t), TableError::BadK { k: 0, .. }));
        let mut t = good.clone();
        t.model.centroids = Some(vec![vec![0.0; 3], vec![0.0; 4]]);
        assert!(
            matches!(refused(&t), TableError::Dimension { field, found: 3, .. } if field == "model.centroids[0]")
        );
        let mut t = good.clone();
        t.standardizer.std[2] = 0.0;
        assert!(matches!(refused(&t), TableError::NotPositive { .. }));
        // NaN cannot be written as JSON; validate() catches it in memory.
        let mut t = good.clone();
        t.standardizer.mean[0] = f64::NAN;
        assert!(matches!(t.validate(), Err(TableError::NotFinite { .. })));
        let mut t = good.clone();
        t.model.weights = Some(vec![0.5, 0.5]);
        assert!(matches!(refused(&t), TableError::Model(_)));
        let mut t = good.clone();
        t.provenance.rewards = vec![0.5, 1.5];
        assert!(matches!(
            refused(&t),
            TableError::BadReward { index: 1, .. }
        ));
        let text = serde_json::to_string(&good)
            .expect("json")
            .replace("\"k\":2", "\"k\":2,\"extra\":1");
        assert!(matches!(
            RoutingTable::from_json(&text),
            Err(TableError::Json(_))
        ));
    }

    #[test]
    fn a_load_rule_is_optional_and_checked() {
        let plain = kmeans_table(Split::new(1, 1), [0, 1]);
        assert!(!plain.to_json_pretty().contains("load_rule"));
        let mut t = plain.clone();
        t.load_rule = Some(LoadRule {
            prefill_busy_threshold: 0.5,
        });
        let text = t.to_json_pretty();
        assert!(text.contains("\"prefill_busy_threshold\": 0.5"), "{text}");
        assert_eq!(RoutingTable::from_json(&text).expect("valid"), t);
        t.load_rule = Some(LoadRule {
            prefill_busy_threshold: -1.0,
        });
        assert!(
            matches!(refused(&t), TableError::Model(m) if m.contains("load_rule.prefill_busy_threshold"))
        );
        t.load_rule = Some(LoadRule {
            prefill_busy_threshold: f64::INFINITY,
        });
        assert!(matches!(t.validate(), Err(TableError::NotFinite { .. })));
        let unknown = serde_json::to_string(&plain).expect("json").replace(
            "\"k\":2",
            "\"k\":2,\"load_rule\":{\"prefill_busy_threshold\":1,\"queue\":2}",
        );
        assert!(matches!(
            RoutingTable::from_json(&unknown),
            Err(TableError::Json(_))
        ));
    }

    #[test]
    fn gmm_tables_need_consistent_parameters() {
        let mut t = kmeans_table(Split::new(1, 1), [0, 1]);
        t.method = ClusterMethod::Gmm;
        assert!(matches!(refused(&t), TableError::Model(_)));
        t.model = ClusterModel {
            weights: Some(vec![0.3, 0.7]),
            means: Some(vec![vec![0.0; 4], vec![1.0; 4]]),
            variances: Some(vec![vec![1.0; 4], vec![0.5; 4]]),
            ..Default::default()
        };
        t.validate().expect("valid gmm");
        t.model.weights = Some(vec![0.3, 0.6]);
        assert!(matches!(refused(&t), TableError::WeightSum(_)));
        t.model.weights = Some(vec![0.3, 0.7]);
        t.model.variances = Some(vec![vec![1.0; 4], vec![0.5, 0.5, -1.0, 0.5]]);
        assert!(
            matches!(refused(&t), TableError::NotPositive { field, .. } if field == "model.variances[1][2]")
        );
    }
}

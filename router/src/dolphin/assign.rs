//! Cluster assignment on the request path: a validated [`RoutingTable`] compiled into fixed-size
//! arrays, so standardizing a request and finding its cluster is a few dozen floating-point
//! operations with no allocation.
//!
//! k-means: the nearest centroid (squared Euclidean distance in standardized space).
//! Mixture: the most likely component, `argmax_k ln w_k - 1/2 sum_d [ln(2 pi var_kd) +
//! (z_d - mean_kd)^2 / var_kd]`, with the constant part of each component precomputed.

use crate::policy::{Decision, Features};

use super::table::{ClusterMethod, LoadRule, N_FEATURES, RoutingTable, TableError};
use super::trust::{Distrust, TrustConfig};

/// A point in feature space.
pub type Vector = [f64; N_FEATURES];

/// The compiled clustering model.
#[derive(Clone, Debug, PartialEq)]
enum Model {
    Kmeans {
        centroids: Vec<Vector>,
    },
    Gmm {
        /// `ln w_k - 1/2 sum_d ln(2 pi var_kd)`.
        log_norm: Vec<f64>,
        means: Vec<Vector>,
        inv_var: Vec<Vector>,
    },
}

/// A table ready for the request path.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledTable {
    table: RoutingTable,
    mean: Vector,
    inv_std: Vector,
    model: Model,
    remote: Vec<bool>,
}

fn to_vector(v: &[f64]) -> Vector {
    let mut out = [0.0; N_FEATURES];
    for (o, x) in out.iter_mut().zip(v) {
        *o = *x;
    }
    out
}

impl CompiledTable {
    /// Validates `table` and compiles it.
    pub fn compile(table: RoutingTable) -> Result<CompiledTable, TableError> {
        table.validate()?;
        let s = &table.standardizer;
        let mean = to_vector(&s.mean);
        let inv_std = to_vector(&s.std).map(|x| 1.0 / x);
        let m = &table.model;
        let model = match table.method {
            ClusterMethod::Kmeans => Model::Kmeans {
                centroids: m.centroids.iter().flatten().map(|c| to_vector(c)).collect(),
            },
            ClusterMethod::Gmm => {
                let vars: Vec<Vector> =
                    m.variances.iter().flatten().map(|v| to_vector(v)).collect();
                let log_norm = m
                    .weights
                    .iter()
                    .flatten()
                    .zip(&vars)
                    .map(|(w, var)| {
                        w.ln()
                            - 0.5
                                * var
                                    .iter()
                                    .map(|v| (2.0 * std::f64::consts::PI * v).ln())
                                    .sum::<f64>()
                    })
                    .collect();
                Model::Gmm {
                    log_norm,
                    means: m.means.iter().flatten().map(|c| to_vector(c)).collect(),
                    inv_var: vars.iter().map(|v| v.map(|x| 1.0 / x)).collect(),
                }
            }
        };
        let remote = table.bits.iter().map(|b| *b == 1).collect();
        Ok(CompiledTable {
            table,
            mean,
            inv_std,
            model,
            remote,
        })
    }

    /// Parses, validates and compiles a table document.
    pub fn from_json(text: &str) -> Result<CompiledTable, TableError> {
        Self::compile(RoutingTable::from_json(text)?)
    }

    /// The document it was compiled from.
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    /// Number of clusters.
    pub fn k(&self) -> usize {
        self.remote.len()
    }

    /// The raw feature vector of a request, in [`super::table::FEATURE_NAMES`] order.
    pub fn raw(f: &Features) -> Vector {
        [
            f64::from(f.isl),
            f64::from(f.eff_isl_prefill),
            f64::from(f.eff_isl_decode),
            f64::from(f.output_len_hint),
        ]
    }

    /// Log-transforms and standardizes a raw feature vector.
    pub fn standardize(&self, raw: &Vector) -> Vector {
        let mut z = [0.0; N_FEATURES];
        for d in 0..N_FEATURES {
            z[d] = (raw[d].ln_1p() - self.mean[d]) * self.inv_std[d];
        }
        z
    }

    /// The cluster of a standardized point (ties: the lowest index).
    pub fn assign(&self, z: &Vector) -> usize {
        self.locate_standardized(z).0
    }

    /// The cluster of a standardized point and the point's distance from the cluster's centre:
    /// Euclidean to the centroid (k-means), Mahalanobis to the component's mean (mixture).
    fn locate_standardized(&self, z: &Vector) -> (usize, f64) {
        let mut best = 0;
        match &self.model {
            Model::Kmeans { centroids } => {
                let mut best_d = f64::INFINITY;
                for (k, c) in centroids.iter().enumerate() {
                    let mut d = 0.0;
                    for j in 0..N_FEATURES {
                        let x = z[j] - c[j];
                        d += x * x;
                    }
                    if d < best_d {
                        best_d = d;
                        best = k;
                    }
                }
                (best, best_d.sqrt())
            }
            Model::Gmm {
                log_norm,
                means,
                inv_var,
            } => {
                let (mut best_l, mut best_q) = (f64::NEG_INFINITY, 0.0);
                for k in 0..log_norm.len() {
                    let mut q = 0.0;
                    for j in 0..N_FEATURES {
                        let x = z[j] - means[k][j];
                        q += x * x * inv_var[k][j];
                    }
                    let l = log_norm[k] - 0.5 * q;
                    if l > best_l {
                        best_l = l;
                        best_q = q;
                        best = k;
                    }
                }
                (best, best_q.sqrt())
            }
        }
    }

    /// The cluster of a request and its distance from the cluster's centre (standardized
    /// units; what [`super::trust::ClusterEvidence::range`] bounds).
    pub fn locate(&self, f: &Features) -> (usize, f64) {
        self.locate_standardized(&self.standardize(&Self::raw(f)))
    }

    /// The cluster of a request and its bit.
    pub fn lookup(&self, f: &Features) -> (usize, Decision) {
        let (cluster, _) = self.locate(f);
        (cluster, self.bit(cluster))
    }

    /// The cluster of a request, its bit, and why the bit is not to be taken under `trust`
    /// (`None`: take it). A table without evidence is always trusted.
    pub fn lookup_checked(
        &self,
        f: &Features,
        trust: &TrustConfig,
    ) -> (usize, Decision, Option<Distrust>) {
        let (cluster, distance) = self.locate(f);
        let distrust = self
            .table
            .evidence
            .get(cluster)
            .and_then(|e| trust.check(e, distance));
        (cluster, self.bit(cluster), distrust)
    }

    /// The load rule the bits were learned under.
    pub fn load_rule(&self) -> Option<LoadRule> {
        self.table.load_rule
    }

    /// The decision stored for `cluster`.
    pub fn bit(&self, cluster: usize) -> Decision {
        if self.remote.get(cluster).copied().unwrap_or(false) {
            Decision::Remote
        } else {
            Decision::Local
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::dolphin::split::Split;
    use crate::dolphin::table::tests::kmeans_table;
    use crate::dolphin::table::{ClusterModel, Standardizer, TABLE_SCHEMA_VERSION, Transform};

    fn point() -> impl Strategy<Value = Vec<f64>> {
        proptest::collection::vec(-4.0f64..4.0, N_FEATURES)
    }

    fn table(method: ClusterMethod, model: ClusterModel, k: usize) -> RoutingTable {
        let mut t = kmeans_table(Split::new(2, 2), [0, 1]);
        t.method = method;
        t.model = model;
        t.k = k;
        t.bits = (0..k).map(|i| (i % 2) as u8).collect();
        t.standardizer = Standardizer {
            transform: Transform::Log1p,
            mean: vec![0.0; 4],
            std: vec![1.0; 4],
        };
        t.schema_version = TABLE_SCHEMA_VERSION;
        t
    }

    /// The textbook density, straight from the document (no precomputation).
    fn log_density(t: &RoutingTable, k: usize, z: &[f64]) -> f64 {
        let w = t.model.weights.as_ref().expect("weights")[k];
        let mean = &t.model.means.as_ref().expect("means")[k];
        let var = &t.model.variances.as_ref().expect("variances")[k];
        let mut p = w;
        for d in 0..N_FEATURES {
            p *= (-(z[d] - mean[d]).powi(2) / (2.0 * var[d])).exp()
                / (2.0 * std::f64::consts::PI * var[d]).sqrt();
        }
        p.ln()
    }

    proptest! {
        #[test]
        fn kmeans_assignment_is_the_nearest_centroid(
            centroids in proptest::collection::vec(point(), 1..12),
            points in proptest::collection::vec(point(), 1..20),
        ) {
            let k = centroids.len();
            let t = table(ClusterMethod::Kmeans, ClusterModel { centroids: Some(centroids.clone()), ..Default::default() }, k);
            let c = CompiledTable::compile(t).expect("valid");
            for p in &points {
                let z = to_vector(p);
                let dist = |c: &Vec<f64>| c.iter().zip(p).map(|(a, b)| (a - b).powi(2)).sum::<f64>();
                let best = centroids.iter().map(dist).fold(f64::INFINITY, f64::min);
                let got = c.assign(&z);
                // Equal up to rounding: ties may go either way between equally near centroids.
                prop_assert!(dist(&centroids[got]) <= best + 1e-12, "got {} at {} vs best {}", got, dist(&centroids[got]), best);
            }
        }

        #[test]
        fn gmm_assignment_is_the_most_likely_component(
            comps in proptest::collection::vec((0.05f64..1.0, point(), proptest::collection::vec(0.2f64..3.0, N_FEATURES)), 1..10),
            points in proptest::collection::vec(proptest::collection::vec(-2.5f64..2.5, N_FEATURES), 1..20),
        ) {
            let k = comps.len();
            let total: f64 = comps.iter().map(|c| c.0).sum();
            let mut weights: Vec<f64> = comps.iter().map(|c| c.0 / total).collect();
            // Make the sum exactly 1 within validation's tolerance whatever the rounding.
            let rest: f64 = weights[1..].iter().sum();
            weights[0] = 1.0 - rest;
            prop_assume!(weights[0] > 0.0);
            let model = ClusterModel {
                weights: Some(weights),
                means: Some(comps.iter().map(|c| c.1.clone()).collect()),
                variances: Some(comps.iter().map(|c| c.2.clone()).collect()),
                ..Default::default()
            };
            let t = table(ClusterMethod::Gmm, model, k);
            let c = CompiledTable::compile(t.clone()).expect("valid");
            for p in &points {
                let best = (0..k).map(|j| log_density(&t, j, p)).fold(f64::NEG_INFINITY, f64::max);
                let got = c.assign(&to_vector(p));
                prop_assert!(log_density(&t, got, p) >= best - 1e-9, "got {} vs best {}", got, best);
            }
        }
    }

    #[test]
    fn lookup_standardizes_logs_and_reads_the_bit() {
        // Centroids at -1 and +1 around a mean of ln(1 + x) = 5 (x ~ 147).
        let c = CompiledTable::compile(kmeans_table(Split::new(1, 1), [0, 1])).expect("valid");
        let small = Features {
            isl: 10,
            eff_isl_prefill: 10,
            eff_isl_decode: 10,
            output_len_hint: 10,
        };
        let large = Features {
            isl: 5000,
            eff_isl_prefill: 5000,
            eff_isl_decode: 5000,
            output_len_hint: 5000,
        };
        assert_eq!(c.lookup(&small), (0, Decision::Local));
        assert_eq!(c.lookup(&large), (1, Decision::Remote));
        let z = c.standardize(&CompiledTable::raw(&small));
        assert!((z[0] - (11f64.ln() - 5.0)).abs() < 1e-12);
        assert_eq!(c.k(), 2);
    }
}

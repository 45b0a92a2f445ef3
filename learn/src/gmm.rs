//! Gaussian mixture with diagonal covariances, fitted by EM from a k-means start.
//!
//! Diagonal, as the router's table format documents: the features are standardized logs and the
//! clusters few, so a diagonal model is stable where a full covariance would go singular on a
//! small cluster. A variance floor keeps components from collapsing onto a single point.

use dolphin_router::dolphin::table::N_FEATURES;

use crate::error::LearnError;
use crate::kmeans::{self, KMeansConfig, Point};

/// Smallest variance of a component in any dimension (standardized units).
pub const VARIANCE_FLOOR: f64 = 1e-3;

/// A fitted mixture.
#[derive(Clone, Debug, PartialEq)]
pub struct Gmm {
    /// Component weights (sum to 1).
    pub weights: Vec<f64>,
    /// Component means.
    pub means: Vec<Point>,
    /// Component variances per dimension.
    pub variances: Vec<Point>,
    /// Mean log-likelihood per point at the end.
    pub mean_log_likelihood: f64,
    /// EM iterations run.
    pub iterations: usize,
}

impl Gmm {
    /// Log of weight times density of component `k` at `p`.
    pub fn log_joint(&self, k: usize, p: &Point) -> f64 {
        let mut l = self.weights[k].ln();
        for ((x, m), v) in p.iter().zip(&self.means[k]).zip(&self.variances[k]) {
            l -= 0.5 * ((2.0 * std::f64::consts::PI * v).ln() + (x - m).powi(2) / v);
        }
        l
    }

    /// The most likely component of `p`.
    pub fn most_likely(&self, p: &Point) -> usize {
        (0..self.weights.len())
            .map(|k| (k, self.log_joint(k, p)))
            .fold((0, f64::NEG_INFINITY), |b, x| if x.1 > b.1 { x } else { b })
            .0
    }
}

/// Fits a `k`-component mixture (at most `max_iter` EM iterations, stopping when the mean
/// log-likelihood improves by less than 1e-6).
pub fn fit(points: &[Point], k: usize, max_iter: usize, seed: u64) -> Result<Gmm, LearnError> {
    let km = kmeans::fit(
        points,
        KMeansConfig {
            seed,
            ..KMeansConfig::new(k)
        },
    )?;
    let n = points.len() as f64;
    let mut g = Gmm {
        weights: vec![1.0 / k as f64; k],
        means: km.centroids.clone(),
        variances: vec![[1.0; N_FEATURES]; k],
        mean_log_likelihood: f64::NEG_INFINITY,
        iterations: 0,
    };
    // Start from the k-means partition: hard responsibilities.
    let mut resp: Vec<Vec<f64>> = km
        .labels
        .iter()
        .map(|l| (0..k).map(|c| if c == *l { 1.0 } else { 0.0 }).collect())
        .collect();
    m_step(points, &resp, &mut g, n);
    for it in 0..max_iter {
        let ll = e_step(points, &g, &mut resp);
        g.iterations = it + 1;
        let done = (ll - g.mean_log_likelihood).abs() < 1e-6;
        g.mean_log_likelihood = ll;
        if done {
            break;
        }
        m_step(points, &resp, &mut g, n);
    }
    // Exactly normalized for the table's validation.
    let total: f64 = g.weights.iter().sum();
    for w in &mut g.weights {
        *w /= total;
    }
    Ok(g)
}

/// Responsibilities of each component for each point; returns the mean log-likelihood.
fn e_step(points: &[Point], g: &Gmm, resp: &mut [Vec<f64>]) -> f64 {
    let k = g.weights.len();
    let mut total = 0.0;
    for (r, p) in resp.iter_mut().zip(points) {
        let logs: Vec<f64> = (0..k).map(|c| g.log_joint(c, p)).collect();
        let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = logs.iter().map(|l| (l - max).exp()).sum();
        let lse = max + sum.ln();
        total += lse;
        for (ri, l) in r.iter_mut().zip(&logs) {
            *ri = (l - lse).exp();
        }
    }
    total / points.len() as f64
}

fn m_step(points: &[Point], resp: &[Vec<f64>], g: &mut Gmm, n: f64) {
    let k = g.weights.len();
    for c in 0..k {
        let nk: f64 = resp.iter().map(|r| r[c]).sum();
        if nk < 1e-9 {
            // A dead component keeps its place with a tiny weight rather than vanish.
            g.weights[c] = 1e-9;
            continue;
        }
        g.weights[c] = nk / n;
        let mut mean = [0.0; N_FEATURES];
        for (r, p) in resp.iter().zip(points) {
            for d in 0..N_FEATURES {
                mean[d] += r[c] * p[d];
            }
        }
        mean.iter_mut().for_each(|m| *m /= nk);
        let mut var = [0.0; N_FEATURES];
        for (r, p) in resp.iter().zip(points) {
            for d in 0..N_FEATURES {
                var[d] += r[c] * (p[d] - mean[d]).powi(2);
            }
        }
        var.iter_mut()
            .for_each(|v| *v = (*v / nk).max(VARIANCE_FLOOR));
        g.means[c] = mean;
        g.variances[c] = var;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kmeans::tests::blobs;

    #[test]
    fn recovers_components_of_different_spread() {
        let centres = [[0.0; 4], [6.0, 6.0, 0.0, 0.0]];
        let (mut pts, _) = blobs(&centres[..1], 300, 0.4, 3);
        let (wide, _) = blobs(&centres[1..], 100, 2.0, 4);
        pts.extend(wide);
        let g = fit(&pts, 2, 200, 7).expect("fit");
        assert!((g.weights.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let tight = g.most_likely(&centres[0]);
        let loose = g.most_likely(&centres[1]);
        assert_ne!(tight, loose);
        assert!((g.weights[tight] - 0.75).abs() < 0.05, "{:?}", g.weights);
        assert!(g.variances[loose][0] > 4.0 * g.variances[tight][0]);
        assert!(g.mean_log_likelihood.is_finite());
    }

    #[test]
    fn duplicates_do_not_collapse_variances() {
        let g = fit(&[[1.0; 4]; 10], 2, 50, 1).expect("fit");
        assert!(g.variances.iter().flatten().all(|v| *v >= VARIANCE_FLOOR));
    }
}

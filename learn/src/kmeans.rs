//! k-means with k-means++ seeding (Arthur and Vassilvitskii, 2007) and Lloyd iterations, best of
//! several restarts.

use dolphin_router::dolphin::table::N_FEATURES;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::LearnError;

/// A point in standardized feature space.
pub type Point = [f64; N_FEATURES];

/// Squared Euclidean distance.
pub fn dist2(a: &Point, b: &Point) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum()
}

/// Index of the nearest centroid (ties: the lowest index, as the router does).
pub fn nearest(centroids: &[Point], p: &Point) -> usize {
    let mut best = (0, f64::INFINITY);
    for (k, c) in centroids.iter().enumerate() {
        let d = dist2(c, p);
        if d < best.1 {
            best = (k, d);
        }
    }
    best.0
}

/// A fitted k-means model.
#[derive(Clone, Debug, PartialEq)]
pub struct KMeans {
    /// The centroids.
    pub centroids: Vec<Point>,
    /// Sum of squared distances of the points to their centroid.
    pub inertia: f64,
    /// Cluster of each input point.
    pub labels: Vec<usize>,
}

/// Settings of a k-means fit.
#[derive(Clone, Copy, Debug)]
pub struct KMeansConfig {
    /// Clusters.
    pub k: usize,
    /// Restarts (the best inertia wins).
    pub restarts: usize,
    /// Lloyd iterations per restart at most.
    pub max_iter: usize,
    /// Random seed.
    pub seed: u64,
}

impl KMeansConfig {
    /// `k` clusters, 4 restarts, 300 iterations, seed 0.
    pub fn new(k: usize) -> Self {
        KMeansConfig {
            k,
            restarts: 4,
            max_iter: 300,
            seed: 0,
        }
    }
}

/// Fits k-means to `points`.
pub fn fit(points: &[Point], cfg: KMeansConfig) -> Result<KMeans, LearnError> {
    if cfg.k == 0 {
        return Err(LearnError::Invalid("k must be at least 1".into()));
    }
    if points.len() < cfg.k {
        return Err(LearnError::NotEnoughData(format!(
            "{} points for {} clusters",
            points.len(),
            cfg.k
        )));
    }
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let mut best: Option<KMeans> = None;
    for _ in 0..cfg.restarts.max(1) {
        let m = lloyd(
            points,
            seed_plus_plus(points, cfg.k, &mut rng),
            cfg.max_iter,
        );
        if best.as_ref().is_none_or(|b| m.inertia < b.inertia) {
            best = Some(m);
        }
    }
    best.ok_or_else(|| LearnError::Invalid("no restart ran".into()))
}

/// k-means++: each next centre is drawn with probability proportional to its squared distance
/// to the nearest centre chosen so far.
fn seed_plus_plus(points: &[Point], k: usize, rng: &mut SmallRng) -> Vec<Point> {
    let mut centroids = vec![points[rng.random_range(0..points.len())]];
    let mut d2: Vec<f64> = points.iter().map(|p| dist2(p, &centroids[0])).collect();
    while centroids.len() < k {
        let total: f64 = d2.iter().sum();
        let next = if total > 0.0 {
            let mut target = rng.random::<f64>() * total;
            let mut idx = points.len() - 1;
            for (i, d) in d2.iter().enumerate() {
                if target < *d {
                    idx = i;
                    break;
                }
                target -= d;
            }
            idx
        } else {
            // Every point sits on a centre already (duplicates): any point will do.
            rng.random_range(0..points.len())
        };
        let c = points[next];
        for (d, p) in d2.iter_mut().zip(points) {
            *d = d.min(dist2(p, &c));
        }
        centroids.push(c);
    }
    centroids
}

fn lloyd(points: &[Point], mut centroids: Vec<Point>, max_iter: usize) -> KMeans {
    let k = centroids.len();
    let mut labels = vec![usize::MAX; points.len()];
    for _ in 0..max_iter {
        let mut changed = false;
        for (l, p) in labels.iter_mut().zip(points) {
            let n = nearest(&centroids, p);
            changed |= *l != n;
            *l = n;
        }
        if !changed {
            break;
        }
        let mut sums = vec![[0.0; N_FEATURES]; k];
        let mut counts = vec![0usize; k];
        for (l, p) in labels.iter().zip(points) {
            counts[*l] += 1;
            for d in 0..N_FEATURES {
                sums[*l][d] += p[d];
            }
        }
        for c in 0..k {
            if counts[c] == 0 {
                // An empty cluster takes the point farthest from its centre.
                let far = (0..points.len())
                    .max_by(|&a, &b| {
                        let da = dist2(&points[a], &centroids[labels[a]]);
                        let db = dist2(&points[b], &centroids[labels[b]]);
                        da.total_cmp(&db)
                    })
                    .unwrap_or(0);
                centroids[c] = points[far];
            } else {
                for d in 0..N_FEATURES {
                    centroids[c][d] = sums[c][d] / counts[c] as f64;
                }
            }
        }
    }
    for (l, p) in labels.iter_mut().zip(points) {
        *l = nearest(&centroids, p);
    }
    let inertia = labels
        .iter()
        .zip(points)
        .map(|(l, p)| dist2(&centroids[*l], p))
        .sum();
    KMeans {
        centroids,
        inertia,
        labels,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Points around `centres`, `n` each, with spread `sd`.
    pub(crate) fn blobs(
        centres: &[Point],
        n: usize,
        sd: f64,
        seed: u64,
    ) -> (Vec<Point>, Vec<usize>) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut pts = Vec::new();
        let mut truth = Vec::new();
        for (c, centre) in centres.iter().enumerate() {
            for _ in 0..n {
                let mut p = *centre;
                for x in p.iter_mut() {
                    // Sum of uniforms: roughly normal, bounded.
                    *x += sd * (0..4).map(|_| rng.random::<f64>() - 0.5).sum::<f64>();
                }
                pts.push(p);
                truth.push(c);
            }
        }
        (pts, truth)
    }

    #[test]
    fn recovers_separated_clusters() {
        let centres = [[0.0; 4], [5.0, 5.0, 0.0, 0.0], [0.0, 0.0, 5.0, 5.0]];
        let (pts, truth) = blobs(&centres, 100, 0.5, 1);
        let m = fit(&pts, KMeansConfig::new(3)).expect("fit");
        // Same partition up to relabelling: points of one true cluster share a label.
        for c in 0..3 {
            let labels: std::collections::HashSet<usize> = truth
                .iter()
                .zip(&m.labels)
                .filter(|(t, _)| **t == c)
                .map(|(_, l)| *l)
                .collect();
            assert_eq!(labels.len(), 1, "cluster {c} split: {labels:?}");
        }
        for centre in &centres {
            let near = m
                .centroids
                .iter()
                .map(|c| dist2(c, centre))
                .fold(f64::INFINITY, f64::min);
            assert!(near < 0.1, "no centroid near {centre:?}");
        }
    }

    #[test]
    fn degenerate_inputs() {
        assert!(fit(&[[0.0; 4]], KMeansConfig::new(2)).is_err());
        assert!(fit(&[[0.0; 4]], KMeansConfig::new(0)).is_err());
        // Duplicates: still k centroids, zero inertia.
        let m = fit(&[[1.0; 4]; 5], KMeansConfig::new(2)).expect("fit");
        assert_eq!(m.centroids.len(), 2);
        assert_eq!(m.inertia, 0.0);
    }
}

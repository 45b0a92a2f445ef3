//! k-means for table fitting: `linfa-clustering`'s (k-means++ seeding, Lloyd iterations, best
//! of several restarts), and the nearest-centroid rule the router's compiled table applies.

use dolphin_router::dolphin::table::N_FEATURES;

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

/// Fits k-means to `points` with `linfa-clustering` (k-means++ seeding, Lloyd iterations, the
/// best of `restarts` runs by inertia), then labels every point by [`nearest`], the rule the
/// router's compiled table applies.
///
/// Fewer distinct points than `k` (linfa's k-means++ cannot draw a new centre when every point
/// already sits on one): the distinct points are the centroids, repeated up to `k`.
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
    let distinct = distinct(points, cfg.k);
    let centroids = if distinct.len() < cfg.k {
        (0..cfg.k).map(|i| distinct[i % distinct.len()]).collect()
    } else {
        linfa_centroids(points, cfg)?
    };
    let labels: Vec<usize> = points.iter().map(|p| nearest(&centroids, p)).collect();
    let inertia = labels
        .iter()
        .zip(points)
        .map(|(l, p)| dist2(&centroids[*l], p))
        .sum();
    Ok(KMeans {
        centroids,
        inertia,
        labels,
    })
}

/// Up to `k` distinct points of `points`, in order.
fn distinct(points: &[Point], k: usize) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::with_capacity(k);
    for p in points {
        if out.len() == k {
            break;
        }
        if !out.contains(p) {
            out.push(*p);
        }
    }
    out
}

fn linfa_centroids(points: &[Point], cfg: KMeansConfig) -> Result<Vec<Point>, LearnError> {
    use linfa::DatasetBase;
    use linfa::traits::Fit;
    use rand_xoshiro::Xoshiro256Plus;
    use rand_xoshiro::rand_core::SeedableRng as _;

    let flat: Vec<f64> = points.iter().flatten().copied().collect();
    let data = ndarray::Array2::from_shape_vec((points.len(), N_FEATURES), flat)
        .map_err(|e| LearnError::Invalid(format!("points: {e}")))?;
    let model =
        linfa_clustering::KMeans::params_with_rng(cfg.k, Xoshiro256Plus::seed_from_u64(cfg.seed))
            .n_runs(cfg.restarts.max(1))
            .max_n_iterations(cfg.max_iter as u64)
            .tolerance(1e-9)
            .fit(&DatasetBase::from(data))
            .map_err(|e| LearnError::Invalid(format!("k-means (linfa): {e}")))?;
    Ok(model
        .centroids()
        .rows()
        .into_iter()
        .map(|row| {
            let mut c = [0.0; N_FEATURES];
            for (x, v) in c.iter_mut().zip(row) {
                *x = *v;
            }
            c
        })
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

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
    fn a_seed_gives_the_same_fit_and_labels_follow_the_routers_rule() {
        let centres = [
            [0.0; 4],
            [3.0, 3.0, 0.0, 0.0],
            [0.0, 0.0, 3.0, 3.0],
            [3.0; 4],
        ];
        let (pts, _) = blobs(&centres, 50, 1.5, 3);
        let cfg = KMeansConfig {
            seed: 9,
            ..KMeansConfig::new(4)
        };
        let a = fit(&pts, cfg).expect("fit");
        assert_eq!(a, fit(&pts, cfg).expect("fit"), "deterministic in the seed");
        for (p, l) in pts.iter().zip(&a.labels) {
            assert_eq!(*l, nearest(&a.centroids, p));
        }
        let inertia: f64 = pts
            .iter()
            .zip(&a.labels)
            .map(|(p, l)| dist2(p, &a.centroids[*l]))
            .sum();
        assert!((inertia - a.inertia).abs() < 1e-9);
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

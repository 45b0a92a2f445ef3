//! Small statistics helpers: means, quantiles, the feature standardizer, dates.

use dolphin_router::dolphin::table::{N_FEATURES, Standardizer, Transform};
pub use dolphin_workload::stats::nearest_rank;

/// Mean and standard deviation (population); a zero deviation is reported as 1 so that
/// standardizing a constant feature gives 0 instead of dividing by zero.
pub fn mean_std(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let (mut n, mut sum) = (0usize, 0.0);
    for v in values.clone() {
        n += 1;
        sum += v;
    }
    if n == 0 {
        return (0.0, 1.0);
    }
    let mean = sum / n as f64;
    let var = values.map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
    let std = var.sqrt();
    (mean, if std > 1e-9 { std } else { 1.0 })
}

/// Median of unsorted values (`None` when empty).
pub fn median(values: &mut [u32]) -> Option<u32> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    Some(nearest_rank(values, 0.5))
}

/// Standardizer scale of a disabled feature. The router's table format has no "off" switch and
/// requires a finite positive `std`, so a disabled feature gets mean 0 and this scale: for any
/// finite input `ln(1 + x)` is below 710, so `z` is below 1e-297 and its square (or its
/// difference from a centroid or mixture mean of 0, squared) underflows to exactly 0. Every
/// distance and likelihood the router computes is then the same whatever the feature's value.
pub const DISABLED_FEATURE_STD: f64 = 1e300;

/// Fits the `ln(1 + x)` standardizer of raw feature vectors; `enabled[d] == false` gives
/// feature `d` mean 0 and [`DISABLED_FEATURE_STD`].
pub fn fit_standardizer(raw: &[[f64; N_FEATURES]], enabled: &[bool; N_FEATURES]) -> Standardizer {
    let (mut mean, mut std) = (Vec::new(), Vec::new());
    for d in 0..N_FEATURES {
        let (m, s) = if enabled[d] {
            mean_std(raw.iter().map(move |x| x[d].ln_1p()))
        } else {
            (0.0, DISABLED_FEATURE_STD)
        };
        mean.push(m);
        std.push(s);
    }
    Standardizer {
        transform: Transform::Log1p,
        mean,
        std,
    }
}

/// Applies a standardizer (the router's formula).
pub fn standardize(s: &Standardizer, raw: &[f64; N_FEATURES]) -> [f64; N_FEATURES] {
    let mut z = [0.0; N_FEATURES];
    for d in 0..N_FEATURES {
        z[d] = (raw[d].ln_1p() - s.mean[d]) / s.std[d];
    }
    z
}

pub use dolphin_router::request_log::{rfc3339, rfc3339_now as now_rfc3339};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        let (m, s) = mean_std([1.0, 3.0].into_iter());
        assert_eq!((m, s), (2.0, 1.0));
        assert_eq!(mean_std([5.0, 5.0].into_iter()), (5.0, 1.0));
        let v: Vec<u32> = (1..=9).collect();
        assert_eq!(nearest_rank(&v, 1.0 / 3.0), 3);
        assert_eq!(median(&mut [5, 1, 3]), Some(3));
        assert_eq!(median(&mut []), None);
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_417_600), "2025-11-29T12:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        let raw = [[0.0, 1.0, 2.0, 3.0], [0.0, 3.0, 4.0, 5.0]];
        let s = fit_standardizer(&raw, &[true; 4]);
        assert_eq!(s.std[0], 1.0, "constant feature");
        let z = standardize(&s, &[0.0, 1.0, 2.0, 3.0]);
        assert!((z[1] + 1.0).abs() < 1e-12);
        let s = fit_standardizer(&raw, &[true, true, true, false]);
        assert_eq!((s.mean[3], s.std[3]), (0.0, DISABLED_FEATURE_STD));
        for x in [0.0, 1.0, 4096.0, f64::from(u32::MAX), 1e300] {
            let z = standardize(&s, &[1.0, 1.0, 1.0, x])[3];
            assert_eq!(z * z, 0.0, "{x}: z = {z}");
        }
    }
}

//! Latency summaries: percentiles and mean of a set of samples, in microseconds.

use dolphin_workload::stats::nearest_rank;
use serde::Serialize;

/// Summary of latency samples, all in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean_us: f64,
    /// Median (nearest rank).
    pub p50_us: f64,
    /// 90th percentile (nearest rank).
    pub p90_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
    /// 99.9th percentile (nearest rank).
    pub p999_us: f64,
    /// Smallest sample.
    pub min_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

impl Summary {
    /// Summarizes samples given in nanoseconds (sorts them in place). Empty input gives zeros.
    pub fn from_nanos(samples: &mut [u64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        samples.sort_unstable();
        let us = |ns: u64| ns as f64 / 1_000.0;
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Summary {
            n: samples.len(),
            mean_us: sum as f64 / samples.len() as f64 / 1_000.0,
            p50_us: us(nearest_rank(samples, 0.5)),
            p90_us: us(nearest_rank(samples, 0.9)),
            p99_us: us(nearest_rank(samples, 0.99)),
            p999_us: us(nearest_rank(samples, 0.999)),
            min_us: us(samples[0]),
            max_us: us(samples[samples.len() - 1]),
        }
    }

    /// One line for the console: `p50 .. p99 .. mean ..`.
    pub fn line(&self) -> String {
        format!(
            "p50 {:>9.2} us  p99 {:>9.2} us  mean {:>9.2} us  (n={})",
            self.p50_us, self.p99_us, self.mean_us, self.n
        )
    }
}

/// Median of `values` (the mean of the two middle ones for an even count; 0 when empty).
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    match v.len() {
        0 => 0.0,
        n if n % 2 == 0 => (v[m - 1] + v[m]) / 2.0,
        _ => v[m],
    }
}

/// `d` in whole nanoseconds (saturating past 584 years).
pub fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median([]), 0.0);
    }

    #[test]
    fn summary_in_microseconds() {
        let mut v = vec![3_000, 1_000, 2_000];
        let s = Summary::from_nanos(&mut v);
        assert_eq!(s.n, 3);
        assert_eq!(s.p50_us, 2.0);
        assert_eq!(s.mean_us, 2.0);
        assert_eq!((s.min_us, s.max_us), (1.0, 3.0));
        assert_eq!(Summary::from_nanos(&mut []), Summary::default());
    }
}

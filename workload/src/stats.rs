//! The one percentile function of the workspace: the replay summary, table learning and the
//! benchmarks all report nearest-rank order statistics through it.

/// Nearest-rank quantile `q` (in [0, 1]) of sorted, non-empty `sorted`: the smallest sample with
/// at least a share `q` of the samples at or below it (`q` 0 gives the smallest).
///
/// # Panics
/// When `sorted` is empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> T {
    let n = sorted.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 0.5), 50);
        assert_eq!(nearest_rank(&v, 0.99), 99);
        assert_eq!(nearest_rank(&v, 1.0), 100);
        assert_eq!(nearest_rank(&v, 0.0), 1);
        assert_eq!(nearest_rank(&[7], 0.999), 7);
        assert_eq!(nearest_rank(&[1, 3, 3, 9, 12], 1.0 / 3.0), 3);
        assert_eq!(nearest_rank(&[0.5, 1.5], 0.5), 0.5);
    }
}

//! Fitting a [`SimProfile`]'s step-time model to measured steps, and saying how well it fits.
//!
//! Prefill: `t2 t^2 + t1 t + t0 + tc t c` over the pure prefill steps (c = context computed
//! before the chunk: 0, or a cached prefix). Decode:
//! `a2 a^2 + a1 a + a0 + per_seq b` over the pure decode steps (a = blocks read over blocks in
//! the pool, b = sequences). Both minimise the squared *relative* error, so a 5 ms step weighs as
//! much as a 5 s one, and every coefficient but `a2` is kept at or above zero (a negative cost
//! per token or per sequence would be an artefact of noise): the least-squares solution over
//! every subset of the constrained coefficients, the best that satisfies the constraints.
//! Mixed steps are not fitted; the report gives the profile's error on them (the profile
//! charges a mixed step the sum of its two parts).

use serde::{Deserialize, Serialize};

use super::measure::{StepSample, StepShape};
use crate::sim::{DecodeCost, PrefillCost, SimProfile};

/// Why no profile could be fitted.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// Too few distinct shapes of a kind to determine its coefficients.
    #[error("{kind}: {have} distinct measured shapes, at least {need} needed")]
    TooFewShapes {
        /// prefill or decode.
        kind: &'static str,
        /// Distinct shapes measured.
        have: usize,
        /// Distinct shapes needed.
        need: usize,
    },
    /// No subset of coefficients gave a solution within the constraints.
    #[error("{0}: no non-negative least-squares solution (are the timings all zero?)")]
    NoSolution(&'static str),
}

/// How well the fitted profile predicts one measured step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Residual {
    /// The step measured.
    #[serde(flatten)]
    pub shape: StepShape,
    /// Measured median, ms.
    pub measured_ms: f64,
    /// The profile's step time, ms.
    pub predicted_ms: f64,
    /// (predicted - measured) / measured.
    pub rel_error: f64,
    /// Whether the shape was used in the fit.
    pub fitted: bool,
}

/// Largest and median absolute relative error over one kind of step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorSummary {
    /// Steps of the kind.
    pub steps: usize,
    /// Median |relative error|.
    pub median_abs: f64,
    /// Largest |relative error|.
    pub max_abs: f64,
}

/// A fitted profile with its residuals.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProfileFit {
    /// The profile (timing fitted; sizes and link as given).
    pub profile: SimProfile,
    /// Every measured step against the profile.
    pub residuals: Vec<Residual>,
    /// Prefill steps from position 0 (fitted).
    pub prefill: ErrorSummary,
    /// Prefill steps after a cached context (fitted: they determine `tc`).
    pub prefill_after_context: ErrorSummary,
    /// Decode steps (fitted).
    pub decode: ErrorSummary,
    /// Mixed steps (not fitted).
    pub mixed: ErrorSummary,
}

/// Fits `base`'s step-time coefficients to `samples` measured on a pool of `total_blocks`
/// blocks, keeping its other fields. The decode floor becomes half the fastest decode step
/// measured (a bound for extrapolation, below every measurement).
pub fn fit_profile(
    mut base: SimProfile,
    samples: &[StepSample],
    total_blocks: u32,
) -> Result<ProfileFit, FitError> {
    let occupancy = |blocks: u32| f64::from(blocks) / f64::from(total_blocks.max(1));
    let prefill: Vec<(Vec<f64>, f64)> = samples
        .iter()
        .filter_map(|s| match s.shape {
            StepShape::Prefill { tokens, context } => {
                let t = f64::from(tokens);
                Some((vec![t * t, t, 1.0, t * f64::from(context)], s.ms))
            }
            _ => None,
        })
        .collect();
    let decode: Vec<(Vec<f64>, f64)> = samples
        .iter()
        .filter_map(|s| match s.shape {
            StepShape::Decode {
                batch, blocks_read, ..
            } => {
                let a = occupancy(blocks_read);
                Some((vec![a * a, a, 1.0, f64::from(batch)], s.ms))
            }
            _ => None,
        })
        .collect();
    need("prefill", &prefill, 4)?;
    need("decode", &decode, 4)?;
    let p = constrained_fit(&prefill, &[true, true, true, true])
        .ok_or(FitError::NoSolution("prefill"))?;
    let d = constrained_fit(&decode, &[false, true, true, true])
        .ok_or(FitError::NoSolution("decode"))?;
    let fastest = decode.iter().map(|(_, y)| *y).fold(f64::INFINITY, f64::min);
    base.prefill_ms = PrefillCost {
        t2: p[0],
        t1: p[1],
        t0: p[2],
        tc: p[3],
    };
    base.decode_ms = DecodeCost {
        a2: d[0],
        a1: d[1],
        a0: d[2],
        per_seq: d[3],
        floor: 0.5 * fastest,
    };
    let residuals: Vec<Residual> = samples
        .iter()
        .map(|s| {
            let (predicted, fitted) = match s.shape {
                StepShape::Prefill { tokens, context } => (
                    base.prefill_ms(tokens)
                        + base.prefill_context_ms(u64::from(tokens) * u64::from(context)),
                    true,
                ),
                StepShape::Decode {
                    batch, blocks_read, ..
                } => (base.decode_ms(batch, occupancy(blocks_read)), true),
                StepShape::Mixed {
                    tokens,
                    batch,
                    blocks_read,
                    ..
                } => (base.step_ms(tokens, batch, occupancy(blocks_read)), false),
            };
            Residual {
                shape: s.shape,
                measured_ms: s.ms,
                predicted_ms: predicted,
                rel_error: if s.ms > 0.0 {
                    (predicted - s.ms) / s.ms
                } else {
                    0.0
                },
                fitted,
            }
        })
        .collect();
    let summary = |keep: fn(&StepShape) -> bool| {
        ErrorSummary::of(
            residuals
                .iter()
                .filter(|r| keep(&r.shape))
                .map(|r| r.rel_error),
        )
    };
    Ok(ProfileFit {
        profile: base,
        prefill: summary(|s| matches!(s, StepShape::Prefill { context: 0, .. })),
        prefill_after_context: summary(
            |s| matches!(s, StepShape::Prefill { context, .. } if *context > 0),
        ),
        decode: summary(|s| matches!(s, StepShape::Decode { .. })),
        mixed: summary(|s| matches!(s, StepShape::Mixed { .. })),
        residuals,
    })
}

impl ErrorSummary {
    fn of(errors: impl Iterator<Item = f64>) -> Self {
        let mut abs: Vec<f64> = errors.map(f64::abs).collect();
        abs.sort_by(f64::total_cmp);
        Self {
            steps: abs.len(),
            median_abs: abs.get(abs.len() / 2).copied().unwrap_or(0.0),
            max_abs: abs.last().copied().unwrap_or(0.0),
        }
    }
}

fn need(kind: &'static str, rows: &[(Vec<f64>, f64)], n: usize) -> Result<(), FitError> {
    let mut distinct: Vec<Vec<u64>> = rows
        .iter()
        .map(|(x, _)| x.iter().map(|v| v.to_bits()).collect())
        .collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < n {
        return Err(FitError::TooFewShapes {
            kind,
            have: distinct.len(),
            need: n,
        });
    }
    Ok(())
}

/// Least squares of the relative error over `rows` (features, target), with the coefficients
/// flagged in `nonneg` kept at or above zero: every subset of those coefficients is pinned to
/// zero in turn, and the best feasible solution wins (at most 2^4 solves here).
fn constrained_fit(rows: &[(Vec<f64>, f64)], nonneg: &[bool]) -> Option<Vec<f64>> {
    let n = nonneg.len();
    let mut best: Option<(f64, Vec<f64>)> = None;
    for pinned in 0u32..(1 << n) {
        if (0..n).any(|j| pinned & (1 << j) != 0 && !nonneg[j]) {
            continue;
        }
        let free: Vec<usize> = (0..n).filter(|j| pinned & (1 << j) == 0).collect();
        if free.is_empty() {
            continue;
        }
        let Some(sol) = relative_least_squares(rows, &free) else {
            continue;
        };
        let mut coef = vec![0.0; n];
        for (k, &j) in free.iter().enumerate() {
            coef[j] = sol[k];
        }
        if (0..n).any(|j| nonneg[j] && coef[j] < 0.0) {
            continue;
        }
        let err: f64 = rows
            .iter()
            .filter(|(_, y)| *y > 0.0)
            .map(|(x, y)| {
                let p: f64 = x.iter().zip(&coef).map(|(a, c)| a * c).sum();
                ((p - y) / y).powi(2)
            })
            .sum();
        if best.as_ref().is_none_or(|(e, _)| err < *e) {
            best = Some((err, coef));
        }
    }
    best.map(|(_, c)| c)
}

/// Solves min sum(((x[cols] . c) - y) / y)^2 by the normal equations; `None` when singular.
fn relative_least_squares(rows: &[(Vec<f64>, f64)], cols: &[usize]) -> Option<Vec<f64>> {
    let k = cols.len();
    let mut ata = vec![vec![0.0; k]; k];
    let mut atb = vec![0.0; k];
    for (x, y) in rows.iter().filter(|(_, y)| *y > 0.0) {
        let w = 1.0 / y;
        for i in 0..k {
            let xi = x[cols[i]] * w;
            atb[i] += xi * y * w;
            for j in 0..k {
                ata[i][j] += xi * x[cols[j]] * w;
            }
        }
    }
    solve(ata, atb)
}

/// Gaussian elimination with partial pivoting; `None` for a (near-)singular system.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    let scale = a
        .iter()
        .flatten()
        .fold(0.0f64, |m, v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() <= scale * 1e-14 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (top, rest) = a.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for (k, row) in rest.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[col + 1 + k] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|c| a[row][c] * x[c]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solve_recovers_a_known_system() {
        let x = solve(
            vec![
                vec![2.0, 1.0, 0.0],
                vec![1.0, 3.0, 1.0],
                vec![0.0, 1.0, 4.0],
            ],
            vec![4.0, 10.0, 14.0],
        )
        .expect("regular");
        for (got, want) in x.iter().zip([1.0, 2.0, 3.0]) {
            assert!((got - want).abs() < 1e-12, "{x:?}");
        }
        assert!(solve(vec![vec![1.0, 2.0], vec![2.0, 4.0]], vec![1.0, 2.0]).is_none());
    }

    #[test]
    fn a_negative_coefficient_is_pinned_to_zero() {
        // y = 2 t exactly, plus a dip that an unconstrained fit would answer with t0 < 0.
        let rows: Vec<(Vec<f64>, f64)> = [(10.0, 19.0), (20.0, 40.0), (40.0, 80.0), (80.0, 160.0)]
            .iter()
            .map(|&(t, y)| (vec![t, 1.0], y))
            .collect();
        let c = constrained_fit(&rows, &[true, true]).expect("fit");
        assert!(c[1] >= 0.0 && (c[0] - 2.0).abs() < 0.05, "{c:?}");
    }

    #[test]
    fn too_few_shapes_is_an_error_not_a_guess() {
        let s = |tokens| StepSample {
            shape: StepShape::Prefill { tokens, context: 0 },
            ms: 1.0,
            runs_ms: vec![1.0],
        };
        let base = SimProfile::builtin("dynamo-mocker").expect("shipped");
        let err = fit_profile(base, &[s(16), s(16), s(32), s(64)], 100).expect_err("3 shapes");
        assert!(
            matches!(
                err,
                FitError::TooFewShapes {
                    kind: "prefill",
                    have: 3,
                    need: 4
                }
            ),
            "{err}"
        );
    }
}

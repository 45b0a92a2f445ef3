//! Token sampling from logits: greedy, temperature, top-k, top-p, seeded.
//!
//! The randomness of each draw is a function of the request's seed and the position of the
//! token being drawn (not a stream advanced draw by draw), so a sequence whose first token was
//! sampled on a prefill worker continues on the decode worker exactly as it would have locally.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::BackendError;
use crate::types::{Sampling, TokenStats};

/// One sequence's sampling state.
#[derive(Debug)]
pub(crate) struct Sampler {
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
    seed: u64,
    /// (scaled logit, token) candidates, reused between draws.
    scratch: Vec<(f32, u32)>,
}

impl Sampler {
    /// A sampler for `s`; `fallback_seed` is used when the request names no seed.
    pub fn new(s: &Sampling, fallback_seed: u64) -> Sampler {
        Sampler {
            temperature: s.temperature,
            top_k: s.top_k.map(|k| k.get() as usize),
            top_p: s.top_p.filter(|&p| p > 0.0 && p < 1.0),
            seed: s.seed.unwrap_or(fallback_seed),
            scratch: Vec::new(),
        }
    }

    /// Whether this sampler always takes the most likely token.
    pub fn is_greedy(&self) -> bool {
        // NaN or non-positive temperatures are greedy too.
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == Some(1)
    }

    /// Picks the token at `position` from `logits`.
    pub fn sample(&mut self, logits: &[f32], position: u32) -> Result<u32, BackendError> {
        if logits.is_empty() || logits.iter().any(|x| x.is_nan()) {
            return Err(BackendError::Compute("logits are empty or NaN".into()));
        }
        if self.is_greedy() {
            return Ok(argmax(logits));
        }
        let t = self.temperature;
        let c = &mut self.scratch;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (l / t, i as u32)));
        // Highest first; ties by lower id, so the order is total and reproducible.
        let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if let Some(k) = self.top_k
            && k < c.len()
        {
            c.select_nth_unstable_by(k - 1, desc);
            c.truncate(k);
        }
        if self.top_p.is_some() || self.top_k.is_some() {
            c.sort_unstable_by(desc);
        }
        let max = c.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.0));
        for x in c.iter_mut() {
            x.0 = (x.0 - max).exp();
        }
        let total: f64 = c.iter().map(|x| f64::from(x.0)).sum();
        let mut keep = c.len();
        if let Some(p) = self.top_p {
            let target = f64::from(p) * total;
            let mut acc = 0.0;
            for (i, x) in c.iter().enumerate() {
                acc += f64::from(x.0);
                if acc >= target {
                    keep = i + 1;
                    break;
                }
            }
        }
        let kept = &c[..keep];
        let mass: f64 = kept.iter().map(|x| f64::from(x.0)).sum();
        let mut rng = StdRng::seed_from_u64(draw_seed(self.seed, position));
        let mut u = rng.random::<f64>() * mass;
        for x in kept {
            u -= f64::from(x.0);
            if u < 0.0 {
                return Ok(x.1);
            }
        }
        // Rounding left a sliver past the last candidate.
        Ok(kept[keep - 1].1)
    }
}

/// Statistics of `softmax(logits)` for the drawn `token`: its probability, the entropy in nats
/// and the top-2 margin. One pass for the maximum and the top two, one for the normalizer and
/// the entropy sum: `H = log Z - sum(p_i * (l_i - max))`, with `Z = sum(exp(l_i - max))`.
pub(crate) fn token_stats(logits: &[f32], token: u32) -> TokenStats {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in logits {
        if x > first {
            second = first;
            first = x;
        } else if x > second {
            second = x;
        }
    }
    if !first.is_finite() {
        return TokenStats::default();
    }
    let (mut z, mut weighted) = (0.0f64, 0.0f64);
    for &x in logits {
        let d = f64::from(x - first);
        let e = d.exp();
        if e > 0.0 {
            // Tokens at -inf (masked) weigh nothing (and 0 * -inf would be NaN).
            z += e;
            weighted += e * d;
        }
    }
    let p = |x: f32| (f64::from(x - first).exp() / z) as f32;
    let picked = logits.get(token as usize).copied().map_or(0.0, p);
    let second_p = if second.is_finite() { p(second) } else { 0.0 };
    TokenStats {
        prob: picked,
        entropy: (z.ln() - weighted / z).max(0.0) as f32,
        margin: p(first) - second_p,
    }
}

/// Index of the largest logit (the first one on ties).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Seed of the draw at `position` (a SplitMix64 step over both).
fn draw_seed(seed: u64, position: u32) -> u64 {
    let mut z = seed ^ u64::from(position).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test shorthand: `top_k` 0 and `top_p` 1.0 mean off.
    fn sampling(temperature: f32, top_k: u32, top_p: f32, seed: Option<u64>) -> Sampling {
        Sampling {
            temperature,
            top_k: std::num::NonZeroU32::new(top_k),
            top_p: (top_p < 1.0).then_some(top_p),
            seed,
            ..Sampling::default()
        }
    }

    const LOGITS: [f32; 6] = [0.1, 2.0, 1.9, -1.0, 2.0, 0.5];

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(&Sampling::default(), 1);
        assert_eq!(s.sample(&LOGITS, 0).unwrap(), 1);
        let mut k1 = Sampler::new(&sampling(1.5, 1, 1.0, None), 7);
        assert_eq!(k1.sample(&LOGITS, 3).unwrap(), 1);
    }

    #[test]
    fn same_seed_and_position_give_the_same_token() {
        let mut a = Sampler::new(&sampling(1.0, 0, 1.0, Some(42)), 0);
        let mut b = Sampler::new(&sampling(1.0, 0, 1.0, Some(42)), 99);
        let xs: Vec<u32> = (0..64).map(|p| a.sample(&LOGITS, p).unwrap()).collect();
        // Drawing out of order gives the same tokens: draws depend on the position only.
        let mut ys: Vec<u32> = (0..64)
            .rev()
            .map(|p| b.sample(&LOGITS, p).unwrap())
            .collect();
        ys.reverse();
        assert_eq!(xs, ys);
        assert!(
            xs.iter().any(|&t| t != xs[0]),
            "a temperature-1 draw varies: {xs:?}"
        );
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let mut k2 = Sampler::new(&sampling(5.0, 2, 1.0, Some(3)), 0);
        for p in 0..200 {
            let t = k2.sample(&LOGITS, p).unwrap();
            assert!(t == 1 || t == 4, "top-2 drew {t}");
        }
        // The two tied leaders hold well over 10% of the mass: top-p 0.1 keeps only the first.
        let mut p01 = Sampler::new(&sampling(1.0, 0, 0.1, Some(3)), 0);
        for p in 0..50 {
            assert_eq!(p01.sample(&LOGITS, p).unwrap(), 1);
        }
    }

    #[test]
    fn temperature_follows_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let mut s = Sampler::new(&sampling(1.0, 0, 1.0, Some(11)), 0);
        let ones = (0..4000)
            .filter(|&p| s.sample(&logits, p).unwrap() == 1)
            .count();
        assert!((2800..3200).contains(&ones), "{ones} of 4000");
    }

    #[test]
    fn stats_match_the_softmax() {
        // Two tokens at ln 3 and 0: p = 0.75, 0.25.
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let s = token_stats(&logits, 1);
        assert!((s.prob - 0.75).abs() < 1e-6, "{s:?}");
        assert!((s.margin - 0.5).abs() < 1e-6, "{s:?}");
        let h = -(0.75f64 * 0.75f64.ln() + 0.25 * 0.25f64.ln());
        assert!((f64::from(s.entropy) - h).abs() < 1e-6, "{s:?}");
        let uniform = token_stats(&[1.0; 8], 3);
        assert!((f64::from(uniform.entropy) - 8f64.ln()).abs() < 1e-6);
        assert_eq!(uniform.margin, 0.0);
    }

    #[test]
    fn nan_logits_are_an_error() {
        let mut s = Sampler::new(&Sampling::default(), 1);
        assert!(s.sample(&[0.0, f32::NAN], 0).is_err());
        assert!(s.sample(&[], 0).is_err());
    }
}

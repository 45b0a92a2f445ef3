//! What the router knows about a request's output before it runs: its admission sketch.
//!
//! The output-length classifier sees only features known at admission: the prompt length, the
//! requested `max_tokens`, the prompt's *prefix family* (a hash of its first tokens: requests
//! built on one template or system prompt share it) and hashed features of its first tokens (the
//! instruction usually sits there: "summarize" and "write a story" ask for different lengths).
//! The sketch is computed once per request with no allocation, written to the request log (so
//! training sees exactly what inference sees), and turned into model inputs by
//! [`visit_features`], the one definition shared by the router and the trainer.

use serde::{Deserialize, Serialize};

/// Leading tokens that define a prompt's prefix family.
pub const PREFIX_FAMILY_TOKENS: usize = 16;
/// Leading tokens sketched as hashed features.
pub const HEAD_TOKENS: usize = 32;
/// Dense inputs: `ln(1 + prompt length)`, `ln(1 + max_tokens)`.
pub const N_DENSE: usize = 2;

/// The admission sketch of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Prompt tokens.
    pub isl: u32,
    /// Requested maximum output tokens.
    pub max_tokens: u32,
    /// Hash of the first [`PREFIX_FAMILY_TOKENS`] tokens.
    pub prefix_hash: u64,
    /// 16-bit hashes of the first [`HEAD_TOKENS`] tokens (`head_len` of them are used).
    pub head: [u16; HEAD_TOKENS],
    /// How many entries of `head` are set.
    pub head_len: u8,
}

/// 16-bit hash of a token id (splitmix64's finalizer; token ids themselves do not go into the log).
pub fn token_hash(token: u32) -> u16 {
    let mut x = u64::from(token).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((x ^ (x >> 31)) >> 48) as u16
}

impl Admission {
    /// The sketch of a prompt.
    pub fn new(tokens: &[u32], max_tokens: u32) -> Admission {
        let family = &tokens[..tokens.len().min(PREFIX_FAMILY_TOKENS)];
        let mut head = [0u16; HEAD_TOKENS];
        let n = tokens.len().min(HEAD_TOKENS);
        for (h, t) in head.iter_mut().zip(&tokens[..n]) {
            *h = token_hash(*t);
        }
        Admission {
            isl: tokens.len() as u32,
            max_tokens,
            prefix_hash: dolphin_cluster::chain_hash(None, family),
            head,
            head_len: n as u8,
        }
    }

    /// The sketch as logged.
    pub fn to_record(&self) -> AdmissionRecord {
        AdmissionRecord {
            max_tokens: self.max_tokens,
            prefix_hash: self.prefix_hash,
            head_hashes: self.head[..usize::from(self.head_len)].to_vec(),
        }
    }

    /// The sketch of a logged request (`isl` from the record's prompt length).
    pub fn from_record(isl: u32, r: &AdmissionRecord) -> Admission {
        let mut head = [0u16; HEAD_TOKENS];
        let n = r.head_hashes.len().min(HEAD_TOKENS);
        head[..n].copy_from_slice(&r.head_hashes[..n]);
        Admission {
            isl,
            max_tokens: r.max_tokens,
            prefix_hash: r.prefix_hash,
            head,
            head_len: n as u8,
        }
    }
}

/// The admission sketch in the request log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionRecord {
    /// Requested maximum output tokens.
    pub max_tokens: u32,
    /// Hash of the first tokens (the prefix family before bucketing).
    pub prefix_hash: u64,
    /// 16-bit hashes of the first tokens.
    pub head_hashes: Vec<u16>,
}

/// Shape of the classifier's input vector: dense inputs, then `n_family` one-hot prefix-family
/// buckets, then `n_hash` hashed-token buckets (both powers of two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputShape {
    /// Prefix-family buckets.
    pub n_family: usize,
    /// Hashed-token buckets.
    pub n_hash: usize,
}

impl InputShape {
    /// Length of the input vector.
    pub fn dim(&self) -> usize {
        N_DENSE + self.n_family + self.n_hash
    }
}

/// Calls `f(index, value)` for each non-zero input of the classifier (indices may repeat: the
/// values add up). `mean` and `std` standardize the dense inputs.
pub fn visit_features(
    a: &Admission,
    shape: InputShape,
    mean: &[f64; N_DENSE],
    std: &[f64; N_DENSE],
    mut f: impl FnMut(usize, f64),
) {
    let dense = [f64::from(a.isl).ln_1p(), f64::from(a.max_tokens).ln_1p()];
    for i in 0..N_DENSE {
        f(i, (dense[i] - mean[i]) / std[i]);
    }
    // Power-of-two bucket counts: the modulo is a mask.
    let family = (a.prefix_hash as usize) & (shape.n_family - 1);
    f(N_DENSE + family, 1.0);
    let n = usize::from(a.head_len);
    if n > 0 {
        let v = 1.0 / n as f64;
        let base = N_DENSE + shape.n_family;
        for h in &a.head[..n] {
            f(base + (usize::from(*h) & (shape.n_hash - 1)), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sketch_is_deterministic_and_roundtrips_through_the_log() {
        let tokens: Vec<u32> = (0..100).collect();
        let a = Admission::new(&tokens, 64);
        assert_eq!(a, Admission::new(&tokens, 64));
        assert_eq!(a.isl, 100);
        assert_eq!(usize::from(a.head_len), HEAD_TOKENS);
        // Only the first tokens define the family.
        let mut other = tokens.clone();
        other[50] = 7;
        assert_eq!(Admission::new(&other, 64).prefix_hash, a.prefix_hash);
        other[0] = 7;
        assert_ne!(Admission::new(&other, 64).prefix_hash, a.prefix_hash);
        let rec = a.to_record();
        let json = serde_json::to_string(&rec).expect("json");
        let back: AdmissionRecord = serde_json::from_str(&json).expect("parse");
        assert_eq!(Admission::from_record(100, &back), a);
        let short = Admission::new(&[5, 6], 8);
        assert_eq!(short.head_len, 2);
        assert_eq!(short.to_record().head_hashes.len(), 2);
    }

    #[test]
    fn features_land_in_their_blocks() {
        let a = Admission::new(&[1, 2, 3, 4], 100);
        let shape = InputShape {
            n_family: 8,
            n_hash: 16,
        };
        let mut x = vec![0.0; shape.dim()];
        visit_features(&a, shape, &[0.0; 2], &[1.0; 2], |i, v| x[i] += v);
        assert!((x[0] - 5f64.ln()).abs() < 1e-12);
        assert!((x[1] - 101f64.ln()).abs() < 1e-12);
        assert_eq!(x[2..10].iter().sum::<f64>(), 1.0);
        assert!((x[10..].iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_ne!(token_hash(1), token_hash(2));
    }
}

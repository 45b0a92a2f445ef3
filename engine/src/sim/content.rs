//! The sim's stand-in for KV content and sampling: deterministic functions of tokens and
//! positions, so two engines that compute (or receive intact) the same prompt hold the same
//! "KV" and produce the same tokens, and a corrupt or misplaced block is detected byte for byte.
//! Nothing is stored: block bytes are generated on export and regenerated to verify an import.

use bytes::Bytes;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// End-of-sequence id; produced only when the profile's `eos_probability` asks for it.
pub const EOS_TOKEN: u32 = 2;
/// First id of the sim tokenizer's printable range.
pub const FIRST_TOKEN: u32 = 3;
/// Last id of the sim tokenizer's printable range (ids 3..=98 map to printable ASCII).
pub const LAST_TOKEN: u32 = 98;

/// Seed of a sequence digest before any block is folded in.
pub const DIGEST_SEED: u64 = 0x6b76_6469_6765_7374; // "kvdigest"

/// Seed of the byte stream of block `index` whose content has chained hash `chain` (the hash of
/// all tokens up to the block's last filled one).
pub fn block_seed(chain: u64, index: u32) -> u64 {
    xxh3_64_with_seed(&index.to_le_bytes(), chain)
}

/// SplitMix64: a fast, well-mixed stream of words from a seed.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Fills `out` with the byte stream of `seed`.
pub fn fill(seed: u64, out: &mut [u8]) {
    let mut s = Stream(seed);
    for chunk in out.chunks_mut(8) {
        let word = s.next().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// The first `len` bytes of the stream of `seed`.
pub fn generate(seed: u64, len: usize) -> Bytes {
    let mut buf = vec![0u8; len];
    fill(seed, &mut buf);
    Bytes::from(buf)
}

/// Offset of the first byte of `data` that differs from the stream of `seed`, if any.
pub fn first_mismatch(seed: u64, data: &[u8]) -> Option<usize> {
    let mut s = Stream(seed);
    for (i, chunk) in data.chunks(8).enumerate() {
        let word = s.next().to_le_bytes();
        if chunk != &word[..chunk.len()] {
            let j = chunk
                .iter()
                .zip(word)
                .position(|(a, b)| *a != b)
                .unwrap_or(0);
            return Some(i * 8 + j);
        }
    }
    None
}

/// Folds the next block's stream seed into a prompt digest (which starts at [`DIGEST_SEED`]).
pub fn digest_step(digest: u64, seed: u64) -> u64 {
    xxh3_64_with_seed(&seed.to_le_bytes(), digest)
}

/// The token at `position` of a sequence whose tokens before it hash to `context`: a printable
/// id (capped below `vocab_size`), or [`EOS_TOKEN`] with probability `eos_probability`.
pub fn token(context: u64, position: u32, vocab_size: u32, eos_probability: f64) -> u32 {
    let v = xxh3_64_with_seed(&position.to_le_bytes(), context);
    if eos_probability > 0.0 {
        // The top 53 bits as a uniform draw in [0, 1).
        let u = (v >> 11) as f64 / (1u64 << 53) as f64;
        if u < eos_probability {
            return EOS_TOKEN;
        }
    }
    let last = LAST_TOKEN
        .min(vocab_size.saturating_sub(1))
        .max(FIRST_TOKEN);
    FIRST_TOKEN + (v % u64::from(last - FIRST_TOKEN + 1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_deterministic_and_seed_dependent() {
        let a = generate(7, 37);
        assert_eq!(a, generate(7, 37));
        assert_ne!(a, generate(8, 37));
        assert_eq!(
            &generate(7, 100)[..37],
            &a[..],
            "a prefix of a longer stream"
        );
        assert_eq!(first_mismatch(7, &a), None);
    }

    #[test]
    fn mismatch_reports_the_first_differing_byte() {
        let mut a = generate(11, 50).to_vec();
        a[19] ^= 0x40;
        a[30] ^= 1;
        assert_eq!(first_mismatch(11, &a), Some(19));
        assert_eq!(
            first_mismatch(12, &generate(11, 50)).map(|o| o < 8),
            Some(true)
        );
    }

    #[test]
    fn tokens_stay_in_the_printable_range_without_eos() {
        for pos in 0..2000 {
            let t = token(0xabc, pos, 99, 0.0);
            assert!((FIRST_TOKEN..=LAST_TOKEN).contains(&t), "{t}");
        }
        let small: Vec<u32> = (0..200).map(|p| token(1, p, 10, 0.0)).collect();
        assert!(small.iter().all(|t| (3..=9).contains(t)));
        assert!(small.contains(&3) && small.contains(&9));
    }

    #[test]
    fn eos_probability_one_always_ends() {
        assert!((0..50).all(|p| token(5, p, 99, 1.0) == EOS_TOKEN));
        let some = (0..1000)
            .filter(|&p| token(5, p, 99, 0.1) == EOS_TOKEN)
            .count();
        assert!(
            (40..200).contains(&some),
            "{some} EOS in 1000 draws at p = 0.1"
        );
    }

    #[test]
    fn digest_depends_on_order() {
        let fold = |seeds: &[u64]| seeds.iter().fold(DIGEST_SEED, |d, &s| digest_step(d, s));
        assert_ne!(fold(&[1, 2]), fold(&[2, 1]));
        assert_ne!(fold(&[1]), fold(&[1, 1]));
    }
}

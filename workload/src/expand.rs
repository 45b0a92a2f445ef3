//! Expanding a hash-id prompt into token ids, deterministically.
//!
//! Live replay needs real token ids whose prefix structure is the trace's: two prompts that
//! share a leading run of hash ids must share exactly those tokens (so the router's block hashes
//! and the workers' prefix caches see the sharing), and nothing else. Each token is a hash of
//! (id, position within the id), so no table of expanded ids is kept.

use std::ops::Range;

/// Domain separators: content of a hash id, and content of one request alone.
const ID_DOMAIN: u64 = 0x6964_5f63_6f6e_7465; // "id_conte"
const TAIL_DOMAIN: u64 = 0x7461_696c_5f63_6f6e; // "tail_con"

/// SplitMix64's finaliser: a fast, well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash3(domain: u64, a: u64, b: u64) -> u64 {
    mix(mix(mix(domain) ^ a) ^ b)
}

/// The `prompt_len` token ids, all in `vocab`, of a prompt described by hash ids: the tokens
/// at positions `[j * tokens_per_id, (j + 1) * tokens_per_id)` are a function of `ids[j]` and
/// the position within the id alone, so every prompt holding id `i` at the same place has the
/// same tokens there. Positions past the ids (when they cover less than `prompt_len`) are
/// content of this request alone, seeded by `salt` (the request's index). Ids beyond
/// `prompt_len` are ignored.
///
/// # Panics
/// If `vocab` is empty.
pub fn expand_prompt(
    ids: &[u64],
    tokens_per_id: u32,
    prompt_len: u32,
    salt: u64,
    vocab: Range<u32>,
) -> Vec<u32> {
    assert!(
        !vocab.is_empty(),
        "expand_prompt: empty vocabulary {vocab:?}"
    );
    let span = u64::from(vocab.end - vocab.start);
    let token = |h: u64| vocab.start + (h % span) as u32;
    let per_id = u64::from(tokens_per_id);
    (0..u64::from(prompt_len))
        .map(|pos| {
            let (j, within) = match pos.checked_div(per_id) {
                Some(j) => (j, pos % per_id),
                None => (u64::MAX, 0),
            };
            match usize::try_from(j).ok().and_then(|j| ids.get(j)) {
                Some(&id) => token(hash3(ID_DOMAIN, id, within)),
                None => token(hash3(TAIL_DOMAIN, salt, pos)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: Range<u32> = 100..49_152;

    #[test]
    fn same_id_same_tokens_and_exact_length() {
        let a = expand_prompt(&[7, 8, 9], 512, 1500, 0, VOCAB);
        let b = expand_prompt(&[7, 8, 10], 512, 1536, 1, VOCAB);
        assert_eq!(a.len(), 1500);
        assert_eq!(b.len(), 1536);
        assert_eq!(a[..1024], b[..1024]);
        // A different third id: its block differs (almost) everywhere.
        let same = a[1024..]
            .iter()
            .zip(&b[1024..])
            .filter(|(x, y)| x == y)
            .count();
        assert!(same < 5, "{same} equal tokens in different ids");
        // Deterministic, whatever the salt, where ids cover the prompt.
        assert_eq!(a, expand_prompt(&[7, 8, 9], 512, 1500, 99, VOCAB));
        assert!(a.iter().chain(&b).all(|t| VOCAB.contains(t)));
    }

    #[test]
    fn different_ids_differ_and_tokens_vary_within_an_id() {
        let a = expand_prompt(&[1], 512, 512, 0, VOCAB);
        let b = expand_prompt(&[2], 512, 512, 0, VOCAB);
        assert_ne!(a, b);
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(
            distinct.len() > 400,
            "{} distinct tokens of 512",
            distinct.len()
        );
        // Large ids are not truncated to 32 bits.
        let hi = expand_prompt(&[1 + (1 << 32)], 512, 512, 0, VOCAB);
        assert_ne!(a, hi);
    }

    #[test]
    fn positions_past_the_ids_belong_to_the_request() {
        let a = expand_prompt(&[5], 16, 40, 1, VOCAB);
        let b = expand_prompt(&[5], 16, 40, 2, VOCAB);
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16..], b[16..]);
        assert_eq!(a, expand_prompt(&[5], 16, 40, 1, VOCAB));
        // No ids at all, or zero tokens per id: all of it is the request's own.
        assert_eq!(expand_prompt(&[], 512, 10, 3, VOCAB).len(), 10);
        assert_eq!(
            expand_prompt(&[5], 0, 10, 3, VOCAB),
            expand_prompt(&[], 512, 10, 3, VOCAB)
        );
        // A one-token vocabulary.
        assert!(expand_prompt(&[5], 16, 40, 1, 7..8).iter().all(|&t| t == 7));
    }

    #[test]
    #[should_panic(expected = "empty vocabulary")]
    fn an_empty_vocabulary_panics() {
        expand_prompt(&[1], 512, 4, 0, 5..5);
    }
}

//! Byte-level BPE over token ids.
//!
//! A word starts as one token per byte (the byte's alphabet character is always in a GPT-2
//! vocabulary); then the adjacent pair with the lowest merge rank is merged, the leftmost first
//! among equal ranks, until no adjacent pair has a merge. This is the order llama.cpp and
//! Hugging Face `tokenizers` both use (a priority queue of (rank, position) with stale entries
//! skipped), so it is O(n log n) in the word length even for a 100 kB run of one character.
//! Merges are keyed by the pair of token ids: no string is built while encoding.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Marks "no neighbour" in the symbol list.
const NONE: u32 = u32::MAX;
/// Id of a symbol merged into its left neighbour (no real token has it: ids are < vocab size).
const DEAD: u32 = u32::MAX;
/// Id of a byte whose character the vocabulary lacks (SmolLM2 lacks 21, e.g. 0x04 and 0xF1):
/// it takes part in no merge and is dropped from the output, as llama.cpp and `tokenizers` do.
const MISSING: u32 = u32::MAX - 1;

/// Hasher for the packed (left, right) id pairs: the keys come from the model file, not from
/// users, so a fast multiplicative mix is enough (no HashDoS concern).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let x = (n ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Fold the high bits down: the table indexes by low bits and tags by high bits.
        self.0 = x ^ (x >> 29);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// What merging a pair gives.
#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    id: u32,
}

/// One symbol of a word being merged, in a doubly linked list over a vector.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
}

/// (rank, left position, left id, right id, merged id), smallest rank then leftmost first.
type Candidate = Reverse<(u32, u32, u32, u32, u32)>;

/// Buffers reused across words, so encoding a text allocates a handful of times.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Candidate>,
}

/// The merge table and the byte tokens.
#[derive(Clone, Debug)]
pub(crate) struct Bpe {
    merges: HashMap<u64, Merge, BuildHasherDefault<PairHasher>>,
    /// Token of each byte's character; [`MISSING`] where the vocabulary has none.
    byte_ids: [u32; 256],
}

impl Bpe {
    /// `merges` in rank order as (left id, right id, merged id); a pair listed twice keeps its
    /// first rank (as llama.cpp does). `byte_ids[b]` is the token of byte `b`'s character, if
    /// the vocabulary has one. Ids must be below `u32::MAX - 1`.
    pub(crate) fn new(
        merges: impl IntoIterator<Item = (u32, u32, u32)>,
        byte_ids: [Option<u32>; 256],
    ) -> Bpe {
        let mut map: HashMap<u64, Merge, BuildHasherDefault<PairHasher>> = HashMap::default();
        for (rank, (l, r, id)) in merges.into_iter().enumerate() {
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            map.entry(pair_key(l, r)).or_insert(Merge { rank, id });
        }
        Bpe {
            merges: map,
            byte_ids: byte_ids.map(|id| id.unwrap_or(MISSING)),
        }
    }

    /// Number of distinct merges.
    pub(crate) fn merge_count(&self) -> usize {
        self.merges.len()
    }

    fn candidate(&self, syms: &[Symbol], left: u32) -> Option<Candidate> {
        let l = syms[left as usize];
        if l.next == NONE {
            return None;
        }
        let r = syms[l.next as usize];
        let m = self.merges.get(&pair_key(l.id, r.id))?;
        Some(Reverse((m.rank, left, l.id, r.id, m.id)))
    }

    /// Appends the tokens of `word` (one pre-tokenized word's bytes) to `out`.
    pub(crate) fn encode_word(&self, word: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        match word {
            [] => return,
            [b] => {
                let id = self.byte_ids[usize::from(*b)];
                if id != MISSING {
                    out.push(id);
                }
                return;
            }
            _ => {}
        }
        let Scratch {
            symbols: syms,
            heap,
        } = scratch;
        syms.clear();
        heap.clear();
        let n = word.len() as u32;
        syms.extend(word.iter().enumerate().map(|(i, &b)| {
            let i = i as u32;
            Symbol {
                id: self.byte_ids[usize::from(b)],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
            }
        }));
        for i in 0..n - 1 {
            heap.extend(self.candidate(syms, i));
        }
        while let Some(Reverse((_, left, left_id, right_id, merged))) = heap.pop() {
            let l = syms[left as usize];
            // Skip entries made stale by an earlier merge of either side.
            if l.id != left_id || l.next == NONE || syms[l.next as usize].id != right_id {
                continue;
            }
            let right = l.next as usize;
            let after = syms[right].next;
            syms[right].id = DEAD;
            let l = &mut syms[left as usize];
            l.id = merged;
            l.next = after;
            let prev = l.prev;
            if after != NONE {
                syms[after as usize].prev = left;
                heap.extend(self.candidate(syms, left));
            }
            if prev != NONE {
                heap.extend(self.candidate(syms, prev));
            }
        }
        // The first symbol is never merged into a left neighbour, so the list starts at 0.
        let mut i = 0;
        while i != NONE {
            let s = syms[i as usize];
            if s.id != MISSING {
                out.push(s.id);
            }
            i = s.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vocabulary: 0..256 bytes as themselves, then merged tokens.
    fn byte_ids() -> [Option<u32>; 256] {
        std::array::from_fn(|b| Some(b as u32))
    }

    fn encode(bpe: &Bpe, word: &str) -> Vec<u32> {
        let mut out = Vec::new();
        bpe.encode_word(word.as_bytes(), &mut Scratch::default(), &mut out);
        out
    }

    const A: u32 = b'a' as u32;
    const B: u32 = b'b' as u32;
    const C: u32 = b'c' as u32;

    #[test]
    fn lowest_rank_first_then_leftmost() {
        // ranks: "bc"=0 (id 300), "ab"=1 (301), "abc"? no: "a"+"bc"=2 (302)
        let bpe = Bpe::new([(B, C, 300), (A, B, 301), (A, 300, 302)], byte_ids());
        assert_eq!(encode(&bpe, "abc"), [302]);
        assert_eq!(encode(&bpe, "ab"), [301]);
        assert_eq!(encode(&bpe, "abab"), [301, 301]);
        assert_eq!(encode(&bpe, "cab"), [C, 301]);
        assert_eq!(encode(&bpe, "x"), [u32::from(b'x')]);
        assert_eq!(encode(&bpe, ""), Vec::<u32>::new());
    }

    #[test]
    fn overlapping_pairs_merge_leftmost() {
        let bpe = Bpe::new([(A, A, 300), (300, A, 301)], byte_ids());
        // aaa: (a,a)@0 merges first -> [aa, a] -> (aa,a) -> [aaa]
        assert_eq!(encode(&bpe, "aaa"), [301]);
        assert_eq!(encode(&bpe, "aaaa"), [300, 300]);
    }

    #[test]
    fn duplicate_pairs_keep_their_first_rank() {
        let bpe = Bpe::new([(A, B, 300), (A, B, 301)], byte_ids());
        assert_eq!(bpe.merge_count(), 1);
        assert_eq!(encode(&bpe, "ab"), [300]);
    }

    #[test]
    fn bytes_without_a_token_are_dropped() {
        let mut ids = byte_ids();
        ids[4] = None;
        let bpe = Bpe::new([(A, B, 300)], ids);
        let mut out = Vec::new();
        bpe.encode_word(&[b'a', 4, b'b'], &mut Scratch::default(), &mut out);
        bpe.encode_word(&[4], &mut Scratch::default(), &mut out);
        bpe.encode_word(b"ab", &mut Scratch::default(), &mut out);
        assert_eq!(out, [A, B, 300]);
    }

    #[test]
    fn long_runs_are_fast_and_correct() {
        let bpe = Bpe::new([(A, A, 300), (300, 300, 301)], byte_ids());
        let word = "a".repeat(100_001);
        let ids = encode(&bpe, &word);
        assert_eq!(ids.len(), 25_001);
        assert!(ids[..25_000].iter().all(|&i| i == 301));
        assert_eq!(ids[25_000], A);
    }
}

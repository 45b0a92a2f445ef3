//! The GGUF pipelines' pre-tokenizer on plain string slices: the words that `tokenizers`'
//! `Digits` (individual) and `ByteLevel` (GPT-2 pattern) pre-tokenizers cut, and the byte-level
//! alphabet they are written in, without `tokenizers`' normalized strings.
//!
//! Why it exists beside `tokenizers`: through its pre-tokenizer pipeline SmolLM2's tokenizer
//! encodes a 32k-token prompt 3.0x slower than the hand-written BPE it replaced, 79% of the time
//! in that pipeline (a normalized string with an alignment per byte, sliced and copied at every
//! split, and fancy-regex's backtracking VM for the pattern's look-ahead); this module cuts the
//! same words with the `regex` crate's automata and hands each to `tokenizers`' own BPE model
//! (docs/architecture.md, "Tokenizer", has the numbers). Which words it cuts is pinned to
//! `tokenizers`' own pre-tokenizers by property tests on arbitrary text.

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};

use crate::hf::PreTokenizerKind;

/// GPT-2's pattern without its look-ahead alternative `\s+(?!\S)`, which the `regex` crate
/// cannot express; [`Words::each`] gives its effect back (as tiktoken does).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// Cuts text into the words a GGUF pipeline's pre-tokenizer cuts.
#[derive(Clone, Debug)]
pub(crate) struct Words {
    gpt2: Regex,
    /// With `Gpt2SplitDigits`, every number character is a word of its own first (`Digits`
    /// with individual digits).
    kind: PreTokenizerKind,
}

impl Words {
    pub(crate) fn new(kind: PreTokenizerKind) -> Words {
        Words {
            // A constant pattern: it compiles or no test passes.
            gpt2: Regex::new(GPT2).expect("the GPT-2 pattern compiles"),
            kind,
        }
    }

    /// The pre-tokenizer these words reproduce.
    pub(crate) fn kind(&self) -> PreTokenizerKind {
        self.kind
    }

    /// Calls `f` with each word of `text`, in order; the words concatenate to `text`.
    pub(crate) fn each<E>(
        &self,
        text: &str,
        mut f: impl FnMut(&str) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.kind != PreTokenizerKind::Gpt2SplitDigits {
            return self.gpt2(text, &mut f);
        }
        // `Digits` tests `char::is_numeric`, which need not be the pattern's `\p{N}`; the same
        // test here cuts the same pieces whatever the two tables say.
        let mut start = 0;
        for (at, c) in text.char_indices().filter(|(_, c)| c.is_numeric()) {
            self.gpt2(&text[start..at], &mut f)?;
            start = at + c.len_utf8();
            f(&text[at..start])?;
        }
        self.gpt2(&text[start..], &mut f)
    }

    /// The GPT-2 pattern's matches in `piece` (it matches every character, so they tile it).
    fn gpt2<E>(&self, piece: &str, f: &mut impl FnMut(&str) -> Result<(), E>) -> Result<(), E> {
        let mut at = 0;
        // Every word starts where the last ended: an anchored search finds its end in one
        // forward pass, where an unanchored one would also scan back for its start.
        while let Some(m) = self
            .gpt2
            .search(&Input::new(piece).range(at..).anchored(Anchored::Yes))
        {
            let mut end = m.end();
            // A match ending in whitespace is the `\s+` alternative, a whole run of it. Where
            // a non-space character follows, `\s+(?!\S)` would have stopped one character
            // short, leaving that character to start the next word (" word"), unless the run
            // is a single character, which `\s+` then takes alone.
            let word = &piece[at..end];
            if end < piece.len()
                && let Some(last) = word.chars().next_back().filter(|c| c.is_whitespace())
                && word.len() > last.len_utf8()
            {
                end -= last.len_utf8();
            }
            f(&piece[at..end])?;
            at = end;
        }
        Ok(())
    }
}

/// GPT-2's byte-level alphabet: the character each byte is written as in the vocabulary
/// (printable Latin-1 as itself, the other bytes from U+0100 on, in byte order).
#[derive(Clone, Debug)]
pub(crate) struct ByteChars([char; 256]);

impl ByteChars {
    pub(crate) fn new() -> ByteChars {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut chars = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            chars[b as usize] = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                // 256..=324: valid scalar values.
                char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
        }
        ByteChars(chars)
    }

    /// The character byte `b` is written as.
    pub(crate) fn of(&self, b: u8) -> char {
        self.0[b as usize]
    }

    /// Replaces `out` with `word` written in the alphabet, one character per byte.
    pub(crate) fn write(&self, word: &str, out: &mut String) {
        out.clear();
        out.extend(word.bytes().map(|b| self.of(b)));
    }
}

#[cfg(test)]
mod tests;

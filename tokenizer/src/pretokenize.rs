//! Pre-tokenization: splitting text into the words BPE runs on, as llama.cpp does for GPT-2 style
//! vocabularies.
//!
//! llama.cpp applies a list of regexes in turn, each splitting the pieces the previous one left
//! (matches and the text between them both become pieces). For `tokenizer.ggml.pre = "smollm"`
//! (and starcoder, refact, command-r, codeshell, exaone, minerva) the list is `\p{N}` (every
//! number character alone), then the GPT-2 pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` over each remaining
//! piece; "gpt-2" and a few others use the GPT-2 pattern alone. The `regex` crate has no
//! look-ahead, so `\s+(?!\S)` is matched as `\s+` and then shortened by one character when the
//! run is followed by a non-space in the same piece: exactly what the backtracking engine (and
//! llama.cpp's hand-written matcher) does.

use regex::Regex;

/// The GPT-2 pattern without its look-ahead alternative (see the module doc).
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// How text is split into words before BPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// The GPT-2 pattern alone.
    Gpt2,
    /// Every number character alone, then the GPT-2 pattern (SmolLM2, StarCoder).
    Gpt2SplitDigits,
}

impl PreTokenizerKind {
    /// The kind llama.cpp uses for a `tokenizer.ggml.pre` value, for the values this crate
    /// implements.
    pub fn from_gguf_name(name: &str) -> Option<PreTokenizerKind> {
        match name {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva" => Some(PreTokenizerKind::Gpt2SplitDigits),
            "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
                Some(PreTokenizerKind::Gpt2)
            }
            _ => None,
        }
    }
}

/// A compiled pre-tokenizer.
#[derive(Clone, Debug)]
pub(crate) struct PreTokenizer {
    kind: PreTokenizerKind,
    gpt2: Regex,
}

impl PreTokenizer {
    pub(crate) fn new(kind: PreTokenizerKind) -> PreTokenizer {
        PreTokenizer {
            kind,
            // A constant pattern; the unit tests compile it.
            gpt2: Regex::new(GPT2_PATTERN).expect("the GPT-2 pattern compiles"),
        }
    }

    /// Calls `emit` with each word of `text`, in order; the words concatenate to `text`.
    pub(crate) fn split<'a>(&self, text: &'a str, mut emit: impl FnMut(&'a str)) {
        match self.kind {
            PreTokenizerKind::Gpt2 => self.split_gpt2(text, &mut emit),
            PreTokenizerKind::Gpt2SplitDigits => {
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    // char::is_numeric is exactly the general categories Nd, Nl, No: \p{N}.
                    if c.is_numeric() {
                        self.split_gpt2(&text[start..i], &mut emit);
                        let end = i + c.len_utf8();
                        emit(&text[i..end]);
                        start = end;
                    }
                }
                self.split_gpt2(&text[start..], &mut emit);
            }
        }
    }

    fn split_gpt2<'a>(&self, piece: &'a str, emit: &mut impl FnMut(&'a str)) {
        let mut pos = 0;
        while pos < piece.len() {
            let rest = &piece[pos..];
            let Some(m) = self.gpt2.find(rest) else {
                // The pattern covers every character class, so this is unreachable; keep the
                // text anyway rather than drop it.
                emit(rest);
                return;
            };
            if m.start() > 0 {
                emit(&rest[..m.start()]);
            }
            let mut end = m.end();
            let matched = &rest[m.start()..end];
            // Only the \s+ alternative ends in whitespace; emulate its (?!\S): a run followed by
            // a non-space gives its last character back to the next word.
            if end < rest.len()
                && matched.chars().nth(1).is_some()
                && let Some(last) = matched.chars().next_back().filter(|c| c.is_whitespace())
            {
                end -= last.len_utf8();
            }
            emit(&rest[m.start()..end]);
            pos += end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(kind: PreTokenizerKind, text: &str) -> Vec<&str> {
        let p = PreTokenizer::new(kind);
        let mut out = Vec::new();
        p.split(text, |w| out.push(w));
        assert_eq!(out.concat(), text);
        out
    }

    fn smol(text: &str) -> Vec<&str> {
        words(PreTokenizerKind::Gpt2SplitDigits, text)
    }

    #[test]
    fn letters_punctuation_and_contractions() {
        assert_eq!(smol("Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(
            smol("don't I'LL it's"),
            ["don", "'t", " I", "'", "LL", " it", "'s"]
        );
        assert_eq!(smol("a->b"), ["a", "->", "b"]);
    }

    #[test]
    fn whitespace_runs_give_one_space_to_the_next_word() {
        assert_eq!(smol("a   b"), ["a", "  ", " b"]);
        assert_eq!(smol("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(smol("a \n b"), ["a", " \n", " b"]);
        assert_eq!(smol("end   "), ["end", "   "]);
        assert_eq!(smol("\t\tx"), ["\t", "\t", "x"]);
        assert_eq!(smol(" x"), [" x"]);
    }

    #[test]
    fn digits_are_split_one_by_one_and_end_pieces() {
        assert_eq!(smol("abc 12345"), ["abc", " ", "1", "2", "3", "4", "5"]);
        assert_eq!(smol("x  7"), ["x", "  ", "7"]);
        assert_eq!(smol("Ⅻ²٣"), ["Ⅻ", "²", "٣"]);
        assert_eq!(
            words(PreTokenizerKind::Gpt2, "abc 12345"),
            ["abc", " 12345"]
        );
    }

    #[test]
    fn unicode_classes() {
        assert_eq!(smol("日本語 🐬!"), ["日本語", " 🐬!"]);
        // A combining mark is not a letter (\p{M}), so it joins the symbol class.
        assert_eq!(smol("e\u{301}t"), ["e", "\u{301}", "t"]);
        // Only U+0020 may prefix a word; other spaces stand alone.
        assert_eq!(
            smol("a\u{3000}\u{3000}b"),
            ["a", "\u{3000}", "\u{3000}", "b"]
        );
    }

    #[test]
    fn names_map_like_llama_cpp() {
        assert_eq!(
            PreTokenizerKind::from_gguf_name("smollm"),
            Some(PreTokenizerKind::Gpt2SplitDigits)
        );
        assert_eq!(
            PreTokenizerKind::from_gguf_name("gpt-2"),
            Some(PreTokenizerKind::Gpt2)
        );
        assert_eq!(PreTokenizerKind::from_gguf_name("llama-bpe"), None);
    }
}

//! Splitting input text at special tokens (`<|im_start|>`, ...) before pre-tokenization.
//!
//! Same order as llama.cpp (`tokenizer_st_partition`): special tokens are tried longest first,
//! each one splitting every text fragment left by the ones before. This differs from a
//! left-to-right longest-match scan only when two special tokens overlap in the text, which
//! cannot happen with bracketed tokens such as SmolLM2's, but matching llama.cpp's order keeps
//! ids equal to the reference for any vocabulary.

/// A piece of input: plain text to pre-tokenize, or one special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    /// Text without special tokens.
    Text(&'a str),
    /// A special token's id.
    Special(u32),
}

/// The special tokens matched in input text.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialMatcher {
    /// (text, id), longest text first; ties by id for determinism.
    tokens: Vec<(String, u32)>,
}

impl SpecialMatcher {
    pub(crate) fn new(tokens: impl IntoIterator<Item = (String, u32)>) -> SpecialMatcher {
        let mut tokens: Vec<(String, u32)> =
            tokens.into_iter().filter(|(t, _)| !t.is_empty()).collect();
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        SpecialMatcher { tokens }
    }

    /// Appends the fragments of `text` to `out`.
    pub(crate) fn split<'a>(&self, text: &'a str, out: &mut Vec<Fragment<'a>>) {
        let first = out.len();
        out.push(Fragment::Text(text));
        let mut next = Vec::new();
        for (special, id) in &self.tokens {
            // Most texts hold no special token at all: skip the rebuild then.
            let hit = out[first..]
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(special.as_str())));
            if !hit {
                continue;
            }
            next.clear();
            for f in out.drain(first..) {
                let Fragment::Text(mut t) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = t.find(special.as_str()) {
                    if at > 0 {
                        next.push(Fragment::Text(&t[..at]));
                    }
                    next.push(Fragment::Special(*id));
                    t = &t[at + special.len()..];
                }
                if !t.is_empty() {
                    next.push(Fragment::Text(t));
                }
            }
            out.append(&mut next);
        }
        if matches!(out[first..], [Fragment::Text("")]) {
            out.truncate(first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fragment::{Special, Text};

    fn split<'a>(m: &SpecialMatcher, text: &'a str) -> Vec<Fragment<'a>> {
        let mut out = Vec::new();
        m.split(text, &mut out);
        out
    }

    #[test]
    fn splits_at_every_occurrence() {
        let m = SpecialMatcher::new([
            ("<|im_start|>".to_string(), 1),
            ("<|im_end|>".to_string(), 2),
        ]);
        assert_eq!(
            split(&m, "<|im_start|>user\nhi<|im_end|><|im_end|>\n"),
            [
                Special(1),
                Text("user\nhi"),
                Special(2),
                Special(2),
                Text("\n")
            ]
        );
        assert_eq!(split(&m, "plain"), [Text("plain")]);
        assert_eq!(split(&m, ""), []);
        assert_eq!(split(&m, "<|im_start"), [Text("<|im_start")]);
    }

    #[test]
    fn longest_token_wins_like_llama_cpp() {
        // "bcd" is tried first, so "ab" never gets its 'b'.
        let m = SpecialMatcher::new([
            ("ab".to_string(), 7),
            ("bcd".to_string(), 8),
            (String::new(), 9),
        ]);
        assert_eq!(
            split(&m, "abcd ab"),
            [Text("a"), Special(8), Text(" "), Special(7)]
        );
    }
}

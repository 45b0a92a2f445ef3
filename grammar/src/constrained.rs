//! One sequence's constraint: the tokens it has read and the mask of its next draw.

use llguidance::Matcher;

use crate::error::GrammarError;
use crate::format::first_line;

/// The state of one constrained sequence: feed it every output token in order
/// ([`Constrained::consume`]), and mask each draw's logits with [`Constrained::mask`].
pub struct Constrained {
    matcher: Matcher,
    vocab_size: usize,
    /// The tokens that end a sequence.
    ends: std::sync::Arc<[u32]>,
}

impl std::fmt::Debug for Constrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constrained")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Constrained {
    pub(crate) fn new(
        matcher: Matcher,
        vocab_size: usize,
        ends: std::sync::Arc<[u32]>,
    ) -> Constrained {
        Constrained {
            matcher,
            vocab_size,
            ends,
        }
    }

    /// Reads the next output token. An end token where the format may end is the end of the
    /// text, not part of it (a model group feeds the last token to the model that did not
    /// draw it, too).
    pub fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.ends.contains(&token)
            && (self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false))
        {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Rejected {
                token,
                message: first_line(&e.to_string()),
            })
    }

    /// Sets every logit the format does not allow next to minus infinity. Once the format is
    /// complete and nothing may follow, only the end tokens stay.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Stuck(first_line(&e.to_string())))?;
        let n = logits.len().min(self.vocab_size);
        let (inside, past) = logits.split_at_mut(n);
        // 32 tokens a word; most words of a mask are all allowed or all not.
        for (chunk, &bits) in inside.chunks_mut(32).zip(allowed.as_slice()) {
            match bits {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                _ => {
                    for (i, l) in chunk.iter_mut().enumerate() {
                        if bits & (1 << i) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        past.fill(f32::NEG_INFINITY);
        Ok(())
    }

    /// Whether the format is complete and nothing may follow (the next draw can only end the
    /// sequence).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Format, TokenSpace, TokenText};

    /// Single bytes `0`-`9`, `{`, `}`, `"`, `:`, `a`, `ab`, then an end token.
    fn space() -> (TokenSpace, Vec<&'static str>) {
        let texts = vec![
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "{", "}", "\"", ":", "a", "ab",
        ];
        let mut tokens: Vec<TokenText> = texts
            .iter()
            .map(|t| TokenText::Bytes(t.as_bytes().to_vec()))
            .collect();
        tokens.push(TokenText::Special("<end>".into()));
        // Two ids past the tokenizer (padding).
        (TokenSpace::new(tokens, 19, &[16]).unwrap(), texts)
    }

    fn allowed(c: &mut crate::Constrained) -> Vec<u32> {
        let mut logits = vec![0.0f32; 19];
        c.mask(&mut logits).unwrap();
        (0..19).filter(|&i| logits[i as usize] == 0.0).collect()
    }

    #[test]
    fn a_regex_allows_what_continues_it_then_only_the_end() {
        let (space, _) = space();
        let mut c = space.constrain(&Format::Regex("a[0-9]{2}".into())).unwrap();
        assert_eq!(
            allowed(&mut c),
            vec![14],
            "only 'a' starts it ('ab' does not)"
        );
        c.consume(14).unwrap();
        assert_eq!(allowed(&mut c), (0..10).collect::<Vec<_>>());
        c.consume(4).unwrap();
        c.consume(2).unwrap();
        assert!(c.is_stopped());
        assert_eq!(allowed(&mut c), vec![16], "complete: the end token alone");
        c.consume(16).expect("the end token ends it");
        let mut open = space.constrain(&Format::Regex("a[0-9]".into())).unwrap();
        assert!(
            open.consume(16).is_err(),
            "not where the format is incomplete"
        );
    }

    #[test]
    fn a_choice_ends_where_an_option_does_and_a_wrong_token_is_refused() {
        let (space, _) = space();
        let mut c = space
            .constrain(&Format::Choice(vec!["ab".into(), "a1".into()]))
            .unwrap();
        assert_eq!(allowed(&mut c), vec![14, 15]);
        c.consume(14).unwrap();
        assert!(c.consume(5).is_err(), "'a5' is no option");
    }

    #[test]
    fn a_schema_starts_with_its_object() {
        let (space, _) = space();
        let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}"#;
        let mut c = space.constrain(&Format::JsonSchema(schema.into())).unwrap();
        assert_eq!(
            allowed(&mut c),
            vec![10],
            "only the opening brace (no whitespace token here)"
        );
        for t in [10, 12, 14, 12, 13, 7] {
            c.consume(t).unwrap();
        }
        let next = allowed(&mut c);
        assert!(next.contains(&11) && next.contains(&3), "{next:?}");
        c.consume(11).unwrap();
        assert_eq!(allowed(&mut c), vec![16]);
    }

    #[test]
    fn json_whitespace_is_bounded_but_pretty_printing_passes() {
        let texts = ["{", "}", "\"", ":", "a", "1", " ", "\n", "    "];
        let mut tokens: Vec<TokenText> = texts
            .iter()
            .map(|t| TokenText::Bytes(t.as_bytes().to_vec()))
            .collect();
        tokens.push(TokenText::Special("<end>".into()));
        let space = TokenSpace::new(tokens, 10, &[9]).unwrap();
        let id = |t: &str| texts.iter().position(|x| *x == t).unwrap() as u32;
        let feed = |format: Format, text: &[&str]| {
            let mut c = space.constrain(&format).unwrap();
            text.iter().try_for_each(|t| c.consume(id(t)))
        };
        // {\n    "a": 1\n}
        let pretty = ["{", "\n", "    ", "\"", "a", "\"", ":", " ", "1", "\n", "}"];
        let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#;
        for format in [Format::JsonObject, Format::JsonSchema(schema.into())] {
            assert_eq!(feed(format.clone(), &pretty), Ok(()), "{format:?}");
            assert!(
                feed(format.clone(), &["{", "\n", "\n"]).is_err(),
                "a blank line: {format:?}"
            );
            let mut spaces = vec!["{"];
            spaces.extend([" "; 24]);
            assert_eq!(feed(format.clone(), &spaces), Ok(()), "{format:?}");
            spaces.push(" ");
            assert!(
                feed(format.clone(), &spaces).is_err(),
                "25 spaces: {format:?}"
            );
        }
        // A schema that sets llguidance's options itself keeps them.
        let own = r#"{"type":"object","x-guidance":{"whitespace_flexible":true}}"#;
        assert_eq!(
            feed(Format::JsonSchema(own.into()), &["{", "\n", "\n", "\n"]),
            Ok(())
        );
    }
}

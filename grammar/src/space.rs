//! A model vocabulary as llguidance sees it: each token's bytes.

use std::collections::HashSet;
use std::sync::Arc;

use llguidance::{Matcher, ParserFactory};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::constrained::Constrained;
use crate::error::GrammarError;
use crate::format::{Format, first_line};

/// One token of a vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenText {
    /// A text token: the bytes it writes (a byte-level token's raw bytes, not its
    /// printable alphabet).
    Bytes(Vec<u8>),
    /// A control token such as `<|im_end|>`, by name: a format's text never contains it
    /// (a Lark grammar may name it as `<|im_end|>`).
    Special(String),
    /// An id that writes nothing (unused, padding past the tokenizer's end): never allowed.
    Nothing,
}

/// Compiles formats into masks over one model's vocabulary. Built once per model (0.12-0.19 s
/// for SmolLM2's 49,152 tokens on these CPUs); shared by every sequence.
pub struct TokenSpace {
    factory: ParserFactory,
    vocab_size: usize,
    ends: Arc<[u32]>,
}

impl std::fmt::Debug for TokenSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSpace")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl TokenSpace {
    /// The space of `tokens`, indexed by id, padded with [`TokenText::Nothing`] to
    /// `vocab_size` (the model's logits, which may outnumber the tokenizer's tokens).
    /// `end_tokens` (at least one) are the tokens that end a sequence: a mask allows them
    /// where the format is complete, and only them once nothing can follow.
    pub fn new(
        tokens: Vec<TokenText>,
        vocab_size: u32,
        end_tokens: &[u32],
    ) -> Result<TokenSpace, GrammarError> {
        let unavailable = |m: String| GrammarError::Unavailable(m);
        if tokens.len() > vocab_size as usize {
            return Err(unavailable(format!(
                "the tokenizer has {} tokens, the model {vocab_size}",
                tokens.len()
            )));
        }
        let Some(&first_end) = end_tokens.first() else {
            return Err(unavailable(
                "the model names no end-of-sequence token".into(),
            ));
        };
        if let Some(t) = end_tokens.iter().find(|&&t| t >= vocab_size) {
            return Err(unavailable(format!(
                "end token {t} is outside the vocabulary ({vocab_size})"
            )));
        }
        let mut seen = HashSet::with_capacity(tokens.len());
        let mut words: Vec<Vec<u8>> = tokens
            .into_iter()
            .map(|t| {
                let word = match t {
                    TokenText::Bytes(b) => b,
                    TokenText::Special(name) => {
                        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                        w.extend_from_slice(name.as_bytes());
                        w
                    }
                    TokenText::Nothing => Vec::new(),
                };
                // Two ids writing the same bytes: the trie keeps the first, the other is
                // never drawn under a format (the text stays reachable through the first).
                if word.is_empty() || !seen.insert(word.clone()) {
                    Vec::new()
                } else {
                    word
                }
            })
            .collect();
        words.resize(vocab_size as usize, Vec::new());
        let info = TokRxInfo::new(vocab_size, first_end);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(end_tokens);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let factory = quiet_factory(&env).map_err(unavailable)?;
        Ok(TokenSpace {
            factory,
            vocab_size: vocab_size as usize,
            ends: end_tokens.into(),
        })
    }

    /// A fresh constraint for one sequence that must follow `format`.
    pub fn constrain(&self, format: &Format) -> Result<Constrained, GrammarError> {
        let parser =
            self.factory
                .create_parser(format.grammar()?)
                .map_err(|e| GrammarError::Invalid {
                    field: format.field(),
                    message: first_line(&e.to_string()),
                })?;
        Ok(Constrained::new(
            Matcher::new(Ok(parser)),
            self.vocab_size,
            Arc::clone(&self.ends),
        ))
    }

    /// Number of tokens (the length of the logits a mask applies to).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// A factory over `env` that logs nothing and keeps its errors to what is wrong (not the
/// parser's whole state).
pub(crate) fn quiet_factory(env: &TokEnv) -> Result<ParserFactory, String> {
    let mut f = ParserFactory::new_simple(env).map_err(|e| e.to_string())?;
    f.set_stderr_log_level(0);
    f.limits_mut().verbose_errors = false;
    Ok(f)
}

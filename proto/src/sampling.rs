//! Range checks of [`v1::LogitRules`] (penalties, min-p, logit bias, stop tokens, minimum
//! length, allowed tokens, bad words) and of the sampling parameters' log-probability counts
//! and cache salt, shared by the router, which refuses a bad request before routing it, and
//! the workers, which never trust the wire.

use crate::v1;

/// Largest logit bias in either direction (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// Most alternatives a request may ask log probabilities for (vLLM's default `max_logprobs`,
/// OpenAI's `top_logprobs` cap).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Largest presence or frequency penalty in either direction (OpenAI's and vLLM's range).
pub const MAX_PENALTY: f32 = 2.0;

/// Most tokens all of a request's bad words may hold together: each draw compares the output's
/// end with every bad word.
pub const MAX_BAD_WORD_TOKENS: usize = 4096;

/// A rule outside its range: the message starts with the field's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// The field (`repetition_penalty`, `logit_bias`, ...).
    pub field: &'static str,
    /// What is wrong, starting with the field's name.
    pub message: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RuleError {}

/// Most bytes a cache salt may have (`SamplingParams.cache_salt`).
pub const MAX_CACHE_SALT_BYTES: usize = 256;

/// Checks the logit rules of `params` (none: nothing to check) for a model of `vocab_size`
/// tokens, the number of log-probability alternatives it asks for, and its cache salt's
/// length.
pub fn check_logit_rules(params: &v1::SamplingParams, vocab_size: u32) -> Result<(), RuleError> {
    let err = |field: &'static str, message: String| Err(RuleError { field, message });
    if params.cache_salt.len() > MAX_CACHE_SALT_BYTES {
        return err(
            "cache_salt",
            format!(
                "cache_salt has {} bytes, more than the limit of {MAX_CACHE_SALT_BYTES}",
                params.cache_salt.len()
            ),
        );
    }
    for (field, asked) in [
        ("logprobs", params.logprobs),
        ("prompt_logprobs", params.prompt_logprobs),
    ] {
        if let Some(k) = asked.filter(|&k| k > MAX_TOP_LOGPROBS) {
            return err(
                field,
                format!("{field} must be at most {MAX_TOP_LOGPROBS} alternatives, got {k}"),
            );
        }
    }
    let Some(s) = params.logits.as_deref() else {
        return Ok(());
    };
    let r = s.repetition_penalty;
    // 0 (unset on the wire) and 1 are no penalty; any other positive number is one.
    if !(r.is_finite() && r >= 0.0) {
        return err(
            "repetition_penalty",
            format!("repetition_penalty must be a finite number > 0, got {r}"),
        );
    }
    for (field, v) in [
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ] {
        if !(-MAX_PENALTY..=MAX_PENALTY).contains(&v) {
            return err(field, format!("{field} must be in [-2, 2], got {v}"));
        }
    }
    if !(0.0..=1.0).contains(&s.min_p) {
        return err("min_p", format!("min_p must be in [0, 1], got {}", s.min_p));
    }
    if s.min_tokens > params.max_tokens {
        return err(
            "min_tokens",
            format!(
                "min_tokens ({}) must not exceed max_tokens ({})",
                s.min_tokens, params.max_tokens
            ),
        );
    }
    for (field, ids) in [
        ("stop_token_ids", &s.stop_token_ids),
        ("allowed_token_ids", &s.allowed_token_ids),
    ] {
        if let Some(t) = ids.iter().find(|&&t| t >= vocab_size) {
            return err(
                field,
                format!("{field} names token {t}, outside the vocabulary (size {vocab_size})"),
            );
        }
    }
    let mut bad_tokens = 0;
    for (i, word) in s.bad_words.iter().enumerate() {
        if word.ids.is_empty() {
            return err("bad_words", format!("bad_words[{i}] has no tokens"));
        }
        if let Some(t) = word.ids.iter().find(|&&t| t >= vocab_size) {
            return err(
                "bad_words",
                format!(
                    "bad_words[{i}] holds token {t}, outside the vocabulary (size {vocab_size})"
                ),
            );
        }
        bad_tokens += word.ids.len();
    }
    if bad_tokens > MAX_BAD_WORD_TOKENS {
        return err(
            "bad_words",
            format!(
                "bad_words hold {bad_tokens} tokens in all, more than the limit of {MAX_BAD_WORD_TOKENS}"
            ),
        );
    }
    // The smallest offending token, so the message does not depend on the map's order.
    let bad_bias = s
        .logit_bias
        .iter()
        .filter(|(t, b)| **t >= vocab_size || !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(*b))
        .min_by_key(|(t, _)| **t);
    if let Some((t, b)) = bad_bias {
        return err(
            "logit_bias",
            if *t >= vocab_size {
                format!("logit_bias names token {t}, outside the vocabulary (size {vocab_size})")
            } else {
                format!("logit_bias for token {t} must be in [-100, 100], got {b}")
            },
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rules: v1::LogitRules) -> v1::SamplingParams {
        v1::SamplingParams {
            max_tokens: 4,
            logits: Some(Box::new(rules)),
            ..Default::default()
        }
    }

    #[test]
    fn accepts_the_defaults_and_the_ranges_edges() {
        let none = v1::SamplingParams {
            max_tokens: 4,
            ..Default::default()
        };
        assert_eq!(check_logit_rules(&none, 10), Ok(()));
        assert_eq!(check_logit_rules(&params(Default::default()), 10), Ok(()));
        let edges = v1::LogitRules {
            repetition_penalty: 1.0,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            min_p: 1.0,
            min_tokens: 4,
            stop_token_ids: vec![9],
            logit_bias: [(0, -100.0), (9, 100.0)].into_iter().collect(),
            allowed_token_ids: vec![0, 9],
            bad_words: vec![v1::TokenIds { ids: vec![9, 0] }],
        };
        assert_eq!(check_logit_rules(&params(edges), 10), Ok(()));
    }

    #[test]
    fn logprobs_up_to_twenty_alternatives() {
        let with = |k| v1::SamplingParams {
            max_tokens: 4,
            logprobs: Some(k),
            ..Default::default()
        };
        assert_eq!(check_logit_rules(&with(0), 10), Ok(()));
        assert_eq!(check_logit_rules(&with(MAX_TOP_LOGPROBS), 10), Ok(()));
        let e = check_logit_rules(&with(21), 10).expect_err("refused");
        assert_eq!(e.field, "logprobs");
        assert!(e.message.starts_with("logprobs"), "{}", e.message);
        let prompt = v1::SamplingParams {
            max_tokens: 4,
            prompt_logprobs: Some(21),
            ..Default::default()
        };
        let e = check_logit_rules(&prompt, 10).expect_err("refused");
        assert_eq!(e.field, "prompt_logprobs");
    }

    #[test]
    fn names_the_field_out_of_range() {
        let field = |f: fn(&mut v1::LogitRules)| {
            let mut rules = v1::LogitRules::default();
            f(&mut rules);
            check_logit_rules(&params(rules), 10)
                .expect_err("refused")
                .field
        };
        assert_eq!(field(|s| s.repetition_penalty = -0.5), "repetition_penalty");
        assert_eq!(
            field(|s| s.repetition_penalty = f32::NAN),
            "repetition_penalty"
        );
        assert_eq!(field(|s| s.presence_penalty = -2.1), "presence_penalty");
        assert_eq!(
            field(|s| s.frequency_penalty = f32::INFINITY),
            "frequency_penalty"
        );
        assert_eq!(field(|s| s.min_p = -0.1), "min_p");
        assert_eq!(field(|s| s.min_tokens = 5), "min_tokens");
        assert_eq!(field(|s| s.stop_token_ids = vec![10]), "stop_token_ids");
        assert_eq!(
            field(|s| s.allowed_token_ids = vec![3, 10]),
            "allowed_token_ids"
        );
        let salted = |len: usize| v1::SamplingParams {
            max_tokens: 4,
            cache_salt: "s".repeat(len),
            ..Default::default()
        };
        assert_eq!(check_logit_rules(&salted(MAX_CACHE_SALT_BYTES), 10), Ok(()));
        let e = check_logit_rules(&salted(MAX_CACHE_SALT_BYTES + 1), 10).expect_err("refused");
        assert_eq!(e.field, "cache_salt");
        assert_eq!(
            field(|s| s.bad_words = vec![v1::TokenIds { ids: vec![3, 10] }]),
            "bad_words"
        );
        assert_eq!(
            field(|s| s.bad_words = vec![v1::TokenIds::default()]),
            "bad_words"
        );
        assert_eq!(
            field(|s| {
                let word = v1::TokenIds { ids: vec![1; 64] };
                s.bad_words = vec![word; MAX_BAD_WORD_TOKENS / 64 + 1];
            }),
            "bad_words"
        );
        assert_eq!(field(|s| _ = s.logit_bias.insert(10, 0.0)), "logit_bias");
        assert_eq!(
            field(|s| _ = s.logit_bias.insert(3, f32::NAN)),
            "logit_bias"
        );
    }
}

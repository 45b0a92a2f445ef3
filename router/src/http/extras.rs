//! vLLM's and SGLang's request fields beside OpenAI's sampling ones, which their clients send
//! in `extra_body`: what the answer's text writes out, the prompt's BOS token, banned words,
//! the request's place in the workers' queues, its cache salt, its id. Read from the request's
//! leftover fields ([`super::types::OtherFields`]), each checked with its name in the error.

use super::error::ApiError;
use super::types::SamplingFields;

/// The fields read, as the dispatcher takes them.
#[derive(Debug, Default)]
pub(crate) struct Extras {
    /// vLLM's `bad_words` (tokenized by the dispatcher).
    pub(crate) bad_words: Vec<String>,
    /// vLLM's `add_special_tokens` (`None`: the prompt kind's default).
    pub(crate) add_special_tokens: Option<bool>,
    /// vLLM's `skip_special_tokens: false`.
    pub(crate) keep_special_tokens: bool,
    /// vLLM's `priority` (0: none).
    pub(crate) priority: i32,
    /// vLLM's `cache_salt` (empty: none).
    pub(crate) cache_salt: String,
    /// SGLang's `rid`: the client's id for the request, where no header names one.
    pub(crate) rid: Option<String>,
}

impl Extras {
    /// Takes the fields out of `f`; SGLang's `no_stop_trim` sets
    /// `f.include_stop_str_in_output` (they ask for the same).
    pub(crate) fn take(f: &mut SamplingFields) -> Result<Extras, ApiError> {
        let o = &mut f.other;
        let named =
            |(field, message): (&'static str, String)| ApiError::invalid(message, Some(field));
        if o.take_flag("no_stop_trim").map_err(named)? == Some(true) {
            f.include_stop_str_in_output = true;
        }
        // Without effect on a fast tokenizer's text, as in vLLM (which reads it only with slow
        // tokenizers): accepted either way.
        o.take_flag("spaces_between_special_tokens")
            .map_err(named)?;
        Ok(Extras {
            bad_words: o.take_bad_words().map_err(named)?,
            add_special_tokens: o.take_flag("add_special_tokens").map_err(named)?,
            keep_special_tokens: !o
                .take_flag("skip_special_tokens")
                .map_err(named)?
                .unwrap_or(true),
            priority: match o.take("priority") {
                None => 0,
                Some(v) => v
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .ok_or_else(|| {
                        named(("priority", format!("priority must be an integer, got {v}")))
                    })?,
            },
            cache_salt: o
                .take_string("cache_salt")
                .map_err(named)?
                .unwrap_or_default(),
            rid: o.take_string("rid").map_err(named)?,
        })
    }
}

//! vLLM's `bad_words`: words the output may not contain, turned into the token sequences the
//! engine masks (`LogitRules.bad_words`). A word is banned as it would be written at the start
//! of the text and, where the tokenizer writes a leading space into the word's first token, as
//! it follows a space, as vLLM tokenizes them (`SamplingParams.update_from_tokenizer`).

use dolphin_proto::v1;

use crate::error::DispatchError;
use crate::tokenizer::Tokenizer;

/// Most bytes all of a request's bad words may hold together: they are tokenized on the
/// serving thread, beside the request's routing.
pub const MAX_BAD_WORDS_BYTES: usize = 4096;

/// The token sequences `words` stand for: for each word (leading whitespace dropped), its
/// tokens, and its tokens after a space where they are as many and start differently (a
/// tokenizer that folds the space into the word's first token; otherwise the first sequence
/// already matches the word after a space).
pub fn token_ids(
    tokenizer: &dyn Tokenizer,
    words: &[String],
) -> Result<Vec<v1::TokenIds>, DispatchError> {
    let bad = |message: String| DispatchError::InvalidField {
        field: "bad_words",
        message,
    };
    let bytes: usize = words.iter().map(String::len).sum();
    if bytes > MAX_BAD_WORDS_BYTES {
        return Err(bad(format!(
            "bad_words hold {bytes} bytes, more than the limit of {MAX_BAD_WORDS_BYTES}"
        )));
    }
    let encode = |text: &str| {
        tokenizer
            .encode(text)
            .map_err(|e| DispatchError::Internal(e.to_string()))
    };
    let mut out = Vec::with_capacity(words.len() * 2);
    for (i, word) in words.iter().enumerate() {
        let word = word.trim_start();
        let alone = encode(word)?;
        if alone.is_empty() {
            return Err(bad(format!("bad_words[{i}] is empty")));
        }
        let spaced = encode(&format!(" {word}"))?;
        let distinct = spaced.len() == alone.len() && spaced.first() != alone.first();
        out.push(v1::TokenIds { ids: alone });
        if distinct {
            out.push(v1::TokenIds { ids: spaced });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::SimTokenizer;

    fn ids(words: &[&str]) -> Result<Vec<Vec<u32>>, DispatchError> {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        Ok(token_ids(&SimTokenizer, &words)?
            .into_iter()
            .map(|t| t.ids)
            .collect())
    }

    #[test]
    fn a_word_is_its_tokens_without_the_leading_space() {
        let sim = SimTokenizer;
        // Byte tokens: the spaced form is longer, and the plain one matches after a space too.
        assert_eq!(
            ids(&["red", "  go"]).unwrap(),
            vec![sim.encode("red"), sim.encode("go")]
        );
    }

    #[test]
    fn empty_and_oversized_lists_are_refused_by_name() {
        for words in [vec![""], vec!["ok", "   "]] {
            match ids(&words) {
                Err(DispatchError::InvalidField { field, message }) => {
                    assert_eq!(field, "bad_words");
                    assert!(message.contains("is empty"), "{message}");
                }
                other => panic!("{words:?}: {other:?}"),
            }
        }
        let long = "x".repeat(MAX_BAD_WORDS_BYTES + 1);
        assert!(matches!(
            ids(&[long.as_str()]),
            Err(DispatchError::InvalidField {
                field: "bad_words",
                ..
            })
        ));
    }
}

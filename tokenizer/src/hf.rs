//! Hugging Face `tokenizers` pipelines built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! A GGUF "gpt2" tokenizer is the byte-level BPE its `tokenizer.json` describes: the vocabulary
//! and merges, a pre-tokenizer chosen by `tokenizer.ggml.pre`, the control and user-defined
//! tokens as added tokens (special and not), and the byte-level decoder. llama.cpp rebuilds the
//! same pieces from the same metadata, so the ids agree (checked against llama.cpp's ids in
//! `tests/vectors/`).

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::TokenizerError;
use crate::vocab::{GgufVocab, TokenType};

/// How text is split into words before BPE, by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// The GPT-2 pattern alone.
    Gpt2,
    /// Every number character alone, then the GPT-2 pattern (SmolLM2, StarCoder): `Digits`
    /// with individual digits, then `ByteLevel`, as their `tokenizer.json` says.
    Gpt2SplitDigits,
}

impl PreTokenizerKind {
    /// The kind for a `tokenizer.ggml.pre` value, for the values built here (llama.cpp's
    /// grouping of the names).
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

    /// The kind `pre` is, if it is one of these (as a `tokenizer.json` from GPT-2, SmolLM2 or
    /// StarCoder writes it): compared as `tokenizers` serializes them, less `trim_offsets`,
    /// which moves offsets, never ids.
    pub fn of(pre: &PreTokenizerWrapper) -> Option<PreTokenizerKind> {
        fn ids_part(mut v: serde_json::Value) -> serde_json::Value {
            match &mut v {
                serde_json::Value::Object(m) => {
                    m.remove("trim_offsets");
                    for x in m.values_mut() {
                        *x = ids_part(x.take());
                    }
                }
                serde_json::Value::Array(a) => {
                    for x in a.iter_mut() {
                        *x = ids_part(x.take());
                    }
                }
                _ => {}
            }
            v
        }
        let json = |p: &PreTokenizerWrapper| serde_json::to_value(p).ok().map(ids_part);
        let want = json(pre)?;
        [PreTokenizerKind::Gpt2, PreTokenizerKind::Gpt2SplitDigits]
            .into_iter()
            .find(|k| json(&k.build()).as_ref() == Some(&want))
    }

    pub(crate) fn build(self) -> PreTokenizerWrapper {
        // No prefix space (llama.cpp adds none), offsets trimmed, the GPT-2 regex.
        let byte_level = ByteLevel::new(false, true, true);
        match self {
            PreTokenizerKind::Gpt2 => byte_level.into(),
            PreTokenizerKind::Gpt2SplitDigits => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
        }
    }
}

/// The tokenizer a GGUF vocabulary describes.
pub(crate) fn from_gguf(
    v: &GgufVocab,
    kind: PreTokenizerKind,
) -> Result<Tokenizer, TokenizerError> {
    // Inserted last to first, so a duplicated string keeps its first id, like llama.cpp's
    // token_to_id map.
    let vocab: Vocab = v
        .tokens
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    // As llama.cpp: split at the first space after the first character; a merge naming strings
    // outside the vocabulary can never apply and is dropped (tokenizers would refuse it).
    let merges: Vec<(String, String)> = v
        .merges
        .iter()
        .filter_map(|m| {
            let first = m.chars().next()?.len_utf8();
            let pos = m[first..].find(' ')? + first;
            let (l, r) = (&m[..pos], &m[pos + 1..]);
            let known = vocab.contains_key(l)
                && vocab.contains_key(r)
                && vocab.contains_key(&format!("{l}{r}"));
            known.then(|| (l.to_owned(), r.to_owned()))
        })
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| TokenizerError::InvalidVocab(format!("BPE: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(kind.build()))
        .with_decoder(Some(ByteLevelDecoder::default()));
    // Control and unknown tokens are special (matched in text unless special tokens are
    // encoded as text, skipped when decoding); user-defined ones are matched always and
    // decoded as their text, as llama.cpp does.
    let added = |pick: fn(TokenType) -> bool, special: bool| -> Vec<AddedToken> {
        v.tokens
            .iter()
            .zip(&v.types)
            .filter(|(t, ty)| pick(**ty) && !t.is_empty())
            .map(|(t, _)| AddedToken::from(t.clone(), special).normalized(false))
            .collect()
    };
    tok.add_special_tokens(added(
        |t| matches!(t, TokenType::Control | TokenType::Unknown),
        true,
    ))
    .map_err(|e| TokenizerError::InvalidVocab(format!("special tokens: {e}")))?;
    tok.add_tokens(added(|t| t == TokenType::UserDefined, false))
        .map_err(|e| TokenizerError::InvalidVocab(format!("user-defined tokens: {e}")))?;
    Ok(tok)
}

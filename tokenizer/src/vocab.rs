//! The vocabulary read from GGUF metadata: token strings and types, merges, special ids; and the
//! end-of-generation tokens of any vocabulary.

use crate::error::TokenizerError;
use crate::gguf::{GgufMetadata, optional};

/// Metadata keys read.
pub(crate) mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS: &str = "tokenizer.ggml.eos_token_id";
    pub const UNK: &str = "tokenizer.ggml.unknown_token_id";
    pub const PAD: &str = "tokenizer.ggml.padding_token_id";
    pub const EOT: &str = "tokenizer.ggml.eot_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// A token's type (`tokenizer.ggml.token_type`, llama.cpp's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0
    Undefined,
    /// 1: text, byte-level encoded.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token such as `<|im_start|>`: matched in input, skipped when decoding.
    Control,
    /// 4: an added token matched in input and decoded as its text.
    UserDefined,
    /// 5
    Unused,
    /// 6: a raw byte (SentencePiece vocabularies).
    Byte,
}

impl TokenType {
    fn from_id(id: i128) -> Option<TokenType> {
        Some(match id {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// Ids of the special tokens named in the metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence (SmolLM2: `<|im_end|>`, which ends an assistant turn).
    pub eos: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
    /// End of turn, when distinct from eos.
    pub eot: Option<u32>,
}

/// Texts llama.cpp treats as "end of generation" wherever they appear in a vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// The tokenizer metadata of a GGUF file.
#[derive(Debug)]
pub(crate) struct GgufVocab {
    pub(crate) tokens: Vec<String>,
    pub(crate) types: Vec<TokenType>,
    pub(crate) merges: Vec<String>,
    pub(crate) special: SpecialIds,
    pub(crate) add_bos: bool,
}

impl GgufVocab {
    pub(crate) fn from_gguf(g: &GgufMetadata) -> Result<GgufVocab, TokenizerError> {
        let tokens = g.get_str_array(keys::TOKENS)?;
        let n = tokens.len();
        if n == 0 || n >= u32::MAX as usize {
            return Err(TokenizerError::InvalidVocab(format!("{n} tokens")));
        }
        let types = match optional(g.get_int_array(keys::TOKEN_TYPE))? {
            // llama.cpp's default when a converter wrote no types.
            None => vec![TokenType::Normal; n],
            Some(raw) => read_types(&raw, n)?,
        };
        let merges = g.get_str_array(keys::MERGES)?;
        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match optional(g.get_u32(key))? {
                Some(i) if i as usize >= n => Err(TokenizerError::InvalidVocab(format!(
                    "{key} = {i} but the vocabulary has {n} tokens"
                ))),
                other => Ok(other),
            }
        };
        let special = SpecialIds {
            bos: id(keys::BOS)?,
            eos: id(keys::EOS)?,
            unk: id(keys::UNK)?,
            pad: id(keys::PAD)?,
            eot: id(keys::EOT)?,
        };
        let add_bos = optional(g.get_bool(keys::ADD_BOS))?.unwrap_or(false);
        Ok(GgufVocab {
            tokens,
            types,
            merges,
            special,
            add_bos,
        })
    }
}

/// eos, eot, then every control token llama.cpp counts as end of generation.
pub(crate) fn stop_ids(
    special: SpecialIds,
    id_of: impl Fn(&str) -> Option<u32>,
    type_of: impl Fn(u32) -> Option<TokenType>,
) -> Vec<u32> {
    let mut out: Vec<u32> = [special.eos, special.eot].into_iter().flatten().collect();
    for text in EOG_TEXTS {
        if let Some(id) = id_of(text)
            && type_of(id) == Some(TokenType::Control)
            && !out.contains(&id)
        {
            out.push(id);
        }
    }
    out
}

fn read_types(raw: &[i64], n: usize) -> Result<Vec<TokenType>, TokenizerError> {
    if raw.len() != n {
        return Err(TokenizerError::InvalidVocab(format!(
            "{} token types for {n} tokens",
            raw.len()
        )));
    }
    raw.iter()
        .enumerate()
        .map(|(i, &t)| {
            TokenType::from_id(t.into())
                .ok_or_else(|| TokenizerError::InvalidVocab(format!("token {i} has type {t}")))
        })
        .collect()
}

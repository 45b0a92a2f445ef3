//! The vocabulary read from GGUF metadata: token strings and types, special ids, merges, and each
//! token's decoded bytes.

use std::collections::HashMap;

use crate::bpe::Bpe;
use crate::bytelevel::ByteLevel;
use crate::error::TokenizerError;
use crate::gguf::{Array, GgufFile, optional};

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

    /// Whether input text is searched for this token before pre-tokenization (when special
    /// tokens are parsed); user-defined tokens are always searched, as in llama.cpp.
    pub(crate) fn matched_in_text(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
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

/// Everything the tokenizer needs from the metadata.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub(crate) tokens: Vec<String>,
    pub(crate) types: Vec<TokenType>,
    pub(crate) ids: HashMap<String, u32>,
    /// Decoded bytes of every token, concatenated; token i is `pieces[ends[i-1]..ends[i]]`.
    pub(crate) pieces: Vec<u8>,
    pub(crate) ends: Vec<u32>,
    pub(crate) special: SpecialIds,
    pub(crate) bpe: Bpe,
    pub(crate) add_bos: bool,
}

impl Vocab {
    pub(crate) fn from_gguf(g: &GgufFile) -> Result<Vocab, TokenizerError> {
        let tokens = g.get_str_array(keys::TOKENS)?.to_vec();
        let n = tokens.len();
        // Ids u32::MAX - 1 and up are markers in the BPE.
        if n == 0 || n >= (u32::MAX - 1) as usize {
            return Err(TokenizerError::InvalidVocab(format!("{n} tokens")));
        }
        let types = match optional(g.get_array(keys::TOKEN_TYPE))? {
            // llama.cpp's default when a converter wrote no types.
            None => vec![TokenType::Normal; n],
            Some(arr) => read_types(arr, n)?,
        };
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            // A duplicated string keeps its first id, like llama.cpp's token_to_id map.
            ids.entry(t.clone()).or_insert(i as u32);
        }

        let bl = ByteLevel::new();
        let mut pieces = Vec::with_capacity(n * 8);
        let mut ends = Vec::with_capacity(n);
        for (t, ty) in tokens.iter().zip(&types) {
            match ty {
                TokenType::Normal => bl.decode_into(t, &mut pieces),
                _ => pieces.extend_from_slice(t.as_bytes()),
            }
            let end = u32::try_from(pieces.len())
                .map_err(|_| TokenizerError::InvalidVocab("token text exceeds 4 GiB".into()))?;
            ends.push(end);
        }

        let byte_ids: [Option<u32>; 256] = std::array::from_fn(|b| {
            let c = bl.char_of(b as u8);
            ids.get(c.encode_utf8(&mut [0; 4]) as &str).copied()
        });
        let merges = g.get_str_array(keys::MERGES)?;
        let bpe = Bpe::new(
            merges.iter().filter_map(|m| {
                // As llama.cpp: split at the first space after the first byte; a merge naming
                // strings outside the vocabulary can never apply and is dropped.
                let first = m.chars().next()?.len_utf8();
                let pos = m[first..].find(' ')? + first;
                let (l, r) = (&m[..pos], &m[pos + 1..]);
                let merged = format!("{l}{r}");
                Some((*ids.get(l)?, *ids.get(r)?, *ids.get(&merged)?))
            }),
            byte_ids,
        );

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
        Ok(Vocab {
            tokens,
            types,
            ids,
            pieces,
            ends,
            special,
            bpe,
            add_bos,
        })
    }

    /// The decoded bytes and type of token `id`.
    pub(crate) fn piece(&self, id: u32) -> Option<(&[u8], TokenType)> {
        let i = id as usize;
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some((&self.pieces[start..end], self.types[i]))
    }

    /// eos, eot, then every control token llama.cpp counts as end of generation.
    pub(crate) fn stop_ids(&self) -> Vec<u32> {
        let mut out: Vec<u32> = [self.special.eos, self.special.eot]
            .into_iter()
            .flatten()
            .collect();
        for text in EOG_TEXTS {
            if let Some(&id) = self.ids.get(*text)
                && self.types[id as usize] == TokenType::Control
                && !out.contains(&id)
            {
                out.push(id);
            }
        }
        out
    }
}

fn read_types(arr: &Array, n: usize) -> Result<Vec<TokenType>, TokenizerError> {
    if arr.len() != n {
        return Err(TokenizerError::InvalidVocab(format!(
            "{} token types for {n} tokens",
            arr.len()
        )));
    }
    (0..n)
        .map(|i| {
            let raw = arr.integer_at(i).ok_or_else(|| {
                TokenizerError::InvalidVocab(format!(
                    "token types are {} values",
                    arr.element_type()
                ))
            })?;
            TokenType::from_id(raw)
                .ok_or_else(|| TokenizerError::InvalidVocab(format!("token {i} has type {raw}")))
        })
        .collect()
}

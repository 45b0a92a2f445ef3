//! The tokenizer of a GGUF model: special-token splitting, pre-tokenization, byte-level BPE,
//! decoding, and the chat template, all built from the file's metadata.

use std::path::Path;

use crate::bpe::Scratch;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::TokenizerError;
use crate::gguf::{GgufFile, optional};
use crate::pretokenize::{PreTokenizer, PreTokenizerKind};
use crate::special::{Fragment, SpecialMatcher};
use crate::vocab::{SpecialIds, TokenType, Vocab, keys};

/// A byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`) whose ids match llama.cpp's.
///
/// Immutable after construction and `Send + Sync`: share one behind an `Arc`.
pub struct GgufTokenizer {
    vocab: Vocab,
    pre_name: String,
    pre: PreTokenizer,
    /// Control, user-defined and unknown tokens: matched when special tokens are parsed.
    specials: SpecialMatcher,
    /// User-defined tokens only: matched even when special tokens are not parsed (llama.cpp).
    user_defined: SpecialMatcher,
    chat: ChatTemplate,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for GgufTokenizer {
    /// A summary: the derived form would print all 49k tokens into a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("merges", &self.merge_count())
            .field("pre", &self.pre_name)
            .field("special", &self.vocab.special)
            .finish_non_exhaustive()
    }
}

impl GgufTokenizer {
    /// Reads the tokenizer of the GGUF file at `path` (only the header is read).
    pub fn from_file(path: impl AsRef<Path>) -> Result<GgufTokenizer, TokenizerError> {
        Self::from_gguf(&GgufFile::open(path)?)
    }

    /// Builds the tokenizer from a parsed GGUF header.
    pub fn from_gguf(g: &GgufFile) -> Result<GgufTokenizer, TokenizerError> {
        let model = g.get_str(keys::MODEL)?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre_name = g.get_str(keys::PRE)?;
        let kind = PreTokenizerKind::from_gguf_name(pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_string()))?;
        let vocab = Vocab::from_gguf(g)?;
        let matcher = |pick: fn(TokenType) -> bool| {
            SpecialMatcher::new(
                vocab
                    .tokens
                    .iter()
                    .zip(&vocab.types)
                    .enumerate()
                    .filter(|(_, (_, ty))| pick(**ty))
                    .map(|(i, (t, _))| (t.clone(), i as u32)),
            )
        };
        let specials = matcher(TokenType::matched_in_text);
        let user_defined = matcher(|t| t == TokenType::UserDefined);
        let text_of = |id: Option<u32>| id.map(|i| vocab.tokens[i as usize].as_str()).unwrap_or("");
        let chat = match optional(g.get_str(keys::CHAT_TEMPLATE))? {
            Some(src) => {
                ChatTemplate::new(src, text_of(vocab.special.bos), text_of(vocab.special.eos))?
            }
            None => ChatTemplate::chatml(),
        };
        let stop_ids = vocab.stop_ids();
        Ok(GgufTokenizer {
            vocab,
            pre_name: pre_name.to_string(),
            pre: PreTokenizer::new(kind),
            specials,
            user_defined,
            chat,
            stop_ids,
        })
    }

    /// Token ids of `text`, with special tokens written in the text (`<|im_start|>`) parsed as
    /// such; nothing is added (no BOS, no leading space).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, true)
    }

    /// Token ids of `text`; with `parse_special` false, control tokens in the text are encoded
    /// as plain text (user-defined tokens still match, as in llama.cpp).
    pub fn encode_with(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut fragments = Vec::new();
        let matcher = if parse_special {
            &self.specials
        } else {
            &self.user_defined
        };
        matcher.split(text, &mut fragments);
        // About 4 bytes a token for English text.
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut scratch = Scratch::default();
        for f in fragments {
            match f {
                Fragment::Special(id) => out.push(id),
                Fragment::Text(t) => self.pre.split(t, |word| {
                    self.vocab
                        .bpe
                        .encode_word(word.as_bytes(), &mut scratch, &mut out)
                }),
            }
        }
        out
    }

    /// Text of `ids`: special tokens are skipped; ids outside the vocabulary give U+FFFD;
    /// byte sequences that are not UTF-8 are replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, true)
    }

    /// Text of `ids`, with the text of special tokens kept unless `skip_special`.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            self.append_token_bytes(id, skip_special, &mut bytes);
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Appends the bytes token `id` stands for (nothing for a skipped special token, U+FFFD for
    /// an id outside the vocabulary).
    pub fn append_token_bytes(&self, id: u32, skip_special: bool, out: &mut Vec<u8>) {
        match self.vocab.piece(id) {
            None => out.extend_from_slice("\u{FFFD}".as_bytes()),
            Some((bytes, ty)) => {
                let shown = matches!(ty, TokenType::Normal | TokenType::UserDefined);
                if shown || !skip_special {
                    out.extend_from_slice(bytes);
                }
            }
        }
    }

    /// The prompt for a conversation, ending where the assistant's answer begins.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        self.chat.render(messages, true)
    }

    /// The conversation rendered with the model's template, with or without the assistant
    /// header at the end.
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.chat.render(messages, add_generation_prompt)
    }

    /// The chat template in use (the file's, or ChatML when the file has none).
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat
    }

    /// Number of token ids (valid ids are `0..vocab_size`).
    pub fn vocab_size(&self) -> u32 {
        // Vocab::from_gguf rejects vocabularies of u32::MAX tokens or more.
        self.vocab.tokens.len() as u32
    }

    /// End-of-sequence id, if the model names one (SmolLM2: 2, `<|im_end|>`).
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// Tokens that end generation: eos, and every control token llama.cpp treats as end of
    /// generation (SmolLM2: `<|im_end|>` and `<|endoftext|>`).
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The special ids named in the metadata.
    pub fn special_ids(&self) -> SpecialIds {
        self.vocab.special
    }

    /// Whether the model asks for BOS to be prepended to prompts (SmolLM2: no).
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// The `tokenizer.ggml.pre` name the pre-tokenizer was chosen by.
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre_name
    }

    /// The vocabulary string of `id` (byte-level form, e.g. "Ġworld").
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.ids.get(token).copied()
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.types.get(id as usize).copied()
    }

    /// Number of merges in the BPE table.
    pub fn merge_count(&self) -> usize {
        self.vocab.bpe.merge_count()
    }
}

#[cfg(test)]
mod tests;

//! A real model's tokenizer: Hugging Face `tokenizers` built from a GGUF file's metadata or read
//! from a `tokenizer.json`, with the model's special ids, stop tokens and chat template.

use std::path::Path;

use tokenizers::{Model, OffsetReferential, OffsetType, PreTokenizer, Tokenizer};

use crate::chat::{ChatExtras, ChatMessage, ChatTemplate};
use crate::error::TokenizerError;
use crate::gguf::{GgufMetadata, optional};
use crate::hf::{self, PreTokenizerKind};
use crate::json::HfConfig;
use crate::vocab::{GgufVocab, SpecialIds, TokenType, keys, stop_ids};
use crate::words::{ByteChars, Words};

/// A model's tokenizer. For GGUF byte-level BPE (`tokenizer.ggml.model = "gpt2"`) its ids match
/// llama.cpp's and the model's own `tokenizer.json`.
///
/// Immutable after construction and `Send + Sync`: share one behind an `Arc`.
pub struct ModelTokenizer {
    /// Special tokens written in the text are parsed as such.
    hf: Tokenizer,
    /// The same pipeline with special tokens encoded as plain text.
    hf_text: Tokenizer,
    /// For the pre-tokenizers of the GGUF pipelines (built from GGUF metadata, or found in a
    /// `tokenizer.json`): their words cut on plain slices, the fast path of
    /// [`ModelTokenizer::encode`].
    fast: Option<FastWords>,
    /// Each id's type (llama.cpp's classes; from the added tokens for a `tokenizer.json`).
    types: Vec<TokenType>,
    /// The `tokenizer.ggml.pre` name, or "tokenizer.json".
    source: String,
    merges: usize,
    special: SpecialIds,
    add_bos: bool,
    chat: ChatTemplate,
    stop_ids: Vec<u32>,
}

/// What each source (GGUF metadata, `tokenizer.json`) provides; [`ModelTokenizer::assemble`]
/// derives the rest.
struct Parts {
    hf: Tokenizer,
    /// The pre-tokenizer, when it is one [`Words`] reproduces.
    fast: Option<PreTokenizerKind>,
    types: Vec<TokenType>,
    source: String,
    merges: usize,
    special: SpecialIds,
    add_bos: bool,
    chat: ChatTemplate,
}

impl std::fmt::Debug for ModelTokenizer {
    /// A summary: the derived form would print all 49k tokens into a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("merges", &self.merges)
            .field("source", &self.source)
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

impl ModelTokenizer {
    /// Reads the tokenizer of the GGUF file at `path` (only the header is read).
    pub fn from_file(path: impl AsRef<Path>) -> Result<ModelTokenizer, TokenizerError> {
        Self::from_gguf(&GgufMetadata::open(path)?)
    }

    /// Builds the tokenizer from a parsed GGUF header.
    pub fn from_gguf(g: &GgufMetadata) -> Result<ModelTokenizer, TokenizerError> {
        let model = g.get_str(keys::MODEL)?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre_name = g.get_str(keys::PRE)?;
        let kind = PreTokenizerKind::from_gguf_name(pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_string()))?;
        let v = GgufVocab::from_gguf(g)?;
        let hf = hf::from_gguf(&v, kind)?;
        let text_of = |id: Option<u32>| id.map(|i| v.tokens[i as usize].as_str()).unwrap_or("");
        let chat = match optional(g.get_str(keys::CHAT_TEMPLATE))? {
            Some(src) => ChatTemplate::new(src, text_of(v.special.bos), text_of(v.special.eos))?,
            None => ChatTemplate::chatml(),
        };
        Ok(Self::assemble(Parts {
            hf,
            fast: Some(kind),
            types: v.types,
            source: pre_name.to_string(),
            merges: v.merges.len(),
            special: v.special,
            add_bos: v.add_bos,
            chat,
        }))
    }

    /// Reads a Hugging Face `tokenizer.json`, and the special tokens, BOS flag and chat template
    /// from the `tokenizer_config.json` beside it when there is one (ChatML and no special ids
    /// otherwise).
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<ModelTokenizer, TokenizerError> {
        let path = path.as_ref();
        let hf = Tokenizer::from_file(path).map_err(|e| TokenizerError::TokenizerJson {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let config = HfConfig::beside(path)?;
        let n = hf.get_vocab_size(true);
        let mut types = vec![TokenType::Normal; n];
        for (id, t) in hf.get_added_tokens_decoder() {
            if let Some(ty) = types.get_mut(id as usize) {
                *ty = if t.special {
                    TokenType::Control
                } else {
                    TokenType::UserDefined
                };
            }
        }
        let id = |t: &Option<String>| t.as_deref().and_then(|t| hf.token_to_id(t));
        let special = SpecialIds {
            bos: id(&config.bos_token),
            eos: id(&config.eos_token),
            unk: id(&config.unk_token),
            pad: id(&config.pad_token),
            eot: None,
        };
        let chat = match &config.chat_template {
            Some(src) => ChatTemplate::new(
                src,
                config.bos_token.as_deref().unwrap_or(""),
                config.eos_token.as_deref().unwrap_or(""),
            )?,
            None => ChatTemplate::chatml(),
        };
        // A pre-tokenizer the GGUF pipelines use takes their fast path here too.
        let fast = hf.get_pre_tokenizer().and_then(PreTokenizerKind::of);
        Ok(Self::assemble(Parts {
            hf,
            fast,
            types,
            source: "tokenizer.json".into(),
            merges: 0,
            special,
            add_bos: config.add_bos_token,
            chat,
        }))
    }

    /// The tokenizer of `parts`, with what follows from them: the text-only pipeline, the fast
    /// path, the stop tokens.
    fn assemble(parts: Parts) -> ModelTokenizer {
        let Parts {
            hf,
            fast,
            types,
            source,
            merges,
            special,
            add_bos,
            chat,
        } = parts;
        let mut hf_text = hf.clone();
        hf_text.set_encode_special_tokens(true);
        let fast = fast.map(|kind| FastWords {
            words: Words::new(kind),
            chars: ByteChars::new(),
        });
        let stop_ids = stop_ids(
            special,
            |t| hf.token_to_id(t),
            |id| types.get(id as usize).copied(),
        );
        ModelTokenizer {
            hf,
            hf_text,
            fast,
            types,
            source,
            merges,
            special,
            add_bos,
            chat,
            stop_ids,
        }
    }

    /// Token ids of `text`, with special tokens written in the text (`<|im_start|>`) parsed as
    /// such; nothing is added (no BOS, no leading space).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, true)
    }

    /// Token ids of `text`; with `parse_special` false, control tokens in the text are encoded
    /// as plain text (user-defined tokens still match, as in llama.cpp).
    pub fn encode_with(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let tok = if parse_special {
            &self.hf
        } else {
            &self.hf_text
        };
        // The pipeline can fail only for a model with an unknown token missing from its
        // vocabulary (a broken tokenizer.json); GGUF BPE drops bytes it lacks, as llama.cpp.
        match &self.fast {
            Some(fast) => fast.ids(tok, text),
            None => ids_of(tok, text),
        }
        .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Text of `ids`: special tokens are skipped; ids outside the vocabulary give U+FFFD;
    /// byte sequences that are not UTF-8 are replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, true)
    }

    /// Text of `ids`, with the text of special tokens kept unless `skip_special`.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> String {
        let n = self.vocab_size();
        let mut out = String::new();
        // tokenizers leaves out ids it does not know; they show as U+FFFD here instead.
        for (i, run) in ids.split(|&id| id >= n).enumerate() {
            if i > 0 {
                out.push('\u{FFFD}');
            }
            if !run.is_empty() {
                // Decoding known ids through the byte-level decoder cannot fail.
                out.push_str(&self.hf.decode(run, skip_special).unwrap_or_default());
            }
        }
        out
    }

    /// The prompt for a conversation, ending where the assistant's answer begins.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        self.chat.render(messages, true)
    }

    /// The prompt for a conversation with what the request adds to it ([`ChatExtras`]: the
    /// tools the model may call, documents, the template's own variables, where the text ends,
    /// the request's own template).
    pub fn render_chat_with_extras(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
    ) -> Result<String, TokenizerError> {
        self.chat.render_with(messages, extras)
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
        // Vocabularies of u32::MAX tokens or more are refused at load.
        self.types.len() as u32
    }

    /// End-of-sequence id, if the model names one (SmolLM2: 2, `<|im_end|>`).
    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }

    /// Tokens that end generation: eos, and every control token llama.cpp treats as end of
    /// generation (SmolLM2: `<|im_end|>` and `<|endoftext|>`).
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The special ids named in the metadata.
    pub fn special_ids(&self) -> SpecialIds {
        self.special
    }

    /// Whether the model asks for BOS to be prepended to prompts (SmolLM2: no).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The pre-tokenizer that [`encode`](Self::encode) runs on plain slices instead of through
    /// `tokenizers` (see `words.rs`), or `None` when `tokenizers` runs the whole pipeline.
    pub fn fast_pre_tokenizer(&self) -> Option<PreTokenizerKind> {
        self.fast.as_ref().map(|f| f.words.kind())
    }

    /// Where the pipeline came from: the `tokenizer.ggml.pre` name it was built for, or
    /// "tokenizer.json".
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The vocabulary string of `id` (byte-level form, e.g. "Ġworld").
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.hf.id_to_token(id)
    }

    /// The id of a vocabulary string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Number of merges in the GGUF file (0 for a `tokenizer.json`).
    pub fn merge_count(&self) -> usize {
        self.merges
    }

    /// The Hugging Face tokenizer itself (special tokens parsed), e.g. to save it as a
    /// `tokenizer.json` or to decode a stream with its `decode_stream`.
    pub fn hf(&self) -> &Tokenizer {
        &self.hf
    }
}

/// The ids of `text`: `tokenizers`' own pipeline (added tokens, normalizer, pre-tokenizer,
/// model) without building an `Encoding`, whose per-token strings, offsets and word ids a server
/// never reads. No post-processor, truncation or padding applies: nothing is added to a prompt,
/// and the router refuses a long one rather than cutting it.
fn ids_of(tok: &Tokenizer, text: &str) -> tokenizers::Result<Vec<u32>> {
    let mut pre = tok
        .get_added_vocabulary()
        .extract_and_normalize(tok.get_normalizer(), text);
    if let Some(p) = tok.get_pre_tokenizer() {
        p.pre_tokenize(&mut pre)?;
    }
    let model = tok.get_model();
    pre.tokenize(|n| model.tokenize(n.get()))?;
    Ok(pre
        .get_splits(OffsetReferential::Original, OffsetType::None)
        .into_iter()
        .flat_map(|(_, _, tokens)| tokens.iter().flatten().map(|t| t.id))
        .collect())
}

/// A GGUF pipeline's pre-tokenizer on plain slices (see [`crate::words`]).
#[derive(Clone, Debug)]
struct FastWords {
    words: Words,
    chars: ByteChars,
}

impl FastWords {
    /// The ids [`ids_of`] gives: `tokenizers`' added tokens, normalizer and model, the words
    /// between the added tokens cut by [`Words`] instead of `tokenizers`' pre-tokenizer (the
    /// same words, proved by `words`' property tests).
    fn ids(&self, tok: &Tokenizer, text: &str) -> tokenizers::Result<Vec<u32>> {
        let pre = tok
            .get_added_vocabulary()
            .extract_and_normalize(tok.get_normalizer(), text);
        let model = tok.get_model();
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut word = String::new();
        for (piece, _, tokens) in pre.get_splits(OffsetReferential::Normalized, OffsetType::None) {
            if let Some(tokens) = tokens {
                ids.extend(tokens.iter().map(|t| t.id));
                continue;
            }
            self.words.each(piece, |w| {
                self.chars.write(w, &mut word);
                ids.extend(model.tokenize(&word)?.into_iter().map(|t| t.id));
                tokenizers::Result::Ok(())
            })?;
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests;

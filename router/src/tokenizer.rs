//! Tokenizers behind one trait, and incremental detokenization for streamed output.
//!
//! The router tokenizes prompts with the same tokenizer as the workers (prefix-cache hashes are
//! computed over token ids, so both sides must agree). [`SimTokenizer`] is the deterministic
//! byte-level tokenizer the simulated engine speaks; [`HfModelTokenizer`] is a real model's,
//! read from its GGUF file, behind the same [`Tokenizer`] trait.

mod model;

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

pub use model::{HfModelTokenizer, TokenizerLoadError};

pub use dolphin_tokenizer::{ChatExtras, ChatMessage, Ending, ToolCall};

/// A request's own variables for the chat template (vLLM's and SGLang's
/// `chat_template_kwargs`, such as Qwen3's `enable_thinking`): a JSON object, without the
/// names the renderer sets itself.
pub fn template_kwargs(
    v: serde_json::Value,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let serde_json::Value::Object(map) = v else {
        return Err(format!("must be an object of template variables, got {v}"));
    };
    if let Some(name) = dolphin_tokenizer::RESERVED_NAMES
        .iter()
        .find(|n| map.contains_key(**n))
    {
        return Err(format!("{name} is set by the server, not by the request"));
    }
    Ok(map)
}

/// Where a request's chat prompt ends, from vLLM's `continue_final_message` and
/// `add_generation_prompt` (absent: true); both true is refused.
pub fn ending(continue_final: bool, add_generation_prompt: Option<bool>) -> Result<Ending, String> {
    match (continue_final, add_generation_prompt) {
        (true, Some(true)) => Err("continue_final_message and add_generation_prompt cannot both be true: the last message is either continued or answered".into()),
        (true, _) => Ok(Ending::ContinueLast),
        (false, Some(false)) => Ok(Ending::LastMessage),
        (false, _) => Ok(Ending::AssistantTurn),
    }
}

/// A request's `documents`: a list of objects (`{"title": ..., "text": ...}`).
pub fn documents(v: serde_json::Value) -> Result<serde_json::Value, String> {
    match v {
        serde_json::Value::Array(d) if d.iter().all(serde_json::Value::is_object) => {
            Ok(serde_json::Value::Array(d))
        }
        v => Err(format!(
            "must be a list of objects (such as {{\"title\": ..., \"text\": ...}}), got {v}"
        )),
    }
}

/// A request's own chat template (`chat_template`): `None` when empty (the model's is used),
/// refused where the router does not trust request templates (`--trust-request-chat-template`).
pub fn request_template(source: String, trusted: bool) -> Result<Option<String>, String> {
    if source.is_empty() {
        return Ok(None);
    }
    if !trusted {
        return Err("chat_template is not accepted by this server: it renders the model's own template (a router started with --trust-request-chat-template accepts a request's own)".into());
    }
    Ok(Some(source))
}

/// Text <-> token ids for one model.
pub trait Tokenizer: Send + Sync + Debug {
    /// Token ids of `text` (no special tokens added).
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError>;
    /// Text of `ids`; special tokens are skipped, ids the vocabulary lacks give U+FFFD.
    fn decode(&self, ids: &[u32]) -> String;
    /// The prompt text for a conversation, with what the request adds ([`ChatExtras`]: the
    /// tools the model may call, documents, the template's own variables, where the text ends
    /// (by default where the assistant's answer begins), the request's own template). A
    /// template may refuse a conversation (e.g. roles out of order): the request is then
    /// invalid (HTTP 400 / INVALID_ARGUMENT).
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
    ) -> Result<String, ChatTemplateError>;
    /// Number of token ids (valid ids are `0..vocab_size`).
    fn vocab_size(&self) -> u32;
    /// End-of-sequence token id, if the model has one.
    fn eos(&self) -> Option<u32>;
    /// The tokens that end the model's output: its end of sequence and every control token
    /// the engine treats as one (SmolLM2: `<|im_end|>` and `<|endoftext|>`).
    fn end_tokens(&self) -> &[u32] {
        &[]
    }
    /// The id of the token written `text` (a control token such as Mistral's
    /// `[TOOL_CALLS]`), if the vocabulary has it.
    fn token_id(&self, _text: &str) -> Option<u32> {
        None
    }
    /// The text of token `id`, special tokens included.
    fn token_text(&self, id: u32) -> String {
        self.decode(&[id])
    }
    /// Text of `ids` with special tokens written out (vLLM's `skip_special_tokens: false`).
    fn decode_with_specials(&self, ids: &[u32]) -> String {
        self.decode(ids)
    }
    /// The beginning-of-sequence token the model's tokenizer puts before a prompt
    /// (`add_bos_token`), if it does: vLLM's `add_special_tokens` adds it.
    fn bos_to_add(&self) -> Option<u32> {
        None
    }
}

/// Names tokens by their ids, `token_id:<id>` (vLLM's `return_tokens_as_token_ids`: log
/// probabilities a client can map back to ids whatever the text); the rest is the model's.
#[derive(Debug)]
pub struct TokenIdNames(pub Arc<dyn Tokenizer>);

impl Tokenizer for TokenIdNames {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.0.encode(text)
    }

    fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|id| format!("token_id:{id}")).collect()
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
    ) -> Result<String, ChatTemplateError> {
        self.0.render_chat(messages, extras)
    }

    fn vocab_size(&self) -> u32 {
        self.0.vocab_size()
    }

    fn eos(&self) -> Option<u32> {
        self.0.eos()
    }

    fn token_text(&self, id: u32) -> String {
        self.decode(&[id])
    }
}

/// The text of `ids` with the tokens in `keep` written out, though special (the control
/// tokens that mark a model's tool calls, which the tool call parser reads).
pub fn decode_keeping(tokenizer: &dyn Tokenizer, ids: &[u32], keep: &[u32]) -> String {
    if keep.is_empty() || !ids.iter().any(|id| keep.contains(id)) {
        return tokenizer.decode(ids);
    }
    let mut out = String::new();
    for run in ids.split_inclusive(|id| keep.contains(id)) {
        match run.split_last() {
            Some((last, before)) if keep.contains(last) => {
                out.push_str(&tokenizer.decode(before));
                out.push_str(&tokenizer.token_text(*last));
            }
            _ => out.push_str(&tokenizer.decode(run)),
        }
    }
    out
}

/// The tokenizer failed on a text (a model whose tokenizer is broken); the message says why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tokenizing failed: {0}")]
pub struct EncodeError(pub String);

/// The chat template could not render a conversation; the message says why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("chat template: {0}")]
pub struct ChatTemplateError(pub String);

/// Deterministic byte-level tokenizer of the simulated engine.
///
/// Ids 0, 1, 2 are pad, bos and eos. Printable ASCII (32..=126) maps to 3..=97 and newline to 98,
/// so every id in 3..=98 (the range the sim engine emits) decodes to readable text. Any other byte
/// `b` maps to `99 + b` (99..=354); those ids decode back to their byte, including the ones never
/// produced by `encode` (a printable byte through the raw range), which keeps decoding total.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimTokenizer;

/// First id of the printable ASCII range.
const PRINTABLE_BASE: u32 = 3;
/// Id of the newline byte.
const NEWLINE_ID: u32 = 98;
/// First id of the raw byte range.
const RAW_BASE: u32 = 99;
/// Vocabulary size of [`SimTokenizer`].
pub const SIM_VOCAB_SIZE: u32 = RAW_BASE + 256;
/// End-of-sequence id of [`SimTokenizer`].
pub const SIM_EOS: u32 = 2;

impl SimTokenizer {
    /// Token ids of `text`: one per byte; never fails.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(Self::byte_to_id).collect()
    }

    fn byte_to_id(b: u8) -> u32 {
        match b {
            32..=126 => PRINTABLE_BASE + u32::from(b - 32),
            b'\n' => NEWLINE_ID,
            _ => RAW_BASE + u32::from(b),
        }
    }

    /// The byte an id stands for; `None` for special tokens and ids outside the vocabulary.
    fn id_to_byte(id: u32) -> IdKind {
        match id {
            0..=2 => IdKind::Special,
            PRINTABLE_BASE..=97 => IdKind::Byte((id - PRINTABLE_BASE + 32) as u8),
            NEWLINE_ID => IdKind::Byte(b'\n'),
            RAW_BASE..SIM_VOCAB_SIZE => IdKind::Byte((id - RAW_BASE) as u8),
            _ => IdKind::Unknown,
        }
    }
}

enum IdKind {
    Special,
    Byte(u8),
    Unknown,
}

impl Tokenizer for SimTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        Ok(SimTokenizer::encode(self, text))
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len());
        for &id in ids {
            match Self::id_to_byte(id) {
                IdKind::Special => {}
                IdKind::Byte(b) => bytes.push(b),
                IdKind::Unknown => bytes.extend_from_slice("\u{FFFD}".as_bytes()),
            }
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
    ) -> Result<String, ChatTemplateError> {
        // ChatML, as SmolLM2 uses it: the sim model has no template of its own, and sharing the
        // real model's shape keeps prompt lengths (and so cache behaviour) realistic. Tools and
        // calls as Qwen2.5's template writes them (Hermes tags). A request's own template is
        // rendered as on a real model.
        if let Some(source) = &extras.template {
            return dolphin_tokenizer::ChatTemplate::chatml()
                .for_request(source)
                .and_then(|t| t.render_with(messages, extras))
                .map_err(|e| ChatTemplateError(dolphin_cluster::error_chain(&e)));
        }
        let mut out = String::new();
        if let Some(tools) = &extras.tools {
            out.push_str("<|im_start|>system\n<tools>\n");
            out.push_str(&tools.to_string());
            out.push_str("\n</tools><|im_end|>\n");
        }
        for m in messages {
            out.push_str("<|im_start|>");
            out.push_str(&m.role);
            out.push('\n');
            out.push_str(&m.content);
            for c in &m.tool_calls {
                let call = serde_json::json!({"name": c.name, "arguments": c.arguments});
                out.push_str(&format!("\n<tool_call>\n{call}\n</tool_call>"));
            }
            out.push_str("<|im_end|>\n");
        }
        match extras.ending {
            Ending::AssistantTurn => out.push_str("<|im_start|>assistant\n"),
            Ending::LastMessage => {}
            Ending::ContinueLast => {
                if let Some(open) = out.strip_suffix("<|im_end|>\n") {
                    out.truncate(open.len());
                }
            }
        }
        Ok(out)
    }

    fn vocab_size(&self) -> u32 {
        SIM_VOCAB_SIZE
    }

    fn eos(&self) -> Option<u32> {
        Some(SIM_EOS)
    }

    fn end_tokens(&self) -> &[u32] {
        &[SIM_EOS]
    }

    fn decode_with_specials(&self, ids: &[u32]) -> String {
        let mut out = String::new();
        for run in ids.split_inclusive(|&id| id < PRINTABLE_BASE) {
            match run.split_last() {
                Some((&last, before)) if last < PRINTABLE_BASE => {
                    out.push_str(&self.decode(before));
                    out.push_str(["<pad>", "<s>", "</s>"][last as usize]);
                }
                _ => out.push_str(&self.decode(run)),
            }
        }
        out
    }
}

/// Turns a stream of token ids into text deltas without splitting multi-byte characters.
///
/// Works for any [`Tokenizer`]: it decodes a short window of recent ids and emits what the newest
/// id added, holding text back while it ends in an incomplete character (U+FFFD).
#[derive(Debug, Default)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    /// Start of the window whose text was already emitted up to `read_offset`.
    prefix_offset: usize,
    read_offset: usize,
    /// Which special tokens are written out.
    specials: Specials,
}

/// Which special tokens a text writes out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Specials {
    /// None (what clients get by default).
    #[default]
    Skip,
    /// These (the control tokens a tool call parser reads, [`decode_keeping`]).
    Keep(Vec<u32>),
    /// Every one (vLLM's `skip_special_tokens: false`).
    All,
}

impl IncrementalDetokenizer {
    /// A detokenizer with no tokens yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A detokenizer that writes out `specials`.
    pub fn with(specials: Specials) -> Self {
        Self {
            specials,
            ..Self::default()
        }
    }

    fn decode(&self, tokenizer: &dyn Tokenizer, from: usize, to: usize) -> String {
        let ids = &self.ids[from..to];
        match &self.specials {
            Specials::Skip => tokenizer.decode(ids),
            Specials::Keep(keep) => decode_keeping(tokenizer, ids, keep),
            Specials::All => tokenizer.decode_with_specials(ids),
        }
    }

    /// Adds `new_ids` and returns the text they complete (possibly empty).
    pub fn push(&mut self, tokenizer: &dyn Tokenizer, new_ids: &[u32]) -> String {
        self.ids.extend_from_slice(new_ids);
        let prefix = self.decode(tokenizer, self.prefix_offset, self.read_offset);
        let full = self.decode(tokenizer, self.prefix_offset, self.ids.len());
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            // Keep the held window short: only ids after the last emitted point matter.
            if self.prefix_offset > 64 {
                self.ids.drain(..self.prefix_offset);
                self.read_offset -= self.prefix_offset;
                self.prefix_offset = 0;
            }
            delta
        } else {
            String::new()
        }
    }

    /// Text still held back (an incomplete character at the end of the stream), decoded lossily.
    pub fn flush(&mut self, tokenizer: &dyn Tokenizer) -> String {
        let prefix = self.decode(tokenizer, self.prefix_offset, self.read_offset);
        let full = self.decode(tokenizer, self.prefix_offset, self.ids.len());
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            full[prefix.len()..].to_string()
        } else {
            String::new()
        }
    }
}

/// The tokenizers the router can load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenizerKind {
    /// [`SimTokenizer`], for the simulated engine.
    Sim,
    /// [`HfModelTokenizer`]: the tokenizer and chat template of the GGUF model file the
    /// workers serve (`--model-path`).
    Gguf,
    /// [`HfModelTokenizer`]: a Hugging Face `tokenizer.json` (`--model-path` names the file or
    /// the model directory holding it), with its `tokenizer_config.json` when present.
    Hf,
}

/// A tokenizer that cannot be built from the configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildTokenizerError {
    /// `gguf` and `hf` need the model file.
    #[error("--tokenizer gguf and hf need --model-path")]
    MissingModelPath,
    /// The model file's tokenizer could not be read.
    #[error(transparent)]
    Load(#[from] TokenizerLoadError),
}

impl TokenizerKind {
    /// Builds the tokenizer; `gguf` reads it from `model_path` (the file's header only), `hf`
    /// from the `tokenizer.json` at (or in) `model_path`.
    pub fn build(
        self,
        model_path: Option<&Path>,
    ) -> Result<Arc<dyn Tokenizer>, BuildTokenizerError> {
        match self {
            TokenizerKind::Sim => Ok(Arc::new(SimTokenizer)),
            TokenizerKind::Gguf => {
                let path = model_path.ok_or(BuildTokenizerError::MissingModelPath)?;
                Ok(Arc::new(HfModelTokenizer::from_file(path)?))
            }
            TokenizerKind::Hf => {
                let path = model_path.ok_or(BuildTokenizerError::MissingModelPath)?;
                Ok(Arc::new(HfModelTokenizer::from_tokenizer_json(path)?))
            }
        }
    }
}

/// The model name served for a Hugging Face model when `--model` is not given: the model
/// directory's name (`path` is the directory or its `tokenizer.json`).
pub fn model_name_for_hf_path(path: &Path) -> String {
    let dir = if path.is_dir() {
        Some(path)
    } else {
        path.parent()
    };
    dir.and_then(Path::file_name)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// The model name served for a GGUF file when `--model` is not given: the file name without
/// its extension (workers and router derive it alike, so they agree without configuration).
pub fn model_name_for_path(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn printable_ascii_and_newline_map_to_3_through_98() {
        let t = SimTokenizer;
        assert_eq!(t.encode(" "), vec![3]);
        assert_eq!(t.encode("~"), vec![97]);
        assert_eq!(t.encode("\n"), vec![98]);
        assert_eq!(t.encode("A"), vec![3 + 65 - 32]);
        let all: Vec<u32> = (3..=98).collect();
        let text = t.decode(&all);
        assert_eq!(text.len(), 96);
        assert_eq!(t.encode(&text), all);
    }

    #[test]
    fn specials_are_skipped_and_unknown_ids_replaced() {
        let t = SimTokenizer;
        assert_eq!(t.decode(&[1, 3 + 72 - 32, 2, 0]), "H");
        assert_eq!(t.decode(&[SIM_VOCAB_SIZE, 3]), "\u{FFFD} ");
        assert_eq!(t.vocab_size(), 355);
        assert_eq!(t.eos(), Some(2));
    }

    #[test]
    fn raw_range_decodes_printable_bytes_too() {
        let t = SimTokenizer;
        assert_eq!(t.decode(&[RAW_BASE + u32::from(b'a')]), "a");
        assert_eq!(t.encode("\t"), vec![RAW_BASE + 9]);
    }

    #[test]
    fn chat_is_rendered_as_chatml() {
        let t = SimTokenizer;
        let msgs = [ChatMessage::new("user", "hi")];
        assert_eq!(
            t.render_chat(&msgs, &ChatExtras::default())
                .expect("renders"),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn detokenizer_holds_back_split_characters() {
        let t = SimTokenizer;
        let ids = t.encode("é!");
        assert_eq!(ids.len(), 3);
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(&t, &ids[..1]), "");
        assert_eq!(d.push(&t, &ids[1..2]), "é");
        assert_eq!(d.push(&t, &ids[2..]), "!");
        assert_eq!(d.flush(&t), "");
    }

    #[test]
    fn detokenizer_flushes_incomplete_tail() {
        let t = SimTokenizer;
        let ids = t.encode("é");
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(&t, &ids[..1]), "");
        assert_eq!(d.flush(&t), "\u{FFFD}");
    }

    #[test]
    fn gguf_needs_a_model_path_and_names_follow_the_file() {
        assert!(matches!(
            TokenizerKind::Gguf.build(None),
            Err(BuildTokenizerError::MissingModelPath)
        ));
        assert!(TokenizerKind::Sim.build(None).is_ok());
        assert_eq!(
            model_name_for_path(Path::new("/m/SmolLM2-135M-Instruct.Q4_1.gguf")),
            "SmolLM2-135M-Instruct.Q4_1"
        );
    }

    proptest! {
        #[test]
        fn roundtrip_any_string(s in ".*") {
            let t = SimTokenizer;
            prop_assert_eq!(t.decode(&t.encode(&s)), s);
        }

        #[test]
        fn incremental_equals_whole(s in ".{0,200}", chunk in 1usize..5) {
            let t = SimTokenizer;
            let ids = t.encode(&s);
            let mut d = IncrementalDetokenizer::new();
            let mut out = String::new();
            for c in ids.chunks(chunk) {
                out.push_str(&d.push(&t, c));
            }
            out.push_str(&d.flush(&t));
            prop_assert_eq!(out, s);
        }

        #[test]
        fn sim_output_range_decodes_to_printable(ids in proptest::collection::vec(3u32..=98, 0..100)) {
            let t = SimTokenizer;
            let s = t.decode(&ids);
            prop_assert_eq!(s.len(), ids.len());
            prop_assert!(s.bytes().all(|b| b == b'\n' || (32..=126).contains(&b)));
        }
    }
}

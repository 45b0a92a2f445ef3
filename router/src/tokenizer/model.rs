//! [`HfModelTokenizer`]: a real model's tokenizer (Hugging Face `tokenizers`, through
//! `dolphin_tokenizer`), read from its GGUF file's metadata or a `tokenizer.json`, behind the
//! router's [`Tokenizer`] trait.

use std::path::{Path, PathBuf};

use dolphin_tokenizer::ModelTokenizer;

use super::{ChatExtras, ChatMessage, ChatTemplateError, EncodeError, Tokenizer};

/// A model's tokenizer and chat template, as the workers serving it use them.
#[derive(Debug)]
pub struct HfModelTokenizer {
    inner: ModelTokenizer,
}

/// A model file whose tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the tokenizer of {path}")]
pub struct TokenizerLoadError {
    /// The model file.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: dolphin_tokenizer::TokenizerError,
}

impl HfModelTokenizer {
    /// Reads the tokenizer from the header of the GGUF file at `path` (not the weights).
    pub fn from_file(path: &Path) -> Result<Self, TokenizerLoadError> {
        let inner = ModelTokenizer::from_file(path).map_err(|source| TokenizerLoadError {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self { inner })
    }

    /// Reads a Hugging Face `tokenizer.json`: `path` is the file or the model directory that
    /// holds it (with its `tokenizer_config.json`, when present, for the special tokens and
    /// the chat template).
    pub fn from_tokenizer_json(path: &Path) -> Result<Self, TokenizerLoadError> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let inner = ModelTokenizer::from_tokenizer_json(&file)
            .map_err(|source| TokenizerLoadError { path: file, source })?;
        Ok(Self { inner })
    }

    /// The underlying tokenizer.
    pub fn inner(&self) -> &ModelTokenizer {
        &self.inner
    }
}

impl Tokenizer for HfModelTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        // Special tokens written in the text are parsed, as llama.cpp's server does: chat
        // prompts rendered by the template carry `<|im_start|>` and friends as text.
        self.inner
            .encode(text)
            .map_err(|e| EncodeError(dolphin_cluster::error_chain(&e)))
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids)
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
    ) -> Result<String, ChatTemplateError> {
        self.inner
            .render_chat_with_extras(messages, extras)
            .map_err(|e| ChatTemplateError(dolphin_cluster::error_chain(&e)))
    }

    fn vocab_size(&self) -> u32 {
        self.inner.vocab_size()
    }

    fn eos(&self) -> Option<u32> {
        self.inner.eos()
    }

    fn end_tokens(&self) -> &[u32] {
        self.inner.stop_token_ids()
    }

    fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    fn token_text(&self, id: u32) -> String {
        self.inner.decode_with(&[id], false)
    }

    fn decode_with_specials(&self, ids: &[u32]) -> String {
        self.inner.decode_with(ids, false)
    }

    fn bos_to_add(&self) -> Option<u32> {
        self.inner
            .special_ids()
            .bos
            .filter(|_| self.inner.add_bos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dolphin_tokenizer::gguf::{Value, write_metadata};

    /// A tiny GGUF holding only tokenizer metadata: bytes `a`, `b`, the merge `a b`, and two
    /// control tokens; `template` is its chat template.
    fn tiny_gguf(dir: &Path, template: &str) -> PathBuf {
        tiny_gguf_with(dir, template, Vec::new())
    }

    /// [`tiny_gguf`] with more metadata.
    fn tiny_gguf_with(dir: &Path, template: &str, more: Vec<(&str, Value)>) -> PathBuf {
        let tokens = ["a", "b", "ab", "<|im_start|>", "<|im_end|>", "\u{10a}"];
        let types = [1i32, 1, 1, 3, 3, 1];
        let strings = |items: &[&str]| {
            Value::Array(items.iter().map(|s| Value::String(s.to_string())).collect())
        };
        let mut metadata = vec![
            ("general.architecture", Value::String("llama".into())),
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("smollm".into())),
            ("tokenizer.ggml.tokens", strings(&tokens)),
            (
                "tokenizer.ggml.token_type",
                Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
            ),
            ("tokenizer.ggml.merges", strings(&["a b"])),
            ("tokenizer.ggml.eos_token_id", Value::U32(4)),
            ("tokenizer.chat_template", Value::String(template.into())),
        ];
        metadata.extend(more);
        let bytes = write_metadata(&metadata).expect("metadata");
        let path = dir.join("tiny.gguf");
        std::fs::write(&path, bytes).expect("write gguf");
        path
    }

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn encodes_decodes_and_renders_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = HfModelTokenizer::from_file(&tiny_gguf(dir.path(), CHATML)).expect("loads");
        assert_eq!(t.vocab_size(), 6);
        assert_eq!(t.eos(), Some(4));
        assert_eq!(t.encode("ab"), Ok(vec![2]));
        assert_eq!(t.encode("<|im_start|>ab"), Ok(vec![3, 2]));
        assert_eq!(t.decode(&[3, 2, 0, 4]), "aba");
        // Control tokens written out where asked (a tool call parser's markers), alone or
        // streamed.
        assert_eq!(t.token_id("<|im_start|>"), Some(3));
        assert_eq!(t.token_text(3), "<|im_start|>");
        assert_eq!(
            super::super::decode_keeping(&t, &[2, 3, 2, 0, 4], &[3]),
            "ab<|im_start|>aba"
        );
        let mut detok =
            super::super::IncrementalDetokenizer::with(super::super::Specials::Keep(vec![3]));
        let streamed: String = [2, 3, 2, 0, 4]
            .iter()
            .map(|&id| detok.push(&t, &[id]))
            .collect();
        assert_eq!(streamed, "ab<|im_start|>aba");
        // Every special token written out (`skip_special_tokens: false`).
        assert_eq!(
            t.decode_with_specials(&[3, 2, 0, 4]),
            "<|im_start|>aba<|im_end|>"
        );
        let mut all = super::super::IncrementalDetokenizer::with(super::super::Specials::All);
        let streamed: String = [2, 3, 4].iter().map(|&id| all.push(&t, &[id])).collect();
        assert_eq!(streamed, "ab<|im_start|><|im_end|>");
        // No `add_bos_token`: prompts get no BOS; with it, its BOS.
        assert_eq!(t.bos_to_add(), None);
        let bos = tiny_gguf_with(
            dir.path(),
            CHATML,
            vec![
                ("tokenizer.ggml.bos_token_id", Value::U32(3)),
                ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
            ],
        );
        let with_bos = HfModelTokenizer::from_file(&bos).expect("loads");
        assert_eq!(with_bos.bos_to_add(), Some(3));
        let text = t
            .render_chat(&[ChatMessage::new("user", "ab")], &ChatExtras::default())
            .expect("renders");
        assert_eq!(
            text,
            "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn the_requests_tools_and_variables_reach_the_template() {
        let dir = tempfile::tempdir().expect("tempdir");
        let template = "{% if tools %}{{ tools | tojson }}{% endif %}{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}{{ messages[0].content.upper() }}";
        let t = HfModelTokenizer::from_file(&tiny_gguf(dir.path(), template)).expect("loads");
        let kwargs = super::super::template_kwargs(serde_json::json!({"enable_thinking": false}))
            .expect("variables");
        let extras = ChatExtras {
            tools: Some(serde_json::json!([{"type": "function", "function": {"name": "f"}}])),
            kwargs,
            ..ChatExtras::default()
        };
        let text = t
            .render_chat(&[ChatMessage::new("user", "ab")], &extras)
            .expect("renders");
        assert_eq!(
            text,
            r#"[{"type": "function", "function": {"name": "f"}}]/no_thinkAB"#
        );
        for bad in [
            serde_json::json!([1]),
            serde_json::json!({"eos_token": "x"}),
        ] {
            assert!(super::super::template_kwargs(bad).is_err());
        }
    }

    #[test]
    fn template_errors_are_reported_not_panicked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let template = "{{ raise_exception('only user messages') }}";
        let t = HfModelTokenizer::from_file(&tiny_gguf(dir.path(), template)).expect("loads");
        let err = t
            .render_chat(&[ChatMessage::new("system", "x")], &ChatExtras::default())
            .expect_err("the template raises");
        assert!(err.0.contains("only user messages"), "{err}");
    }

    #[test]
    fn a_model_directory_with_tokenizer_json_serves_like_its_gguf() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gguf = HfModelTokenizer::from_file(&tiny_gguf(dir.path(), CHATML)).expect("loads");
        let model = dir.path().join("Tiny-Model");
        std::fs::create_dir(&model).expect("mkdir");
        gguf.inner()
            .hf()
            .save(model.join("tokenizer.json"), false)
            .expect("save");
        let config = serde_json::json!({ "eos_token": "<|im_end|>", "chat_template": CHATML });
        std::fs::write(model.join("tokenizer_config.json"), config.to_string()).expect("write");
        let built = super::super::TokenizerKind::Hf
            .build(Some(&model))
            .expect("the directory loads");
        for text in ["ab", "<|im_start|>ab", "abab a"] {
            assert_eq!(built.encode(text), gguf.encode(text), "{text}");
        }
        assert_eq!(
            (built.eos(), built.vocab_size()),
            (gguf.eos(), gguf.vocab_size())
        );
        let msgs = [ChatMessage::new("user", "ab")];
        assert_eq!(
            built.render_chat(&msgs, &ChatExtras::default()),
            gguf.render_chat(&msgs, &ChatExtras::default())
        );
        assert_eq!(super::super::model_name_for_hf_path(&model), "Tiny-Model");
        assert_eq!(
            super::super::model_name_for_hf_path(&model.join("tokenizer.json")),
            "Tiny-Model"
        );
        let err = HfModelTokenizer::from_tokenizer_json(dir.path()).expect_err("no tokenizer.json");
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let err = HfModelTokenizer::from_file(Path::new("/nonexistent/m.gguf"))
            .expect_err("no such file");
        assert!(err.to_string().contains("/nonexistent/m.gguf"), "{err}");
    }
}

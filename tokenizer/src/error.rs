//! Errors of building a tokenizer and rendering chat templates.

use crate::gguf::GgufError;

/// Why a tokenizer could not be built from a model file, or a chat not rendered.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The GGUF file could not be read, or a tokenizer key is missing or mistyped.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `tokenizer.ggml.model` names a tokenizer other than byte-level BPE ("gpt2").
    #[error("unsupported tokenizer model {0:?} (only \"gpt2\" byte-level BPE is implemented)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not build.
    #[error("unsupported pre-tokenizer {0:?}")]
    UnsupportedPreTokenizer(String),
    /// The vocabulary is inconsistent (lengths differ, an id or a token type is out of range).
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    /// A `tokenizer.json` or its `tokenizer_config.json` could not be read or parsed.
    #[error("{path}: {message}")]
    TokenizerJson {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The tokenizer failed on an input (only a model whose unknown token is missing from its
    /// vocabulary does).
    #[error("tokenizing failed: {0}")]
    Encode(String),
    /// The chat template does not parse, or failed while rendering (e.g. `raise_exception`).
    #[error("chat template")]
    ChatTemplate(#[source] minijinja::Error),
}

//! Tokenization for Dolphin's real models, read straight from their GGUF files.
//!
//! - [`gguf`]: a small, bounded GGUF header reader (metadata and tensor descriptions), and a
//!   writer for tests.
//! - [`GgufTokenizer`]: byte-level BPE built from `tokenizer.ggml.*` metadata whose ids match
//!   llama.cpp's (special tokens matched in the text, digits split one by one for
//!   `tokenizer.ggml.pre = "smollm"`, no leading space), decoding, and the model's chat template.
//! - [`StreamDecoder`]: incremental detokenization that only emits complete UTF-8.
//!
//! The BPE is written here rather than taken from the `tokenizers` crate: with `regex` (already
//! in the workspace) and `minijinja` it is a few hundred lines and two light dependencies, where
//! `tokenizers` brings rayon, onig or fancy-regex, serde derives and more into the router's build.
//! Equality with llama.cpp is checked against stored reference ids (`tests/vectors/`).

pub mod gguf;

mod bpe;
mod bytelevel;
mod chat;
mod decoder;
mod error;
mod locate;
mod pretokenize;
mod special;
mod tokenizer;
mod vocab;

pub use chat::{CHATML_TEMPLATE, ChatMessage, ChatTemplate};
pub use decoder::StreamDecoder;
pub use error::TokenizerError;
pub use locate::{MODEL_DIR_ENV, SMOLLM2_FILE, SMOLLM2_SHA256, find_model, model_dir};
pub use pretokenize::PreTokenizerKind;
pub use tokenizer::GgufTokenizer;
pub use vocab::{SpecialIds, TokenType};

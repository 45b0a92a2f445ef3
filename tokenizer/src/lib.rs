//! Tokenization for Dolphin's real models.
//!
//! - [`ModelTokenizer`]: Hugging Face `tokenizers`, built from a GGUF file's `tokenizer.ggml.*`
//!   metadata (byte-level BPE whose ids match llama.cpp's and the model's `tokenizer.json`:
//!   special tokens matched in the text, digits split one by one for `tokenizer.ggml.pre =
//!   "smollm"`, no leading space) or read from a `tokenizer.json` (any Hugging Face model), with
//!   the model's chat template.
//! - [`gguf`]: the tokenizer metadata of a GGUF file through candle's GGUF reader (the one the
//!   engine loads weights with), and a metadata-only writer for tests.
//!
//! Equality with llama.cpp is checked against stored reference ids (`tests/vectors/`).

pub mod gguf;

mod chat;
mod error;
mod hf;
mod json;
mod locate;
mod pieces;
mod tokenizer;
mod vocab;
mod words;

pub use chat::{
    CHATML_TEMPLATE, ChatExtras, ChatMessage, ChatTemplate, Ending, REQUEST_TEMPLATE_FUEL,
    RESERVED_NAMES, ToolCall,
};
pub use error::TokenizerError;
pub use hf::PreTokenizerKind;
pub use locate::{
    MODEL_DIR_ENV, REQUIRE_MODEL_ENV, SMOLLM2_FILE, SMOLLM2_SHA256, find_model, model_dir,
    model_or_skip,
};
pub use pieces::TokenPiece;
pub use tokenizer::ModelTokenizer;
pub use vocab::{SpecialIds, TokenType};

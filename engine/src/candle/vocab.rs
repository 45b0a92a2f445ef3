//! The model's vocabulary as structured output needs it: each token's bytes, read from the
//! tokenizer metadata of the model's own GGUF file.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use dolphin_grammar::{GrammarError, TokenSpace, TokenText};
use dolphin_tokenizer::{ModelTokenizer, TokenPiece};

use crate::types::EngineInfo;

/// The token space of the model at `path` (`info`: its vocabulary size and end of sequence),
/// from its `tokenizer` where the caller read it already, or why structured output is
/// unavailable for it. A model file without a tokenizer this project reads still serves free
/// text.
pub(super) fn token_space(
    path: &Path,
    tokenizer: Option<&Arc<ModelTokenizer>>,
    info: &EngineInfo,
) -> Result<Arc<TokenSpace>, GrammarError> {
    let started = Instant::now();
    let read;
    let tokenizer = match tokenizer {
        Some(t) => t.as_ref(),
        None => {
            read = ModelTokenizer::from_file(path)
                .map_err(|e| GrammarError::Unavailable(e.to_string()))?;
            &read
        }
    };
    let mut ends: Vec<u32> = info.eos_token_id.into_iter().collect();
    for &t in tokenizer.stop_token_ids() {
        if !ends.contains(&t) {
            ends.push(t);
        }
    }
    let space = token_space_of(tokenizer, info.vocab_size, &ends);
    match &space {
        Ok(_) => tracing::info!(
            vocab = info.vocab_size,
            ?ends,
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "structured output ready"
        ),
        Err(e) => tracing::warn!(error = %e, "structured output unavailable"),
    }
    space.map(Arc::new)
}

/// The token space of `tokenizer`'s vocabulary for a model of `vocab_size` logits, ended by
/// `ends`.
pub fn token_space_of(
    tokenizer: &ModelTokenizer,
    vocab_size: u32,
    ends: &[u32],
) -> Result<TokenSpace, GrammarError> {
    let texts = tokenizer
        .token_pieces()
        .map_err(|e| GrammarError::Unavailable(e.to_string()))?
        .into_iter()
        .map(|p| match p {
            TokenPiece::Text(bytes) => TokenText::Bytes(bytes),
            TokenPiece::Control(name) => TokenText::Special(name),
            TokenPiece::Nothing => TokenText::Nothing,
        })
        .collect();
    TokenSpace::new(texts, vocab_size, ends)
}

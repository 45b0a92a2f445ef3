//! Each token's bytes, as a constrained draw needs them (`dolphin-grammar`): a byte-level
//! token's raw bytes rather than its printable alphabet, a SentencePiece token's text with `▁`
//! as a space and `<0x0A>` as its byte.

use crate::error::TokenizerError;
use crate::tokenizer::ModelTokenizer;
use crate::vocab::TokenType;
use crate::words::ByteChars;

/// What one token writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenPiece {
    /// These bytes.
    Text(Vec<u8>),
    /// A control token (`<|im_end|>`), by name: it writes no text.
    Control(String),
    /// Nothing (the unknown token, an unused id).
    Nothing,
}

/// How a vocabulary spells bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-level alphabet: one printable character per byte.
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xNN>` byte tokens.
    Metaspace,
}

impl ModelTokenizer {
    /// Every token's piece, by id. A tokenizer whose decoder spells tokens in neither GPT-2's
    /// byte-level alphabet nor SentencePiece's is refused.
    pub fn token_pieces(&self) -> Result<Vec<TokenPiece>, TokenizerError> {
        let spelling = self.spelling()?;
        let chars = ByteChars::new();
        let mut byte_of = std::collections::HashMap::with_capacity(256);
        for b in 0..=255u8 {
            byte_of.insert(chars.of(b), b);
        }
        let n = self.vocab_size();
        let mut pieces = Vec::with_capacity(n as usize);
        for id in 0..n {
            let Some(token) = self.id_to_token(id) else {
                pieces.push(TokenPiece::Nothing);
                continue;
            };
            let piece = match self.token_type(id).unwrap_or(TokenType::Normal) {
                TokenType::Control => TokenPiece::Control(token),
                TokenType::Unknown | TokenType::Unused => TokenPiece::Nothing,
                // Added tokens are stored as the text they write.
                TokenType::UserDefined => TokenPiece::Text(token.into_bytes()),
                TokenType::Byte => match byte_token(&token) {
                    Some(b) => TokenPiece::Text(vec![b]),
                    None => TokenPiece::Nothing,
                },
                TokenType::Normal | TokenType::Undefined => match spelling {
                    Spelling::ByteLevel => {
                        let bytes: Option<Vec<u8>> =
                            token.chars().map(|c| byte_of.get(&c).copied()).collect();
                        bytes.map_or(TokenPiece::Nothing, TokenPiece::Text)
                    }
                    Spelling::Metaspace => match byte_token(&token) {
                        Some(b) => TokenPiece::Text(vec![b]),
                        None => TokenPiece::Text(token.replace('\u{2581}', " ").into_bytes()),
                    },
                },
            };
            pieces.push(piece);
        }
        Ok(pieces)
    }

    /// The vocabulary's spelling: byte-level for GGUF files (only "gpt2" is built), from the
    /// decoder for a `tokenizer.json`.
    fn spelling(&self) -> Result<Spelling, TokenizerError> {
        if self.source() != "tokenizer.json" {
            return Ok(Spelling::ByteLevel);
        }
        let decoder = self
            .hf()
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .unwrap_or_default();
        if decoder.contains("\"ByteLevel\"") {
            Ok(Spelling::ByteLevel)
        } else if decoder.contains("\"ByteFallback\"") || decoder.contains("\"Metaspace\"") {
            Ok(Spelling::Metaspace)
        } else {
            Err(TokenizerError::UnsupportedModel(format!(
                "a decoder that spells tokens neither byte-level nor SentencePiece: {decoder}"
            )))
        }
    }
}

/// The byte of a `<0xNN>` token.
fn byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_read_their_byte() {
        assert_eq!(byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_token("<0xff>"), Some(0xff));
        assert_eq!(byte_token("<0x0A"), None);
        assert_eq!(byte_token("<0x0AB>"), None);
    }

    #[test]
    fn smollm2_pieces_are_the_bytes_its_tokens_decode_to() {
        let Some(path) = crate::model_or_skip(crate::SMOLLM2_FILE) else {
            return;
        };
        let tok = ModelTokenizer::from_file(path).unwrap();
        let pieces = tok.token_pieces().unwrap();
        assert_eq!(pieces.len(), tok.vocab_size() as usize);
        let text = "Hello, wörld! 日本 {\"a\": 12}\n";
        let ids = tok.encode(text).unwrap();
        let mut bytes = Vec::new();
        for id in &ids {
            match &pieces[*id as usize] {
                TokenPiece::Text(b) => bytes.extend_from_slice(b),
                other => panic!("{id}: {other:?}"),
            }
        }
        assert_eq!(String::from_utf8(bytes).unwrap(), text);
        let im_end = tok.token_to_id("<|im_end|>").unwrap();
        assert_eq!(
            pieces[im_end as usize],
            TokenPiece::Control("<|im_end|>".into())
        );
    }
}

//! The whole pipeline on a tiny vocabulary written as a GGUF file by the test.

use proptest::prelude::*;

use super::*;
use crate::bytelevel::ByteLevel;
use crate::decoder::StreamDecoder;
use crate::gguf::{Array, GgufWriter, Limits, Value};

const SPECIALS: [(&str, i32); 4] = [
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<tool>", 4),
];
const MERGES: [&str; 9] = [
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
];

/// Specials at 0..4, the 256 byte characters at 4..260, then one token per merge.
fn tiny(
    edit: impl FnOnce(&mut Vec<String>, &mut Vec<i32>, &mut GgufWriter),
) -> Result<GgufTokenizer, TokenizerError> {
    let bl = ByteLevel::new();
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.0.to_string()).collect();
    let mut types: Vec<i32> = SPECIALS.iter().map(|s| s.1).collect();
    for b in 0..=255u8 {
        tokens.push(bl.char_of(b).to_string());
        types.push(1);
    }
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let mut w = GgufWriter::new();
    w.add(keys::MODEL, Value::String("gpt2".into()))
        .add(keys::PRE, Value::String("smollm".into()))
        .add(
            keys::MERGES,
            Value::Array(Array::String(
                MERGES.iter().map(|m| m.to_string()).collect(),
            )),
        )
        .add(keys::BOS, Value::U32(1))
        .add(keys::EOS, Value::U32(2))
        .add(keys::UNK, Value::U32(0));
    edit(&mut tokens, &mut types, &mut w);
    w.add(keys::TOKENS, Value::Array(Array::String(tokens)))
        .add(keys::TOKEN_TYPE, Value::Array(Array::I32(types)));
    let bytes = w.to_bytes();
    let g = GgufFile::read(
        std::io::Cursor::new(&bytes),
        Some(bytes.len() as u64),
        Limits::default(),
    )?;
    GgufTokenizer::from_gguf(&g)
}

fn tok() -> GgufTokenizer {
    tiny(|_, _, _| {}).unwrap()
}

fn id(t: &GgufTokenizer, s: &str) -> u32 {
    t.token_to_id(s)
        .unwrap_or_else(|| panic!("{s:?} not in vocab"))
}

#[test]
fn merges_words_and_keeps_bytes() {
    let t = tok();
    assert_eq!(t.encode("hello world"), [id(&t, "hello"), id(&t, "Ġworld")]);
    assert_eq!(t.encode("hex"), [id(&t, "he"), id(&t, "x")]);
    // Digits one by one; the space before them stays alone.
    assert_eq!(
        t.encode("a 12"),
        [id(&t, "a"), id(&t, "Ġ"), id(&t, "1"), id(&t, "2")]
    );
    let e_acute = t.encode("é");
    assert_eq!(e_acute, [id(&t, "Ã"), id(&t, "©")]);
    assert_eq!(t.encode(""), Vec::<u32>::new());
}

#[test]
fn bytes_the_vocabulary_lacks_are_dropped_like_llama_cpp() {
    let t = tiny(|tokens, _, _| tokens[4 + 4] = "unused-byte-4".into()).unwrap();
    assert_eq!(t.encode("a\u{4}b"), [id(&t, "a"), id(&t, "b")]);
    assert_eq!(t.encode("\u{4}"), Vec::<u32>::new());
}

#[test]
fn special_tokens_are_matched_in_text() {
    let t = tok();
    let ids = t.encode("<|im_start|>user\nhello<|im_end|>");
    let mut want = vec![1];
    want.extend(t.encode("user\n"));
    want.extend([id(&t, "hello"), 2]);
    assert_eq!(ids, want);
    // Not parsed: the control token is plain text, the user-defined one still matches.
    let plain = t.encode_with("<|im_start|><tool>", false);
    assert!(!plain.contains(&1));
    assert_eq!(plain.last(), Some(&3));
    assert_eq!(t.decode(&plain), "<|im_start|><tool>");
}

#[test]
fn decode_skips_control_tokens_unless_asked() {
    let t = tok();
    let ids = t.encode("<|im_start|>hello<tool><|im_end|>");
    assert_eq!(t.decode(&ids), "hello<tool>");
    assert_eq!(
        t.decode_with(&ids, false),
        "<|im_start|>hello<tool><|im_end|>"
    );
    assert_eq!(t.decode(&[id(&t, "hello"), 99_999]), "hello\u{FFFD}");
    // A lone continuation byte is not UTF-8.
    assert_eq!(t.decode(&[id(&t, "©")]), "\u{FFFD}");
}

#[test]
fn metadata_accessors() {
    fn shareable<T: Send + Sync + std::fmt::Debug>(_: &T) {}
    let t = tok();
    shareable(&t);
    let dbg = format!("{t:?}");
    assert!(dbg.contains("vocab_size: 269") && dbg.len() < 300, "{dbg}");
    assert_eq!(t.vocab_size(), 4 + 256 + 9);
    assert_eq!(t.eos(), Some(2));
    assert_eq!(t.stop_token_ids(), [2, 0]);
    assert_eq!(t.special_ids().bos, Some(1));
    assert!(!t.add_bos());
    assert_eq!(t.pre_tokenizer(), "smollm");
    assert_eq!(t.merge_count(), 9);
    assert_eq!(t.token_type(0), Some(TokenType::Control));
    assert_eq!(t.token_type(3), Some(TokenType::UserDefined));
    assert_eq!(t.id_to_token(4 + 32), Some("Ġ"));
}

#[test]
fn chat_template_from_the_file_or_chatml() {
    let t = tok();
    let msgs = [ChatMessage::new("user", "hi")];
    assert_eq!(
        t.render_chat(&msgs).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let t = tiny(|_, _, w| {
        w.add(
            keys::CHAT_TEMPLATE,
            Value::String("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into()),
        );
    })
    .unwrap();
    assert_eq!(
        t.render_chat_with(&msgs, false).unwrap(),
        "<|im_start|>hi<|im_end|>"
    );
}

#[test]
fn stream_decoder_emits_whole_characters() {
    let t = tok();
    let ids = t.encode("a🐬");
    assert_eq!(ids.len(), 5);
    let mut d = StreamDecoder::new();
    assert_eq!(d.push(&t, &ids[..2]), "a");
    assert_eq!(d.push(&t, &ids[2..4]), "");
    assert_eq!(d.push(&t, &ids[4..]), "🐬");
    let mut d = StreamDecoder::keeping_special();
    assert_eq!(d.push(&t, &[2]), "<|im_end|>");
    assert_eq!(StreamDecoder::new().push(&t, &[2]), "");
}

#[test]
fn inconsistent_vocabularies_are_rejected() {
    // One token fewer than token types.
    let short = tiny(|tokens, _, _| {
        tokens.pop();
    });
    assert!(matches!(short, Err(TokenizerError::InvalidVocab(_))));
    // A token type outside llama.cpp's numbering.
    let bad_type = tiny(|_, types, _| types[0] = 9);
    assert!(matches!(bad_type, Err(TokenizerError::InvalidVocab(_))));
}

/// Builds a tokenizer from metadata written without the defaults of `tiny`.
fn with_keys(model: &str, pre: &str, eos: u32) -> Result<GgufTokenizer, TokenizerError> {
    let bl = ByteLevel::new();
    let tokens: Vec<String> = (0..=255u8).map(|b| bl.char_of(b).to_string()).collect();
    let mut w = GgufWriter::new();
    w.add(keys::MODEL, Value::String(model.into()))
        .add(keys::PRE, Value::String(pre.into()))
        .add(keys::TOKENS, Value::Array(Array::String(tokens)))
        .add(keys::MERGES, Value::Array(Array::String(vec![])))
        .add(keys::EOS, Value::U32(eos));
    let bytes = w.to_bytes();
    GgufTokenizer::from_gguf(&GgufFile::read(
        std::io::Cursor::new(&bytes),
        None,
        Limits::default(),
    )?)
}

#[test]
fn unsupported_models_and_bad_ids_are_typed_errors() {
    assert!(with_keys("gpt2", "gpt-2", 5).is_ok());
    assert!(
        matches!(with_keys("llama", "gpt-2", 5), Err(TokenizerError::UnsupportedModel(m)) if m == "llama")
    );
    assert!(matches!(
        with_keys("gpt2", "llama-bpe", 5),
        Err(TokenizerError::UnsupportedPreTokenizer(p)) if p == "llama-bpe"
    ));
    assert!(matches!(
        with_keys("gpt2", "gpt-2", 256),
        Err(TokenizerError::InvalidVocab(_))
    ));
    // No types array: every token is normal.
    let t = with_keys("gpt2", "gpt-2", 5).unwrap();
    assert_eq!(t.token_type(0), Some(TokenType::Normal));
    assert_eq!(t.encode("ab 12"), t.encode_with("ab 12", false));
}

proptest! {
    #[test]
    fn decode_inverts_encode(s in "\\PC{0,40}|[<|>a-z_ \n]{0,40}") {
        let t = tok();
        prop_assert_eq!(t.decode(&t.encode_with(&s, false)), s.clone());
        prop_assert_eq!(t.decode_with(&t.encode(&s), false), s);
    }
}

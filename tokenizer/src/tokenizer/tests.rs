//! The whole pipeline on a tiny vocabulary written as a GGUF file by the test.

use proptest::prelude::*;

use super::*;
use crate::gguf::{GgufMetadata, Value, write_metadata};

/// GGUF metadata under construction (later keys win, as in candle's reader).
#[derive(Default)]
struct Meta(Vec<(&'static str, Value)>);

impl Meta {
    fn add(&mut self, key: &'static str, value: Value) -> &mut Self {
        self.0.push((key, value));
        self
    }

    fn read(&self) -> Result<GgufMetadata, crate::gguf::GgufError> {
        let bytes = write_metadata(&self.0)?;
        GgufMetadata::read(&mut std::io::Cursor::new(bytes))
    }
}

fn strings(items: impl IntoIterator<Item = String>) -> Value {
    Value::Array(items.into_iter().map(Value::String).collect())
}

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
    edit: impl FnOnce(&mut Vec<String>, &mut Vec<i32>, &mut Meta),
) -> Result<ModelTokenizer, TokenizerError> {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.0.to_string()).collect();
    let mut types: Vec<i32> = SPECIALS.iter().map(|s| s.1).collect();
    let alphabet = crate::words::ByteChars::new();
    for b in 0..=255u8 {
        tokens.push(alphabet.of(b).to_string());
        types.push(1);
    }
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let mut w = Meta::default();
    w.add(keys::MODEL, Value::String("gpt2".into()))
        .add(keys::PRE, Value::String("smollm".into()))
        .add(keys::MERGES, strings(MERGES.iter().map(|m| m.to_string())))
        .add(keys::BOS, Value::U32(1))
        .add(keys::EOS, Value::U32(2))
        .add(keys::UNK, Value::U32(0));
    edit(&mut tokens, &mut types, &mut w);
    w.add(keys::TOKENS, strings(tokens)).add(
        keys::TOKEN_TYPE,
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    ModelTokenizer::from_gguf(&w.read()?)
}

fn tok() -> ModelTokenizer {
    tiny(|_, _, _| {}).unwrap()
}

fn enc(t: &ModelTokenizer, text: &str) -> Vec<u32> {
    t.encode(text).expect("encodes")
}

fn id(t: &ModelTokenizer, s: &str) -> u32 {
    t.token_to_id(s)
        .unwrap_or_else(|| panic!("{s:?} not in vocab"))
}

#[test]
fn merges_words_and_keeps_bytes() {
    let t = tok();
    assert_eq!(enc(&t, "hello world"), [id(&t, "hello"), id(&t, "Ġworld")]);
    assert_eq!(enc(&t, "hex"), [id(&t, "he"), id(&t, "x")]);
    // Digits one by one; the space before them stays alone.
    assert_eq!(
        enc(&t, "a 12"),
        [id(&t, "a"), id(&t, "Ġ"), id(&t, "1"), id(&t, "2")]
    );
    let e_acute = enc(&t, "é");
    assert_eq!(e_acute, [id(&t, "Ã"), id(&t, "©")]);
    assert_eq!(enc(&t, ""), Vec::<u32>::new());
}

#[test]
fn bytes_the_vocabulary_lacks_are_dropped_like_llama_cpp() {
    let t = tiny(|tokens, _, _| tokens[4 + 4] = "unused-byte-4".into()).unwrap();
    assert_eq!(enc(&t, "a\u{4}b"), [id(&t, "a"), id(&t, "b")]);
    assert_eq!(enc(&t, "\u{4}"), Vec::<u32>::new());
}

#[test]
fn special_tokens_are_matched_in_text() {
    let t = tok();
    let ids = enc(&t, "<|im_start|>user\nhello<|im_end|>");
    let mut want = vec![1];
    want.extend(enc(&t, "user\n"));
    want.extend([id(&t, "hello"), 2]);
    assert_eq!(ids, want);
    // Not parsed: the control token is plain text, the user-defined one still matches.
    let plain = t.encode_with("<|im_start|><tool>", false).unwrap();
    assert!(!plain.contains(&1));
    assert_eq!(plain.last(), Some(&3));
    assert_eq!(t.decode(&plain), "<|im_start|><tool>");
}

#[test]
fn decode_skips_control_tokens_unless_asked() {
    let t = tok();
    let ids = enc(&t, "<|im_start|>hello<tool><|im_end|>");
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
    assert_eq!(t.source(), "smollm");
    assert_eq!(t.merge_count(), 9);
    assert_eq!(t.token_type(0), Some(TokenType::Control));
    assert_eq!(t.token_type(3), Some(TokenType::UserDefined));
    assert_eq!(t.id_to_token(4 + 32).as_deref(), Some("Ġ"));
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
fn stream_decoding_emits_whole_characters() {
    let t = tok();
    let ids = enc(&t, "a🐬");
    assert_eq!(ids.len(), 5);
    let mut d = t.hf().decode_stream(true);
    let mut out = Vec::new();
    for &id in &ids {
        out.push(d.step(id).expect("step"));
    }
    assert_eq!(out, [Some("a".into()), None, None, None, Some("🐬".into())]);
}

#[test]
fn a_saved_tokenizer_json_loads_with_its_config() {
    let t = tok();
    let dir = tempfile::tempdir().expect("dir");
    let json = dir.path().join("tokenizer.json");
    t.hf().save(&json, false).expect("save");
    // Without tokenizer_config.json: the same ids, ChatML, no special ids.
    let j = ModelTokenizer::from_tokenizer_json(&json).expect("load");
    // Its pre-tokenizer is the GGUF pipeline's, so it takes the same fast path.
    assert_eq!(
        t.fast_pre_tokenizer(),
        Some(PreTokenizerKind::Gpt2SplitDigits)
    );
    assert_eq!(j.fast_pre_tokenizer(), t.fast_pre_tokenizer());
    let text = "<|im_start|>hello world<tool> 42<|im_end|>";
    assert_eq!(enc(&j, text), enc(&t, text));
    assert_eq!(
        j.encode_with(text, false).unwrap(),
        t.encode_with(text, false).unwrap()
    );
    assert_eq!(j.vocab_size(), t.vocab_size());
    assert_eq!((j.eos(), j.source()), (None, "tokenizer.json"));
    assert_eq!(j.token_type(1), Some(TokenType::Control));
    assert_eq!(j.token_type(3), Some(TokenType::UserDefined));
    assert_eq!(j.decode(&enc(&j, text)), "hello world<tool> 42");
    // With one: special ids, BOS flag and the template from it.
    let config = serde_json::json!({
        "bos_token": {"content": "<|im_start|>", "special": true},
        "eos_token": "<|im_end|>",
        "add_bos_token": true,
        "chat_template": [{"name": "default", "template": "{{ eos_token }}{{ messages[0].content }}"}],
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("write");
    let j = ModelTokenizer::from_tokenizer_json(&json).expect("load");
    assert_eq!(
        (j.special_ids().bos, j.eos(), j.add_bos()),
        (Some(1), Some(2), true)
    );
    assert_eq!(j.stop_token_ids(), [2, 0]);
    let msgs = [ChatMessage::new("user", "hi")];
    assert_eq!(j.render_chat(&msgs).unwrap(), "<|im_end|>hi");
    // Another pre-tokenizer: tokenizers' whole pipeline.
    let mut other = t.hf().clone();
    other.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace));
    let other_json = dir.path().join("other.json");
    other.save(&other_json, false).expect("save");
    let o = ModelTokenizer::from_tokenizer_json(&other_json).expect("load");
    assert_eq!(o.fast_pre_tokenizer(), None);
    let want = other
        .encode(text, false)
        .expect("encodes")
        .get_ids()
        .to_vec();
    assert_eq!(enc(&o, text), want);
    // Broken files are errors that name the file.
    std::fs::write(dir.path().join("tokenizer_config.json"), "{").expect("write");
    let e = ModelTokenizer::from_tokenizer_json(&json).unwrap_err();
    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");
    std::fs::write(&json, "not json").expect("write");
    let e = ModelTokenizer::from_tokenizer_json(&json).unwrap_err();
    assert!(matches!(e, TokenizerError::TokenizerJson { .. }), "{e}");
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
fn with_keys(model: &str, pre: &str, eos: u32) -> Result<ModelTokenizer, TokenizerError> {
    let alphabet = crate::words::ByteChars::new();
    let tokens: Vec<String> = (0..=255u8).map(|b| alphabet.of(b).to_string()).collect();
    let mut w = Meta::default();
    w.add(keys::MODEL, Value::String(model.into()))
        .add(keys::PRE, Value::String(pre.into()))
        .add(keys::TOKENS, strings(tokens))
        .add(keys::MERGES, strings(Vec::new()))
        .add(keys::EOS, Value::U32(eos));
    ModelTokenizer::from_gguf(&w.read()?)
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
    assert_eq!(enc(&t, "ab 12"), t.encode_with("ab 12", false).unwrap());
}

proptest! {
    #[test]
    fn decode_inverts_encode(s in "\\PC{0,40}|[<|>a-z_ \n]{0,40}") {
        let t = tok();
        prop_assert_eq!(t.decode(&t.encode_with(&s, false).unwrap()), s.clone());
        prop_assert_eq!(t.decode_with(&enc(&t, &s), false), s);
    }
}

proptest! {
    #[test]
    fn the_fast_path_gives_the_ids_of_tokenizers_pipeline(
        lines in proptest::collection::vec("\\PC{0,12}|[ \t\r\n]{0,3}|<\\|im_end\\|>|<tool>|[0-9 ]{0,6}|hello|' ?world", 0..40),
        parse_special: bool,
    ) {
        let t = tok();
        let text = lines.join("\n");
        let hf = if parse_special { &t.hf } else { &t.hf_text };
        prop_assert_eq!(t.encode_with(&text, parse_special).unwrap(), ids_of(hf, &text).unwrap());
    }
}

#[test]
fn the_fast_path_gives_the_ids_of_tokenizers_encode() {
    let t = tok();
    for text in [
        "hello world",
        "<|im_start|>a 12\n\n b<tool>",
        "é  \n\tx",
        "",
    ] {
        let reference = t.hf().encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(enc(&t, text), reference, "{text:?}");
    }
    let long = "hello world 42\n".repeat(1000);
    let reference = t
        .hf()
        .encode(long.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(enc(&t, &long), reference);
}

//! Checks the tokenizer against reference ids produced by llama.cpp (and chat prompts rendered by
//! transformers) for SmolLM2-135M-Instruct: `tests/vectors/smollm2.json`, made by
//! `tests/vectors/make_vectors.py`.
//!
//! Needs the real model file (`scripts/fetch-model.sh`). Without it the tests print a notice and
//! pass, unless `DOLPHIN_REQUIRE_MODEL` is set (CI sets it after fetching the model), in which
//! case they fail.

use std::path::PathBuf;
use std::sync::OnceLock;

use dolphin_tokenizer::{ChatMessage, ModelTokenizer, SMOLLM2_FILE, model_or_skip};
use proptest::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
struct Vectors {
    model_bytes: u64,
    cases: Vec<Case>,
    chats: Vec<Chat>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    parse_special: bool,
    /// llama.cpp's ids.
    ids: Vec<u32>,
    /// Hugging Face's ids, where they differ from llama.cpp's.
    #[serde(default)]
    hf_ids: Option<Vec<u32>>,
    decoded: String,
}

#[derive(Deserialize)]
struct Chat {
    name: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    rendered: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

fn vectors() -> Vectors {
    let text = include_str!("vectors/smollm2.json");
    serde_json::from_str(text).expect("smollm2.json parses")
}

/// The real model's path, or `None` (after a notice) when it is absent and not required.
fn model() -> Option<PathBuf> {
    model_or_skip(SMOLLM2_FILE)
}

/// One tokenizer for all tests of this binary (loading takes a moment in debug builds).
fn tokenizer() -> Option<&'static ModelTokenizer> {
    static TOK: OnceLock<Option<ModelTokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = model()?;
        let len = std::fs::metadata(&path).expect("model metadata").len();
        assert_eq!(
            len,
            vectors().model_bytes,
            "{} is not the file the vectors were made from",
            path.display()
        );
        Some(ModelTokenizer::from_file(&path).expect("SmolLM2 tokenizer loads"))
    })
    .as_ref()
}

#[test]
fn metadata_matches_smollm2() {
    let Some(t) = tokenizer() else { return };
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.eos(), Some(2));
    assert_eq!(t.special_ids().bos, Some(1));
    assert_eq!(t.stop_token_ids(), [2, 0]);
    assert!(!t.add_bos());
    assert_eq!(t.source(), "smollm");
    assert_eq!(t.merge_count(), 48900);
    assert_eq!(t.id_to_token(1).as_deref(), Some("<|im_start|>"));
}

/// The ids the model should see: llama.cpp's, except where Hugging Face's differ. SmolLM2 was
/// trained on its `tokenizer.json` (Hugging Face `tokenizers`), so those are the right ones for
/// it. One case differs (`fuzz_193`): llama.cpp's GPT-2 splitter leaves a control character such
/// as U+0004 out of ` ?[^\s\p{L}\p{N}]+` (it has no Unicode flags there), so " \x04/>" becomes
/// "Ġ" + "\x04/>", where the regex itself, in `tokenizers` and in Python, keeps the space with
/// the symbols: one token.
fn model_ids(c: &Case) -> &[u32] {
    c.hf_ids.as_deref().unwrap_or(&c.ids)
}

#[test]
fn encode_matches_the_reference_on_every_vector() {
    let Some(t) = tokenizer() else { return };
    let v = vectors();
    let differing: Vec<&str> = v
        .cases
        .iter()
        .filter(|c| c.hf_ids.is_some())
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        differing,
        ["fuzz_193"],
        "cases where llama.cpp and tokenizers differ"
    );
    let mut failures = Vec::new();
    for c in &v.cases {
        let got = t.encode_with(&c.text, c.parse_special).expect("encodes");
        if got != model_ids(c) {
            failures.push(format!(
                "{}: text {:?}\n  got  {got:?}\n  want {:?}",
                c.name,
                c.text,
                model_ids(c)
            ));
        }
    }
    assert!(v.cases.len() > 300);
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        v.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn a_long_prompt_gives_tokenizers_own_ids() {
    let Some(t) = tokenizer() else { return };
    let v = vectors();
    // Every vector's text, one per line.
    let text: String = v.cases.iter().map(|c| format!("{}\n", c.text)).collect();
    assert!(text.len() > 16 * 1024, "{} bytes", text.len());
    let one_go = t.hf().encode(text.as_str(), false).expect("encodes");
    assert_eq!(t.encode(&text).expect("encodes"), one_go.get_ids());
}

#[test]
fn the_models_tokenizer_json_takes_the_same_fast_path() {
    let Some(t) = tokenizer() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let json = dir.path().join("tokenizer.json");
    t.hf().save(&json, false).expect("save");
    let j = ModelTokenizer::from_tokenizer_json(&json).expect("loads");
    assert_eq!(
        j.fast_pre_tokenizer(),
        Some(dolphin_tokenizer::PreTokenizerKind::Gpt2SplitDigits)
    );
    let text: String = vectors()
        .cases
        .iter()
        .map(|c| format!("{}\n", c.text))
        .collect();
    assert_eq!(
        j.encode(&text).expect("encodes"),
        t.encode(&text).expect("encodes")
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// The encoder's own word splitter against `tokenizers`' whole pipeline on the real
    /// vocabulary: arbitrary text, whitespace runs, digits, contractions and special tokens.
    #[test]
    fn arbitrary_text_gives_tokenizers_own_ids(
        parts in proptest::collection::vec(
            "\\PC{0,16}|\\p{Any}{0,6}|[ \t\n\u{a0}\u{3000}]{1,4}|[0-9\u{663}\u{ff11}]{1,4}|'(s|t|re|ll|d|S)|<\\|im_(start|end)\\|>|<\\|endoftext\\|>",
            0..24,
        ),
        parse_special: bool,
    ) {
        let Some(t) = tokenizer() else { return Ok(()) };
        let text = parts.concat();
        // `tokenizers` with special tokens encoded as text, made once.
        static AS_TEXT: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
        let hf = if parse_special {
            t.hf()
        } else {
            AS_TEXT.get_or_init(|| {
                let mut hf = t.hf().clone();
                hf.set_encode_special_tokens(true);
                hf
            })
        };
        let want = hf.encode(text.as_str(), false).expect("encodes");
        prop_assert_eq!(t.encode_with(&text, parse_special).expect("encodes"), want.get_ids());
    }
}

#[test]
fn decode_matches_llama_cpp_on_every_vector() {
    let Some(t) = tokenizer() else { return };
    for c in vectors().cases {
        assert_eq!(t.decode(&c.ids), c.decoded, "{}", c.name);
        // Streaming one token at a time gives the same text, but for an incomplete character
        // at the very end, which a stream holds back.
        let mut d = t.hf().decode_stream(true);
        let streamed: String = c
            .ids
            .iter()
            .filter_map(|&id| d.step(id).expect("step"))
            .collect();
        let rest = c.decoded.strip_prefix(&streamed);
        assert!(
            rest.is_some_and(|r| r.chars().all(|ch| ch == '\u{FFFD}')),
            "{} (streamed): {streamed:?}",
            c.name
        );
    }
}

#[test]
fn chat_template_matches_transformers_and_ids_match_llama_cpp() {
    let Some(t) = tokenizer() else { return };
    let chats = vectors().chats;
    assert!(!chats.is_empty());
    for c in chats {
        let msgs: Vec<ChatMessage> = c
            .messages
            .iter()
            .map(|m| ChatMessage::new(&m.role, &m.content))
            .collect();
        let rendered = t.render_chat_with(&msgs, c.add_generation_prompt).unwrap();
        assert_eq!(rendered, c.rendered, "{}", c.name);
        if c.add_generation_prompt {
            assert_eq!(t.render_chat(&msgs).unwrap(), c.rendered, "{}", c.name);
        }
        assert_eq!(t.encode(&rendered).expect("encodes"), c.ids, "{}", c.name);
    }
}

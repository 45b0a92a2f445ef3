//! Checks the tokenizer against reference ids produced by llama.cpp (and chat prompts rendered by
//! transformers) for SmolLM2-135M-Instruct: `tests/vectors/smollm2.json`, made by
//! `tests/vectors/make_vectors.py`.
//!
//! Needs the real model file (`scripts/fetch-model.sh`). Without it the tests print a notice and
//! pass, unless `DOLPHIN_REQUIRE_MODEL` is set (CI sets it after fetching the model), in which
//! case they fail.

use std::path::PathBuf;
use std::sync::OnceLock;

use dolphin_tokenizer::{
    ChatMessage, GgufTokenizer, SMOLLM2_FILE, StreamDecoder, find_model, model_dir,
};
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
    ids: Vec<u32>,
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
    let found = find_model(SMOLLM2_FILE);
    if found.is_none() {
        let dir = model_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let msg = format!(
            "{SMOLLM2_FILE} not found in {dir:?} (set DOLPHIN_MODEL_DIR or run scripts/fetch-model.sh)"
        );
        if std::env::var_os("DOLPHIN_REQUIRE_MODEL").is_some_and(|v| !v.is_empty()) {
            panic!("DOLPHIN_REQUIRE_MODEL is set but {msg}");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}

/// One tokenizer for all tests of this binary (loading takes a moment in debug builds).
fn tokenizer() -> Option<&'static GgufTokenizer> {
    static TOK: OnceLock<Option<GgufTokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = model()?;
        let len = std::fs::metadata(&path).expect("model metadata").len();
        assert_eq!(
            len,
            vectors().model_bytes,
            "{} is not the file the vectors were made from",
            path.display()
        );
        Some(GgufTokenizer::from_file(&path).expect("SmolLM2 tokenizer loads"))
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
    assert_eq!(t.pre_tokenizer(), "smollm");
    assert_eq!(t.merge_count(), 48900);
    assert_eq!(t.id_to_token(1), Some("<|im_start|>"));
}

#[test]
fn encode_matches_llama_cpp_on_every_vector() {
    let Some(t) = tokenizer() else { return };
    let v = vectors();
    let mut failures = Vec::new();
    for c in &v.cases {
        let got = t.encode_with(&c.text, c.parse_special);
        if got != c.ids {
            failures.push(format!(
                "{}: text {:?}\n  got  {got:?}\n  want {:?}",
                c.name, c.text, c.ids
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
fn decode_matches_llama_cpp_on_every_vector() {
    let Some(t) = tokenizer() else { return };
    for c in vectors().cases {
        assert_eq!(t.decode(&c.ids), c.decoded, "{}", c.name);
        // Streaming one token at a time gives the same text.
        let mut d = StreamDecoder::new();
        let mut streamed: String = c.ids.iter().map(|&id| d.push(t, &[id])).collect();
        streamed.push_str(&d.finish());
        assert_eq!(streamed, c.decoded, "{} (streamed)", c.name);
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
        assert_eq!(t.encode(&rendered), c.ids, "{}", c.name);
    }
}

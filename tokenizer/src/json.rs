//! The parts of a Hugging Face model directory's `tokenizer_config.json` a server needs: the
//! special tokens' texts, whether BOS is prepended, and the chat template.

use std::path::Path;

use serde_json::Value;

use crate::error::TokenizerError;

/// `tokenizer_config.json`, the fields read.
#[derive(Debug, Default)]
pub(crate) struct HfConfig {
    pub(crate) bos_token: Option<String>,
    pub(crate) eos_token: Option<String>,
    pub(crate) unk_token: Option<String>,
    pub(crate) pad_token: Option<String>,
    pub(crate) add_bos_token: bool,
    pub(crate) chat_template: Option<String>,
}

impl HfConfig {
    /// The `tokenizer_config.json` in the directory of `tokenizer_json`; empty when there is
    /// none.
    pub(crate) fn beside(tokenizer_json: &Path) -> Result<HfConfig, TokenizerError> {
        let path = tokenizer_json.with_file_name("tokenizer_config.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HfConfig::default()),
            Err(e) => {
                return Err(TokenizerError::TokenizerJson {
                    path,
                    message: e.to_string(),
                });
            }
        };
        Self::parse(&text).map_err(|message| TokenizerError::TokenizerJson { path, message })
    }

    pub(crate) fn parse(text: &str) -> Result<HfConfig, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        // A token is written as its text or as an AddedToken object with "content".
        let token = |key: &str| match &v[key] {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        };
        // One template, or a list of named ones of which "default" is the chat template.
        let chat_template = match &v["chat_template"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(str::to_owned),
            Value::Null => None,
            other => return Err(format!("chat_template is {other}, not a string or a list")),
        };
        Ok(HfConfig {
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
            unk_token: token("unk_token"),
            pad_token: token("pad_token"),
            add_bos_token: v["add_bos_token"].as_bool().unwrap_or(false),
            chat_template,
        })
    }
}

//! The formats a request may ask for, and their llguidance grammars.

use std::sync::OnceLock;

use llguidance::ParserFactory;
use llguidance::api::TopLevelGrammar;
use toktrie::ApproximateTokEnv;

use crate::error::GrammarError;

/// The whitespace JSON drawn under a format may have between two tokens: a run of up to 24
/// spaces or tabs, or one line break with up to 24 after it (an indentation of 6 levels of 4).
/// llguidance's default allows any run, and a small model can then spend its whole budget
/// on blank lines inside the JSON (SmolLM2-135M did so for a required tool call: 40 tokens of
/// newlines and spaces, then a cut-off array). vLLM's xgrammar backend offers the same kind of
/// bound (`disable-any-whitespace`); outlines allows a single space.
pub const JSON_WHITESPACE: &str = r"[\x20\x09]{1,24}|[\x20\x09]{0,2}\r?\n[\x20\x09]{0,24}";

/// The same bound as a Lark terminal's regular expression, optional whitespace around or
/// inside a grammar's own JSON-like text.
pub const LARK_WHITESPACE: &str = r"/[ \t\n]{0,24}/";

/// `schema` with [`JSON_WHITESPACE`] as llguidance's whitespace between its tokens, where the
/// schema is an object that does not set llguidance's JSON options itself (`x-guidance`).
pub fn bounded_whitespace(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

/// What a request's output must match, whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// A JSON value valid under this JSON Schema (the schema as JSON text).
    JsonSchema(String),
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// Text that this regular expression (Rust `regex` syntax) matches whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text in the language of this grammar, in llguidance's Lark dialect (rule `start`).
    Lark(String),
}

impl Format {
    /// The format's kind as the wire names it.
    pub fn field(&self) -> &'static str {
        match self {
            Format::JsonSchema(_) => "json_schema",
            Format::JsonObject => "json_object",
            Format::Regex(_) => "regex",
            Format::Choice(_) => "choice",
            Format::Lark(_) => "grammar",
        }
    }

    /// The format as an llguidance grammar; text that does not parse (a schema that is not
    /// JSON, an empty choice) is the client's error.
    pub(crate) fn grammar(&self) -> Result<TopLevelGrammar, GrammarError> {
        let invalid = |message: String| GrammarError::Invalid {
            field: self.field(),
            message,
        };
        Ok(match self {
            Format::JsonSchema(text) => {
                let schema: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| invalid(format!("the schema is not valid JSON: {e}")))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(invalid(format!(
                        "a JSON Schema is an object or a boolean, got {schema}"
                    )));
                }
                TopLevelGrammar::from_json_schema(bounded_whitespace(schema))
            }
            Format::JsonObject => TopLevelGrammar::from_json_schema(bounded_whitespace(
                serde_json::json!({"type": "object"}),
            )),
            Format::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Format::Choice(options) => {
                if options.is_empty() {
                    return Err(invalid("the choice lists no strings".into()));
                }
                if options.iter().any(String::is_empty) {
                    return Err(invalid("the choice lists an empty string".into()));
                }
                let alternatives: Vec<String> =
                    options.iter().map(|o| regex_syntax::escape(o)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
            }
            Format::Lark(text) => {
                if text.trim().is_empty() {
                    return Err(invalid("the grammar is empty".into()));
                }
                TopLevelGrammar::from_lark(text.clone())
            }
        })
    }

    /// Compiles the format against a byte-level vocabulary: every error a grammar can have
    /// regardless of the model's tokens (bad JSON, an unsupported schema keyword, a regular
    /// expression or a grammar that does not parse) comes out here, before any worker is
    /// called. Takes about as long as the format's compilation (microseconds for a regular
    /// expression, up to milliseconds for a large schema).
    pub fn check(&self) -> Result<(), GrammarError> {
        static BYTES: OnceLock<ParserFactory> = OnceLock::new();
        let factory = BYTES.get_or_init(|| {
            crate::space::quiet_factory(&ApproximateTokEnv::single_byte_env())
                .expect("a factory over single bytes builds")
        });
        let grammar = self.grammar()?;
        factory
            .create_parser(grammar)
            .map(drop)
            .map_err(|e| GrammarError::Invalid {
                field: self.field(),
                message: first_line(&e.to_string()),
            })
    }
}

/// llguidance's errors can carry the grammar after a first line that says what is wrong.
pub(crate) fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_formats_pass() {
        for f in [
            Format::JsonSchema(
                r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}"#
                    .into(),
            ),
            Format::JsonSchema("true".into()),
            Format::JsonObject,
            Format::Regex(r"\d{3}-[a-z]+".into()),
            Format::Choice(vec!["yes".into(), "no (maybe)".into(), "a|b".into()]),
            Format::Lark("start: \"a\" b\nb: /[0-9]+/".into()),
        ] {
            assert_eq!(f.check(), Ok(()), "{f:?}");
        }
    }

    #[test]
    fn bad_formats_are_the_clients_errors_naming_the_kind() {
        for (f, field, says) in [
            (
                Format::JsonSchema("{".into()),
                "json_schema",
                "not valid JSON",
            ),
            (
                Format::JsonSchema("3".into()),
                "json_schema",
                "object or a boolean",
            ),
            (
                Format::JsonSchema(r#"{"type":"nonsense"}"#.into()),
                "json_schema",
                "",
            ),
            (Format::Regex("(unclosed".into()), "regex", ""),
            (Format::Choice(vec![]), "choice", "no strings"),
            (Format::Lark("start: undefined_rule".into()), "grammar", ""),
            (Format::Lark("  ".into()), "grammar", "empty"),
        ] {
            match f.check() {
                Err(GrammarError::Invalid {
                    field: got,
                    message,
                }) => {
                    assert_eq!(got, field, "{f:?}");
                    assert!(message.contains(says), "{f:?}: {message}");
                    assert!(!message.contains('\n'), "one line: {message}");
                }
                other => panic!("{f:?}: {other:?}"),
            }
        }
    }
}

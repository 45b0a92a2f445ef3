//! Tool calling, as OpenAI serves it on `/v1/chat/completions` (gRPC chat requests are read the
//! same way): the request's `tools`, `tool_choice` and `parallel_tool_calls`; the format that
//! makes a forced call well formed (vLLM's way: the function's parameters for a named choice, a
//! JSON array of calls for `required`); and [`CallReader`], which reads the calls out of the
//! model's text, whole or as it streams.

use dolphin_grammar::{Format, LARK_WHITESPACE, bounded_whitespace};
use serde_json::{Value, json};

use crate::http::types::OtherFields;

/// How the router reads the calls a model chose to make (`tool_choice: "auto"`): the format
/// the model was trained to write them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call: Hermes 2
    /// Pro, Qwen2.5, Qwen3, SmolLM3 (vLLM's `hermes` parser).
    Hermes,
    /// An answer that is `{"name": ..., "parameters": {...}}`, several separated by `;`: Llama
    /// 3.1, 3.2 and 3.3's JSON tool calling (vLLM's `llama3_json`), or after
    /// `<|python_tag|>`, a control token written out for such answers.
    #[value(name = "llama3_json", alias = "llama3-json")]
    Llama3Json,
    /// Mistral's: an answer that is a JSON array of `{"name": ..., "arguments": {...}}`
    /// (Mistral 7B v0.3, Nemo, Small 3.0/3.1), or `name{...}` once per call (the v11 format
    /// of Mistral Small 3.2, Magistral, Devstral), or the same after the control token
    /// `[TOOL_CALLS]` (with `[ARGS]`, written out for such answers). Calls get Mistral's nine-character ids, which its chat
    /// templates require when the calls come back in the conversation (vLLM's `mistral`).
    Mistral,
    /// An answer that is a Python list of calls, `[get_weather(city="Paris"), get_time()]`:
    /// Llama 3.2 1B and 3B, Llama 4 (vLLM's `pythonic`; Llama 4's `<|python_start|>` is a
    /// control token, left out of the text).
    Pythonic,
}

/// Llama 3's control token before its calls.
const PYTHON_TAG: &str = "<|python_tag|>";
/// Mistral's control tokens: before its calls, before a call's arguments, before its id.
const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

impl ToolCallParser {
    /// The control tokens the parser reads, the one that marks where the calls begin first:
    /// the detokenizer writes them out in the answers of `"auto"` requests (detokenizing
    /// otherwise leaves special tokens out), so that calls a model makes after some text are
    /// found where they begin.
    pub fn control_tokens(self) -> &'static [&'static str] {
        match self {
            ToolCallParser::Llama3Json => &[PYTHON_TAG],
            ToolCallParser::Mistral => &[TOOL_CALLS, ARGS, CALL_ID],
            ToolCallParser::Hermes | ToolCallParser::Pythonic => &[],
        }
    }

    /// The control token that marks where the calls begin (`None`: the parser reads no marker).
    fn marker(self) -> Option<&'static str> {
        self.control_tokens().first().copied()
    }
}

/// The ids given to calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CallIds {
    /// OpenAI's: `call_` and 24 letters and digits.
    #[default]
    OpenAi,
    /// Nine letters and digits: Mistral's chat templates refuse a conversation whose calls have
    /// other ids (`raise_exception`), so every call gets one where the router reads Mistral's
    /// calls, forced calls included.
    Mistral,
}

impl CallIds {
    /// The ids that suit the models of the router's `--tool-call-parser`.
    pub(crate) fn for_parser(parser: Option<ToolCallParser>) -> CallIds {
        match parser {
            Some(ToolCallParser::Mistral) => CallIds::Mistral,
            Some(
                ToolCallParser::Hermes | ToolCallParser::Llama3Json | ToolCallParser::Pythonic,
            )
            | None => CallIds::OpenAi,
        }
    }

    /// A new id.
    fn make(self) -> String {
        const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        use rand::Rng;
        let (prefix, len) = match self {
            CallIds::OpenAi => ("call_", 24),
            CallIds::Mistral => ("", 9),
        };
        let mut id = String::with_capacity(prefix.len() + len);
        id.push_str(prefix);
        crate::selection::with_rng(|r| {
            for _ in 0..len {
                id.push(ALPHABET[r.random_range(0..ALPHABET.len())] as char);
            }
        });
        id
    }
}

/// The ids of the control tokens around calls in the model's vocabulary, where it has them: a
/// strict grammar names them as tokens (`<[id]>`), which no text can write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTokens {
    /// Mistral's `[TOOL_CALLS]`, before the calls.
    pub tool_calls: Option<u32>,
    /// Mistral's `[ARGS]`, before a call's arguments (the v11 format's vocabularies).
    pub args: Option<u32>,
    /// Mistral's `[CALL_ID]`, before a call's id.
    pub call_id: Option<u32>,
    /// Llama 4's `<|python_start|>` and `<|python_end|>` around a pythonic list of calls.
    pub python_start: Option<u32>,
    pub python_end: Option<u32>,
}

/// Llama 4's control tokens around its pythonic calls.
const PYTHON_START: &str = "<|python_start|>";
const PYTHON_END: &str = "<|python_end|>";

impl CallTokens {
    /// The tokens `token_id` finds (a tokenizer's lookup of a token's text).
    pub fn find(token_id: impl Fn(&str) -> Option<u32>) -> CallTokens {
        CallTokens {
            tool_calls: token_id(TOOL_CALLS),
            args: token_id(ARGS),
            call_id: token_id(CALL_ID),
            python_start: token_id(PYTHON_START),
            python_end: token_id(PYTHON_END),
        }
    }
}

/// Hermes' tags around one call.
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// What a request asks of tools.
#[derive(Clone, Debug, Default)]
pub struct ToolRequest {
    /// The tools as sent (a non-empty array), for the chat template.
    pub tools: Option<Value>,
    /// How the answer is read.
    pub mode: Mode,
}

/// How an answer is read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// As text (no tools, or `tool_choice: "none"`).
    #[default]
    Text,
    /// Text, or calls in the parser's format (`"auto"`); `parallel`: more than one call.
    Auto {
        /// The format of calls.
        parser: ToolCallParser,
        /// More than one call may be made.
        parallel: bool,
    },
    /// A JSON array of calls `{"name", "parameters"}`, at least one (`"required"`);
    /// `parallel`: more than one.
    Required {
        /// More than one call may be made.
        parallel: bool,
    },
    /// The arguments of this function, the one the model must call.
    Named(String),
}

type FieldError = (&'static str, String);

/// Takes `tools`, `tool_choice` and `parallel_tool_calls` out of the request's fields. The
/// tools must be functions with names OpenAI accepts (1 to 64 of `a-z A-Z 0-9 _ -`), each
/// once; a named choice must be one of them; `"auto"` (the default with tools) needs the
/// router's `--tool-call-parser`. Every refusal names its field.
pub fn take(
    other: &mut OtherFields,
    parser: Option<ToolCallParser>,
) -> Result<ToolRequest, FieldError> {
    let tools = other.take("tools");
    let choice = other.take("tool_choice");
    let parallel = match other.take("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => b,
        Some(v) => {
            return Err((
                "parallel_tool_calls",
                format!("parallel_tool_calls must be a boolean, got {v}"),
            ));
        }
    };
    let names = match &tools {
        None => Vec::new(),
        Some(tools) => function_names(tools)?,
    };
    let tools = tools.filter(|_| !names.is_empty());
    let mode = match choice {
        None if names.is_empty() => Mode::Text,
        None => auto(parser, parallel)?,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Mode::Text,
            "auto" if names.is_empty() => Mode::Text,
            "auto" => auto(parser, parallel)?,
            "required" if !names.is_empty() => Mode::Required { parallel },
            "required" => {
                return Err(("tool_choice", "tool_choice \"required\" needs tools".into()));
            }
            other => {
                return Err((
                    "tool_choice",
                    format!(
                        "tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {other:?}"
                    ),
                ));
            }
        },
        Some(v) => {
            let name = v["function"]["name"]
                .as_str()
                .filter(|_| v["type"] == "function");
            let Some(name) = name else {
                return Err((
                    "tool_choice",
                    format!(
                        "tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"
                    ),
                ));
            };
            if !names.iter().any(|n| n == name) {
                return Err((
                    "tool_choice",
                    format!("tool_choice names {name:?}, which is not one of the tools"),
                ));
            }
            Mode::Named(name.to_owned())
        }
    };
    Ok(ToolRequest { tools, mode })
}

/// `/v1/completions` calls no tools: a request there that names some, or a `tool_choice` other
/// than `"none"`, is refused (an empty list asks for nothing; `parallel_tool_calls` says
/// nothing without tools).
pub(crate) fn refuse_outside_chat(other: &mut OtherFields) -> Result<(), FieldError> {
    for name in ["tools", "tool_choice"] {
        let Some(v) = other.take(name) else {
            continue;
        };
        let asks = match name {
            "tools" => v.as_array().is_none_or(|a| !a.is_empty()),
            _ => v != "none",
        };
        if asks {
            return Err((
                name,
                format!("{name} is a chat completions field: /v1/completions calls no tools"),
            ));
        }
    }
    other.take("parallel_tool_calls");
    Ok(())
}

/// `"auto"`: calls are read only with a parser that knows the model's format.
fn auto(parser: Option<ToolCallParser>, parallel: bool) -> Result<Mode, FieldError> {
    match parser {
        Some(parser) => Ok(Mode::Auto { parser, parallel }),
        None => Err((
            "tool_choice",
            "tool_choice \"auto\" (the default with tools) needs a router started with --tool-call-parser; \"required\" or a named function work without one".into(),
        )),
    }
}

/// The functions' names, checked: each tool `{"type": "function", "function": {"name", ...}}`
/// with a valid name, used once, and parameters (where given) an object.
fn function_names(tools: &Value) -> Result<Vec<String>, FieldError> {
    const NAME: &str = "tools";
    let Some(list) = tools.as_array() else {
        return Err((NAME, format!("tools must be a list, got {tools}")));
    };
    let mut names: Vec<String> = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        if tool["type"] != "function" {
            return Err((
                NAME,
                format!("tools[{i}].type must be \"function\", got {}", tool["type"]),
            ));
        }
        let f = &tool["function"];
        let name = f["name"].as_str().unwrap_or_default();
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err((
                NAME,
                format!(
                    "tools[{i}].function.name must be 1 to 64 letters, digits, '_' or '-', got {}",
                    f["name"]
                ),
            ));
        }
        if !(f["parameters"].is_null() || f["parameters"].is_object()) {
            return Err((
                NAME,
                format!(
                    "tools[{i}].function.parameters must be a JSON Schema object, got {}",
                    f["parameters"]
                ),
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err((NAME, format!("tools name {name:?} twice")));
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

impl ToolRequest {
    /// Under `"auto"`, where a tool asks for `strict` (OpenAI's SDK sets it for pydantic
    /// tools): the format the answer is drawn under, free text or calls in the parser's format
    /// (Hermes, Llama 3 JSON, Mistral's and the pythonic, whose control tokens `tokens` names)
    /// whose arguments follow the tools (a strict tool's its parameters' schema, the others'
    /// any object), as vLLM's structural tags constrain them. The model still chooses whether
    /// to call; text that would open a call must be one.
    pub fn strict_format(&self, tokens: CallTokens) -> Option<Format> {
        let Mode::Auto { parser, parallel } = self.mode else {
            return None;
        };
        let tools = self.tools.as_ref()?.as_array()?;
        if !tools.iter().any(|t| t["function"]["strict"] == true) {
            return None;
        }
        let arguments = |f: &Value| match &f["parameters"] {
            p if f["strict"] == true && p.is_object() => p.clone(),
            _ => json!({"type": "object"}),
        };
        let grammar = match parser {
            ToolCallParser::Hermes => hermes_grammar(tools, &arguments, parallel),
            ToolCallParser::Llama3Json => llama3_grammar(tools, &arguments, parallel),
            ToolCallParser::Mistral => mistral_grammar(tools, &arguments, parallel, tokens),
            ToolCallParser::Pythonic => {
                crate::pythonic_grammar::grammar(tools, &arguments, parallel, tokens)
            }
        };
        Some(Format::Lark(grammar))
    }

    /// The format a forced call is drawn under: the named function's parameters, or for
    /// `"required"` a JSON array of `{"name", "parameters"}` objects, each one of the tools
    /// with its parameters (one call at most without `parallel_tool_calls`). `None` where the
    /// model writes freely.
    pub fn format(&self) -> Option<Format> {
        let tools = self.tools.as_ref()?.as_array()?;
        let params = |f: &Value| match &f["parameters"] {
            Value::Null => json!({"type": "object"}),
            p => p.clone(),
        };
        match &self.mode {
            Mode::Text | Mode::Auto { .. } => None,
            Mode::Named(name) => {
                let f = tools
                    .iter()
                    .map(|t| &t["function"])
                    .find(|f| f["name"] == name.as_str())?;
                Some(Format::JsonSchema(params(f).to_string()))
            }
            Mode::Required { parallel } => {
                let calls = call_schemas(tools, "parameters", params);
                let mut schema = json!({
                    "type": "array",
                    "minItems": 1,
                    "items": {"anyOf": calls},
                });
                if !parallel {
                    schema["maxItems"] = json!(1);
                }
                Some(Format::JsonSchema(schema.to_string()))
            }
        }
    }
}

/// A call's JSON between optional whitespace: `{"name", key: arguments}`, one of the tools.
fn json_call_rule(tools: &[Value], key: &str, arguments: &dyn Fn(&Value) -> Value) -> String {
    let calls = call_schemas(tools, key, arguments);
    format!(
        "call: {LARK_WHITESPACE} %json {} {LARK_WHITESPACE}",
        bounded_whitespace(json!({"anyOf": calls}))
    )
}

/// The grammar of a Hermes answer under strict tools: text up to each call's opening tag
/// (lazily: the first tag ends it), the call, and text that opens none after the last.
fn hermes_grammar(tools: &[Value], arguments: &dyn Fn(&Value) -> Value, parallel: bool) -> String {
    format!(
        "start: (pre call_block){} POST\n\
         pre[lazy]: /(.|\\n)*{CALL_OPEN}/\n\
         call_block: call \"{CALL_CLOSE}\"\n\
         {}\n\
         POST: /(.|\\n)*/ & ~/(.|\\n)*{CALL_OPEN}(.|\\n)*/\n",
        if parallel { "*" } else { "?" },
        json_call_rule(tools, "arguments", arguments),
    )
}

/// The grammar of a Llama 3 JSON answer under strict tools: text that does not start with
/// `{`, or calls separated by `;`.
fn llama3_grammar(tools: &[Value], arguments: &dyn Fn(&Value) -> Value, parallel: bool) -> String {
    format!(
        "start: TEXT | calls\n\
         calls: call{}\n\
         {}\n\
         TEXT: /(.|\\n)*/ & ~/[ \\t\\n]*\\{{(.|\\n)*/\n",
        if parallel { " (\";\" call)*" } else { "" },
        json_call_rule(tools, "parameters", arguments),
    )
}

/// The grammar of a Mistral answer under strict tools: text (which cannot start as calls in
/// any form the parser reads: a JSON array, or a function's name and `{`), then, where the
/// vocabulary has `[TOOL_CALLS]`, calls after it; or an answer that is a JSON array of calls.
/// The calls after the token are the v11 format's, `name[ARGS]{...}` each after its own
/// `[TOOL_CALLS]` (optionally `[CALL_ID]` and an id before `[ARGS]`), where the vocabulary
/// has `[ARGS]`; else the earlier one's JSON array.
fn mistral_grammar(
    tools: &[Value],
    arguments: &dyn Fn(&Value) -> Value,
    parallel: bool,
    mistral: CallTokens,
) -> String {
    let token = |id: u32| format!("<[{id}]>");
    let names: Vec<&str> = tools
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    let calls = call_schemas(tools, "arguments", arguments);
    let ws = LARK_WHITESPACE;
    // Calls after text are found by the token before them: only where it exists.
    let after = if mistral.tool_calls.is_some() {
        " after?"
    } else {
        ""
    };
    let rest = if parallel {
        format!(r#"({ws} "," {ws} call)*"#)
    } else {
        String::new()
    };
    let mut g = format!(
        "start: TEXT{after} | array\n\
         array: {ws} \"[\" {ws} call {rest} {ws} \"]\" {ws}\n\
         call: %json {}\n\
         TEXT: /(.|\\n)*/ & ~/[ \\t\\n]*(\\[|({})[ \\t\\n]*\\{{)(.|\\n)*/\n",
        bounded_whitespace(json!({"anyOf": calls})),
        names.join("|"),
    );
    match (mistral.tool_calls, mistral.args) {
        (None, _) => {}
        (Some(tc), None) => g.push_str(&format!("after: {} array\n", token(tc))),
        (Some(tc), Some(args)) => {
            let id = mistral
                .call_id
                .map(|c| format!("({} /[a-zA-Z0-9]{{1,64}}/)? ", token(c)))
                .unwrap_or_default();
            let named: Vec<String> = tools
                .iter()
                .map(|t| {
                    let f = &t["function"];
                    let name = json!(f["name"]);
                    format!(
                        "{name} {id}{} %json {}",
                        token(args),
                        bounded_whitespace(arguments(f))
                    )
                })
                .collect();
            let one = format!("{} named", token(tc));
            let calls = if parallel {
                format!("{one} ({one})*")
            } else {
                one
            };
            g.push_str(&format!("after: {calls}\nnamed: {}\n", named.join(" | ")));
        }
    }
    g
}

/// Draws an answer under `strict` ([`ToolRequest::strict_format`]) unless the request's own
/// format constrains it already (which wins) or it may not end (`ignore_eos`); whether it
/// does. One rule for HTTP and gRPC.
pub fn draw_strict(
    strict: Option<Format>,
    sampling: &mut dolphin_proto::v1::SamplingParams,
) -> bool {
    match strict {
        Some(format) if sampling.structured.is_none() && !sampling.ignore_eos => {
            sampling.structured = Some(Box::new(format.to_wire()));
            true
        }
        _ => false,
    }
}

/// For each tool, the schema of a call of it as one JSON object: its `name`, and its arguments
/// under `key` following `arguments(function)`.
fn call_schemas(tools: &[Value], key: &str, arguments: impl Fn(&Value) -> Value) -> Vec<Value> {
    tools
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [f["name"]]},
                    key: arguments(f),
                },
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect()
}

/// A piece of an answer read by [`CallReader`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Text of the answer.
    Text(String),
    /// Call `index` begins: its id and function.
    Call {
        /// Which call of the answer (0, 1, ...).
        index: u32,
        /// Its id.
        id: String,
        /// The function.
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    Arguments {
        /// Which call.
        index: u32,
        /// The text.
        text: String,
    },
}

/// Reads one answer's text as it streams and turns it into [`Piece`]s: text as it comes for a
/// plain answer; a named call's arguments as they come; `"required"`'s calls as their names
/// and arguments come ([`crate::required_calls`]); and in `"auto"` text until a call's opening
/// tag or control token (holding back what may be the start of one), then Hermes' calls each
/// when its closing tag arrives and the others at the end. Text the format cannot read (a
/// cut-off call, a block that is not a call) comes out as text, so nothing the model wrote is
/// lost.
#[derive(Debug)]
pub(crate) struct CallReader {
    mode: Mode,
    /// Text not yet given out (`"auto"`): a call being read or what may begin one.
    held: String,
    /// Whitespace after the text given out, given out only if text follows (whitespace
    /// before a call is not part of the answer's text).
    space: String,
    /// A call was the last thing given out: the whitespace after it is dropped.
    after_call: bool,
    /// Inside a call's tags (`"auto"`).
    in_call: bool,
    /// Calls begun.
    calls: u32,
    /// The named call's id went out.
    started: bool,
    /// Llama 3 JSON and Mistral: whether the answer may be calls (Llama: it starts with
    /// `{`; Mistral: with `[`, or a name and `{`), once that is known.
    json_answer: Option<bool>,
    /// The ids given to calls.
    ids: CallIds,
    /// `"required"`'s array, read as it streams.
    required: crate::required_calls::RequiredCalls,
}

impl CallReader {
    /// A reader for answers of `mode`, giving calls `ids`.
    pub(crate) fn new(mode: Mode, ids: CallIds) -> CallReader {
        CallReader {
            mode,
            held: String::new(),
            space: String::new(),
            after_call: false,
            in_call: false,
            calls: 0,
            started: false,
            json_answer: None,
            ids,
            required: Default::default(),
        }
    }

    /// Calls begun so far.
    #[cfg(test)]
    pub(crate) fn calls(&self) -> u32 {
        self.calls
    }

    /// Whether the answer ends as calls: the model chose (or was required) to call, and did. A
    /// named call ends as the text would have, as OpenAI answers it.
    pub(crate) fn ends_in_calls(&self) -> bool {
        matches!(self.mode, Mode::Auto { .. } | Mode::Required { .. }) && self.calls > 0
    }

    /// Whether the answer made any call, named ones included.
    pub(crate) fn made_calls(&self) -> bool {
        self.calls > 0
    }

    /// The finish reason OpenAI gives: `"tool_calls"` where the answer
    /// [ends in calls](Self::ends_in_calls), else the text's.
    pub(crate) fn finish_reason(&self, text_reason: &'static str) -> &'static str {
        if self.ends_in_calls() {
            "tool_calls"
        } else {
            text_reason
        }
    }

    /// Reads `text`, the answer's next part.
    pub(crate) fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        match &self.mode {
            Mode::Text => out.push(Piece::Text(text.to_owned())),
            Mode::Named(_) => {
                self.start_named(out);
                out.push(Piece::Arguments {
                    index: 0,
                    text: text.to_owned(),
                });
            }
            Mode::Required { .. } => {
                use crate::required_calls::Progress;
                let mut progress = Vec::new();
                self.required.push(text, &mut progress);
                for p in progress {
                    out.push(match p {
                        Progress::Begins { index, name } => Piece::Call {
                            index,
                            id: self.ids.make(),
                            name,
                        },
                        Progress::Arguments { index, text } => Piece::Arguments { index, text },
                    });
                }
                self.calls = self.required.calls();
            }
            Mode::Auto {
                parser: ToolCallParser::Hermes,
                ..
            } => {
                self.held.push_str(text);
                self.scan(out);
            }
            Mode::Auto { parser, .. } => {
                let parser = *parser;
                self.held.push_str(text);
                if self.in_call {
                    // After the marker: the calls, read at the end.
                    return;
                }
                if let Some(marker) = parser.marker()
                    && let Some(at) = self.held.find(marker)
                {
                    // The text before the calls is the answer's; the marker stays with the
                    // calls, so that calls that do not parse go out as written.
                    let before: String = self.held.drain(..at).collect();
                    self.text(before, out);
                    // The whitespace before the calls is not the answer's.
                    self.space.clear();
                    self.in_call = true;
                    return;
                }
                if self.json_answer.is_none() {
                    self.json_answer = may_be_calls(parser, &self.held);
                }
                // Text streams as it comes (but what may begin the marker); calls are read
                // whole at the end.
                if self.json_answer == Some(false) {
                    let keep = parser.marker().map_or(0, |m| partial_suffix(&self.held, m));
                    let ready: String = self.held.drain(..self.held.len() - keep).collect();
                    self.text(ready, out);
                }
            }
        }
    }

    /// Reads a whole answer (not streamed): as its parts would be read, but `"required"`'s
    /// array is read at once, so that an answer cut off inside it is its text rather than a
    /// broken call.
    pub(crate) fn read_whole(&mut self, text: &str, out: &mut Vec<Piece>) {
        if let Mode::Required { .. } = self.mode {
            match required_calls(text) {
                Some(calls) => {
                    for (name, arguments) in calls {
                        self.call(name, arguments, out);
                    }
                }
                None => out.push(Piece::Text(text.to_owned())),
            }
            return;
        }
        self.push(text, out);
        self.finish(out);
    }

    /// Reads what is left at the answer's end.
    pub(crate) fn finish(&mut self, out: &mut Vec<Piece>) {
        match &self.mode {
            Mode::Text => {}
            // An empty answer (cut off at once) is still the call the client forced.
            Mode::Named(_) => self.start_named(out),
            // Calls that began stand as they streamed (cut off, their arguments too, as
            // vLLM streams them); an answer where none began is its text.
            Mode::Required { .. } if self.calls == 0 => {
                out.push(Piece::Text(self.required.text().to_owned()));
            }
            Mode::Required { .. } => {}
            Mode::Auto {
                parser:
                    parser @ (ToolCallParser::Llama3Json
                    | ToolCallParser::Mistral
                    | ToolCallParser::Pythonic),
                ..
            } => {
                let held = std::mem::take(&mut self.held);
                let calls = match parser {
                    _ if !self.in_call && self.json_answer != Some(true) => None,
                    ToolCallParser::Mistral if self.in_call => mistral_marked_calls(&held),
                    ToolCallParser::Mistral => mistral_calls(&held),
                    ToolCallParser::Pythonic => crate::pythonic::calls(&held),
                    _ => llama3_calls(held.strip_prefix(PYTHON_TAG).unwrap_or(&held)),
                };
                match calls {
                    Some(calls) => {
                        for (name, arguments) in calls {
                            self.call(name, arguments, out);
                        }
                    }
                    None => self.text(held, out),
                }
                self.flush_space(out);
            }
            Mode::Auto {
                parser: ToolCallParser::Hermes,
                ..
            } => {
                let held = std::mem::take(&mut self.held);
                if self.in_call {
                    // An unclosed last call, as vLLM's parser reads it, when it parses.
                    match hermes_call(&held) {
                        Some((name, arguments)) => self.call(name, arguments, out),
                        None => self.text(format!("{CALL_OPEN}{held}"), out),
                    }
                } else {
                    self.text(held, out);
                }
                self.flush_space(out);
            }
        }
    }

    /// A named call's beginning, once.
    fn start_named(&mut self, out: &mut Vec<Piece>) {
        if let Mode::Named(name) = &self.mode
            && !self.started
        {
            self.started = true;
            self.calls = 1;
            out.push(Piece::Call {
                index: 0,
                id: self.ids.make(),
                name: name.clone(),
            });
        }
    }

    /// `"auto"`: gives out the text before a call, and each call whose closing tag arrived.
    fn scan(&mut self, out: &mut Vec<Piece>) {
        loop {
            if self.in_call {
                let Some(end) = self.held.find(CALL_CLOSE) else {
                    return;
                };
                let body: String = self.held[..end].to_owned();
                self.held.drain(..end + CALL_CLOSE.len());
                self.in_call = false;
                match hermes_call(&body) {
                    Some((name, arguments)) => self.call(name, arguments, out),
                    None => self.text(format!("{CALL_OPEN}{body}{CALL_CLOSE}"), out),
                }
                continue;
            }
            match self.held.find(CALL_OPEN) {
                Some(start) => {
                    let before: String = self.held[..start].to_owned();
                    self.held.drain(..start + CALL_OPEN.len());
                    self.text(before, out);
                    // What was held before a call is not the answer's text.
                    self.space.clear();
                    self.in_call = true;
                }
                None => {
                    // Keep what may be the start of an opening tag.
                    let keep = partial_suffix(&self.held, CALL_OPEN);
                    let ready: String = self.held[..self.held.len() - keep].to_owned();
                    self.held.drain(..ready.len());
                    self.text(ready, out);
                    return;
                }
            }
        }
    }

    /// At the end: the whitespace held back is the answer's, unless calls ended it.
    fn flush_space(&mut self, out: &mut Vec<Piece>) {
        if self.calls == 0 {
            let space = std::mem::take(&mut self.space);
            if !space.is_empty() {
                out.push(Piece::Text(space));
            }
        }
    }

    /// Gives out answer text, holding back its trailing whitespace until text follows.
    fn text(&mut self, text: String, out: &mut Vec<Piece>) {
        let text = if self.after_call {
            // Text after a call starts afresh, without the whitespace that followed the call.
            let rest = text.trim_start();
            if rest.is_empty() {
                return;
            }
            self.after_call = false;
            rest
        } else {
            &text
        };
        let body = text.trim_end();
        if body.is_empty() {
            self.space.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.space);
        piece.push_str(body);
        out.push(Piece::Text(piece));
        self.space = text[body.len()..].to_owned();
    }

    /// Gives out a whole call (`"auto"` and `"required"`); without `parallel_tool_calls`
    /// only the first.
    fn call(&mut self, name: String, arguments: String, out: &mut Vec<Piece>) {
        if let Mode::Auto {
            parallel: false, ..
        } = self.mode
            && self.calls > 0
        {
            return;
        }
        let index = self.calls;
        self.calls += 1;
        self.space.clear();
        self.after_call = true;
        out.push(Piece::Call {
            index,
            id: self.ids.make(),
            name,
        });
        out.push(Piece::Arguments {
            index,
            text: arguments,
        });
    }
}

/// A call, or the part of one that a batch of [`Piece`]s carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CallPart {
    /// Which call of the answer.
    pub(crate) index: u32,
    /// Its id and function, where the call begins in this batch.
    pub(crate) id: Option<String>,
    pub(crate) name: Option<String>,
    /// Its arguments in this batch (JSON text, or a part of it).
    pub(crate) arguments: String,
}

/// The text and the calls of a batch of pieces (a stream message's, or a whole answer's):
/// each call's arguments joined to its part.
pub(crate) fn join(pieces: Vec<Piece>) -> (String, Vec<CallPart>) {
    let mut text = String::new();
    let mut parts: Vec<CallPart> = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => text.push_str(&t),
            Piece::Call { index, id, name } => parts.push(CallPart {
                index,
                id: Some(id),
                name: Some(name),
                arguments: String::new(),
            }),
            Piece::Arguments { index, text: args } => {
                match parts.iter_mut().find(|c| c.index == index) {
                    Some(part) => part.arguments.push_str(&args),
                    None => parts.push(CallPart {
                        index,
                        arguments: args,
                        ..CallPart::default()
                    }),
                }
            }
        }
    }
    (text, parts)
}

/// Bytes at the end of `text` that may begin `tag` (held back while streaming: the next part
/// may complete it).
pub(crate) fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// A Hermes call's body, `{"name": ..., "arguments": {...}}`: its function and its
/// arguments as JSON text (`{}` when absent).
fn hermes_call(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v["name"].as_str()?.to_owned();
    let arguments = match &v["arguments"] {
        Value::Null => "{}".to_owned(),
        // Some models write the arguments as a JSON string already.
        Value::String(s) => s.clone(),
        a => a.to_string(),
    };
    Some((name, arguments))
}

/// A Llama 3 JSON answer, `{"name": ..., "parameters": {...}}` (or `"arguments"`) one or more
/// times separated by `;`: each call's function and arguments. `None` when it is not that.
fn llama3_calls(text: &str) -> Option<Vec<(String, String)>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut objects = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = objects.next()?.ok()?;
        let used = objects.byte_offset();
        calls.push(json_call(&v)?);
        rest = rest[used..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// A call written as one JSON object, `{"name": ..., "parameters": {...}}` or with
/// `"arguments"`: its function and arguments as JSON text (`{}` when absent; a string of
/// arguments as it is).
fn json_call(v: &Value) -> Option<(String, String)> {
    let name = v["name"].as_str()?.to_owned();
    let arguments = match (&v["parameters"], &v["arguments"]) {
        (Value::Null, Value::Null) => "{}".to_owned(),
        (Value::Null, Value::String(s)) | (Value::String(s), _) => s.clone(),
        (Value::Null, a) | (a, _) => a.to_string(),
    };
    Some((name, arguments))
}

/// Whether an answer that begins with `held` may be calls in `parser`'s whole-answer format
/// (read at its end; `None` while that is not known yet): Llama's starts with `{`, the
/// pythonic list with `[`, Mistral's as [`mistral_answer`] says.
fn may_be_calls(parser: ToolCallParser, held: &str) -> Option<bool> {
    let first = || held.trim_start().chars().next();
    match parser {
        ToolCallParser::Llama3Json => first().map(|c| c == '{'),
        ToolCallParser::Pythonic => first().map(|c| c == '['),
        ToolCallParser::Mistral => mistral_answer(held),
        // Hermes reads calls where they are, not whole answers.
        ToolCallParser::Hermes => Some(false),
    }
}

/// Whether a Mistral answer that begins with `held` may be calls: `Some(true)` when it begins
/// with `[` or a function's name and `{`, `Some(false)` when it cannot, `None` while its first
/// word is still coming.
fn mistral_answer(held: &str) -> Option<bool> {
    let start = held.trim_start();
    let first = start.chars().next()?;
    if first == '[' {
        return Some(true);
    }
    if !is_name_char(first) || first.is_ascii_digit() || first == '-' || first == '.' {
        return Some(false);
    }
    let after = start.trim_start_matches(is_name_char);
    after.chars().next().map(|c| c == '{')
}

/// A character of a function's name (OpenAI's `a-z A-Z 0-9 _ -`, and `.`).
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// A Mistral answer that is calls: a JSON array of call objects (the `[TOOL_CALLS]` token
/// before it is not text), or `name{...}` once per call (the v11 format, whose
/// `[TOOL_CALLS]` and `[ARGS]` are not text either). `None` when it is not that.
fn mistral_calls(text: &str) -> Option<Vec<(String, String)>> {
    let text = text.trim();
    if text.starts_with('[') {
        let v: Value = serde_json::from_str(text).ok()?;
        let calls: Vec<(String, String)> =
            v.as_array()?.iter().map(json_call).collect::<Option<_>>()?;
        return (!calls.is_empty()).then_some(calls);
    }
    let mut calls = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let args_at = rest.find(|c: char| !is_name_char(c))?;
        let name = &rest[..args_at];
        if name.is_empty() || !rest[args_at..].starts_with('{') {
            return None;
        }
        let mut objects = serde_json::Deserializer::from_str(&rest[args_at..]).into_iter::<Value>();
        let arguments = objects.next()?.ok()?;
        let used = objects.byte_offset();
        calls.push((name.to_owned(), arguments.to_string()));
        rest = rest[args_at + used..].trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// Mistral's calls from their first `[TOOL_CALLS]` on, the markers written out: each marked
/// part a JSON array of calls, or `name[ARGS]{...}` (v11), or `name[CALL_ID]id[ARGS]{...}`.
fn mistral_marked_calls(text: &str) -> Option<Vec<(String, String)>> {
    let mut plain = String::with_capacity(text.len());
    for part in text.split(TOOL_CALLS).filter(|p| !p.trim().is_empty()) {
        match part.split_once(ARGS) {
            Some((name, arguments)) => {
                let name = name.split_once(CALL_ID).map_or(name, |(n, _)| n);
                plain.push_str(name.trim());
                plain.push_str(arguments.trim());
            }
            None => plain.push_str(part.trim()),
        }
    }
    mistral_calls(&plain)
}

/// `"required"`'s answer, a JSON array of `{"name", "parameters"}`: each call's function and
/// arguments. `None` when it does not parse (the answer was cut off).
fn required_calls(text: &str) -> Option<Vec<(String, String)>> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    v.as_array()?
        .iter()
        .map(|c| Some((c["name"].as_str()?.to_owned(), c["parameters"].to_string())))
        .collect()
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;

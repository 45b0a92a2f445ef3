//! OpenAI request and response bodies (the subset the router serves).

use serde::{Deserialize, Deserializer, Serialize};

/// A field whose `null` means what its absence means: clients built on libraries that write
/// every field (`"stream": null`) are served as if they had left it out, as vLLM and OpenAI
/// serve them.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `prompt` of `/v1/completions`: text, token ids, or a batch of one of either.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// A string.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A batch of strings (only batches of one are served).
    TextBatch(Vec<String>),
    /// A batch of token id lists (only batches of one are served).
    TokenBatch(Vec<Vec<u32>>),
}

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StopInput {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopInput::One(s) => vec![s],
            StopInput::Many(v) => v,
        }
    }
}

/// `seed`: OpenAI's is a signed 64-bit integer, vLLM's any integer; both map onto the
/// engine's 64 bits (a negative seed as its two's complement), so every integer a client sends
/// names one reproducible stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Seed {
    /// 0 to 2^64 - 1.
    Unsigned(u64),
    /// Below 0.
    Signed(i64),
}

impl Seed {
    /// The engine's seed.
    pub fn bits(self) -> u64 {
        match self {
            Seed::Unsigned(s) => s,
            Seed::Signed(s) => s as u64,
        }
    }
}

/// `stream_options`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default, deserialize_with = "null_as_default")]
    pub include_usage: bool,
    /// vLLM's usage on every chunk: the prompt's tokens and the choice's generated so far.
    #[serde(default, deserialize_with = "null_as_default")]
    pub continuous_usage_stats: bool,
}

/// Most choices (`n`) one request may ask for: every choice is a generation of its own under
/// the request's one slot of the in-flight limit.
pub const MAX_CHOICES: u32 = 16;

/// Sampling fields shared by both endpoints (flattened into the request bodies).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SamplingFields {
    /// 0 is greedy; OpenAI's default is 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k (an extension; 0 or -1 disables, as in vLLM and SGLang).
    pub top_k: Option<i64>,
    /// Seed.
    pub seed: Option<Seed>,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Keep going past end-of-sequence (an extension).
    #[serde(default, deserialize_with = "null_as_default")]
    pub ignore_eos: bool,
    /// Keep the stop string that ended the output in its text (vLLM's extension).
    #[serde(default, deserialize_with = "null_as_default")]
    pub include_stop_str_in_output: bool,
    /// Keep only the prompt's last this many tokens, -1 as many as the router takes (vLLM's
    /// extension).
    pub truncate_prompt_tokens: Option<i64>,
    /// Number of choices, each its own generation (1 to [`MAX_CHOICES`]).
    pub n: Option<u32>,
    /// Stream as server-sent events.
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Force the prefill path, "local" or "remote" (a Dolphin extension for experiments).
    pub prefill_mode: Option<String>,
    /// On a model group: the token-level handoff algorithm, `{"algorithm": "entropy",
    /// "threshold": 2.5}` (a Dolphin extension; absent: the decode worker's default).
    pub handoff: Option<HandoffField>,
    /// Every other field: the logit rules, and the fields this server does not serve
    /// ([`OtherFields`]).
    #[serde(flatten)]
    pub other: OtherFields,
}

/// The request's fields the request types do not name: the logit rules, which
/// [`take_logit_rules`](Self::take_logit_rules) reads, and the fields the server does not
/// implement, OpenAI's and the sampling and decoding extensions of vLLM and SGLang that their
/// clients (benchmark scripts, LiteLLM) send. Each of the latter is accepted only with a value
/// that asks for nothing (absent, null, false, 0, empty, or the default), so a client is never
/// silently served something other than what it asked for ([`first_used`](Self::first_used)).
///
/// Held as the request's leftover fields, not one field each: a request that sends none of
/// them (nearly all) carries an empty map, where 37 `Option<Value>`s made every move of the
/// request's fields a 1.2 KB copy (callgrind, `/v1/completions` at one connection: 116.9k
/// instructions a request with the fields, 115.0k with the map, 115.4k before the list grew
/// from 16 fields to 37).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(transparent)]
pub struct OtherFields(serde_json::Map<String, serde_json::Value>);

/// A field's name and which values ask for something the server still serves.
type UnsupportedField = (&'static str, fn(&serde_json::Value) -> bool);

/// The fields of [`dolphin_proto::v1::LogitRules`], as clients name them (`bad_words` is
/// text, tokenized by the dispatcher: [`OtherFields::take_bad_words`]).
const LOGIT_RULES: [&str; 8] = [
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "repetition_penalty",
    "min_p",
    "stop_token_ids",
    "min_tokens",
    "allowed_token_ids",
];

impl OtherFields {
    /// Takes field `name` out, `None` when absent or null.
    pub(crate) fn take(&mut self, name: &str) -> Option<serde_json::Value> {
        if self.0.is_empty() {
            return None;
        }
        self.0.remove(name).filter(|v| !v.is_null())
    }

    /// Takes string field `name` (`None` when absent or null).
    pub(crate) fn take_string(
        &mut self,
        name: &'static str,
    ) -> Result<Option<String>, (&'static str, String)> {
        self.take(name).map(|v| text(name, &v)).transpose()
    }

    /// Takes boolean field `name` (`None` when absent or null).
    pub(crate) fn take_flag(
        &mut self,
        name: &'static str,
    ) -> Result<Option<bool>, (&'static str, String)> {
        match self.take(name) {
            None => Ok(None),
            Some(serde_json::Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err((name, format!("{name} must be a boolean, got {v}"))),
        }
    }

    /// Takes vLLM's `bad_words`, a list of strings (empty when absent).
    pub(crate) fn take_bad_words(&mut self) -> Result<Vec<String>, (&'static str, String)> {
        const NAME: &str = "bad_words";
        let Some(v) = self.take(NAME) else {
            return Ok(Vec::new());
        };
        let words = v.as_array().and_then(|a| {
            a.iter()
                .map(|w| w.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        });
        words.ok_or_else(|| (NAME, format!("{NAME} must be a list of strings, got {v}")))
    }

    /// Takes `chat_template_kwargs`, the request's own variables for the chat template
    /// ([`template_kwargs`](crate::tokenizer::template_kwargs)'s checks); empty when absent.
    pub(crate) fn take_template_kwargs(
        &mut self,
    ) -> Result<serde_json::Map<String, serde_json::Value>, (&'static str, String)> {
        const NAME: &str = "chat_template_kwargs";
        match self.take(NAME) {
            None => Ok(serde_json::Map::new()),
            Some(v) => {
                crate::tokenizer::template_kwargs(v).map_err(|e| (NAME, format!("{NAME}: {e}")))
            }
        }
    }

    /// Takes the fields that shape how a conversation is rendered (a [`ChatExtras`] without
    /// its tools): `chat_template_kwargs`, `documents`, `add_generation_prompt` and
    /// `continue_final_message` (vLLM's), and `chat_template` where the server trusts
    /// request templates (`--trust-request-chat-template`; refused by name otherwise).
    pub(crate) fn take_chat_extras(
        &mut self,
        trust_template: bool,
    ) -> Result<crate::tokenizer::ChatExtras, (&'static str, String)> {
        use serde_json::Value;
        let mut kwargs = self.take_template_kwargs()?;
        // OpenAI's reasoning effort reaches the template as vLLM passes it (gpt-oss's reads
        // `reasoning_effort`; templates that do not know it ignore it).
        match self.take("reasoning_effort") {
            None => {}
            Some(Value::String(e))
                if ["minimal", "low", "medium", "high"].contains(&e.as_str()) =>
            {
                kwargs.entry("reasoning_effort").or_insert(Value::String(e));
            }
            Some(v) => {
                return Err((
                    "reasoning_effort",
                    format!(
                        "reasoning_effort must be \"minimal\", \"low\", \"medium\" or \"high\", got {v}"
                    ),
                ));
            }
        }
        let mut flag = |name: &'static str| match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err((name, format!("{name} must be a boolean, got {v}"))),
        };
        let add = flag("add_generation_prompt")?;
        let continued = flag("continue_final_message")?.unwrap_or(false);
        let ending =
            crate::tokenizer::ending(continued, add).map_err(|e| ("continue_final_message", e))?;
        let documents = self
            .take("documents")
            .map(crate::tokenizer::documents)
            .transpose()
            .map_err(|e| ("documents", format!("documents {e}")))?;
        let template = match self.take("chat_template") {
            None => None,
            Some(Value::String(s)) => crate::tokenizer::request_template(s, trust_template)
                .map_err(|e| ("chat_template", e))?,
            Some(v) => {
                return Err((
                    "chat_template",
                    format!("chat_template must be a string (a Jinja template), got {v}"),
                ));
            }
        };
        Ok(crate::tokenizer::ChatExtras {
            tools: None,
            kwargs,
            documents,
            ending,
            template,
        })
    }

    /// Takes the logit rules out of the fields: OpenAI's `presence_penalty`,
    /// `frequency_penalty` and `logit_bias` (token ids as strings), vLLM's
    /// `repetition_penalty`, `min_p`, `stop_token_ids`, `min_tokens` and `allowed_token_ids`.
    /// `None` when the request
    /// sends none of them (or only nulls). Read from the leftover fields rather than declared
    /// ones: most requests send none, and seven more fields made the request, moved often,
    /// larger. A value of the wrong type is refused with the field's name; ranges are
    /// [`check_logit_rules`](dolphin_proto::sampling::check_logit_rules)'s.
    pub fn take_logit_rules(
        &mut self,
    ) -> Result<Option<dolphin_proto::v1::LogitRules>, (&'static str, String)> {
        use serde_json::Value;
        if self.0.is_empty() {
            return Ok(None);
        }
        let mut rules = dolphin_proto::v1::LogitRules::default();
        let mut any = false;
        for name in LOGIT_RULES {
            let Some(v) = self.0.remove(name).filter(|v| !v.is_null()) else {
                continue;
            };
            any = true;
            let token = |v: &Value| v.as_u64().and_then(|t| u32::try_from(t).ok());
            let number = |v: &Value| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| (name, format!("{name} must be a number, got {v}")))
            };
            match name {
                "presence_penalty" => rules.presence_penalty = number(&v)?,
                "frequency_penalty" => rules.frequency_penalty = number(&v)?,
                "repetition_penalty" => rules.repetition_penalty = number(&v)?,
                "min_p" => rules.min_p = number(&v)?,
                "min_tokens" => {
                    rules.min_tokens = token(&v).ok_or_else(|| {
                        (
                            name,
                            format!("{name} must be a non-negative integer, got {v}"),
                        )
                    })?;
                }
                "stop_token_ids" | "allowed_token_ids" => {
                    let ids: Option<Vec<u32>> =
                        v.as_array().and_then(|a| a.iter().map(token).collect());
                    let ids = ids.ok_or_else(|| {
                        (name, format!("{name} must be a list of token ids, got {v}"))
                    })?;
                    if name == "stop_token_ids" {
                        rules.stop_token_ids = ids;
                    } else if ids.is_empty() {
                        // As vLLM: an empty list would leave nothing to draw.
                        return Err((name, format!("{name} must not be empty")));
                    } else {
                        rules.allowed_token_ids = ids;
                    }
                }
                _ => {
                    let Some(map) = v.as_object() else {
                        return Err((name, format!("{name} must be an object, got {v}")));
                    };
                    for (key, bias) in map {
                        let t = key.parse::<u32>().map_err(|_| {
                            (name, format!("{name} keys must be token ids, got {key:?}"))
                        })?;
                        rules.logit_bias.insert(t, number(bias)?);
                    }
                }
            }
        }
        Ok(any.then_some(rules))
    }

    /// Takes vLLM's `prompt_logprobs`: the prompt's log probabilities with this many
    /// alternatives per token (0 to the same limit as `logprobs`).
    pub fn take_prompt_logprobs(&mut self) -> Result<Option<u32>, (&'static str, String)> {
        use dolphin_proto::sampling::MAX_TOP_LOGPROBS;
        const NAME: &str = "prompt_logprobs";
        let Some(v) = self.take(NAME) else {
            return Ok(None);
        };
        v.as_u64()
            .and_then(|k| u32::try_from(k).ok())
            .filter(|&k| k <= MAX_TOP_LOGPROBS)
            .map(Some)
            .ok_or_else(|| {
                (
                    NAME,
                    format!("{NAME} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {v}"),
                )
            })
    }

    /// Takes the log-probability fields out: on `/v1/completions` `logprobs`, the number of
    /// alternatives (0 to 20); on chat `logprobs: true` and `top_logprobs` (0 to 20, only with
    /// `logprobs`). `Some(k)` when the request asks for log probabilities with `k`
    /// alternatives. A wrong type or range is refused with the field's name.
    pub fn take_logprobs(&mut self, chat: bool) -> Result<Option<u32>, (&'static str, String)> {
        use dolphin_proto::sampling::MAX_TOP_LOGPROBS;
        if self.0.is_empty() {
            return Ok(None);
        }
        let logprobs = self.0.remove("logprobs").filter(|v| !v.is_null());
        let top = self.0.remove("top_logprobs").filter(|v| !v.is_null());
        let count = |name: &'static str, v: &serde_json::Value| {
            v.as_u64()
                .and_then(|k| u32::try_from(k).ok())
                .filter(|&k| k <= MAX_TOP_LOGPROBS)
                .ok_or_else(|| {
                    (
                        name,
                        format!("{name} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {v}"),
                    )
                })
        };
        if !chat {
            if top.is_some() {
                return Err((
                    "top_logprobs",
                    "top_logprobs is a chat completions field: /v1/completions takes the number of alternatives in logprobs".into(),
                ));
            }
            return logprobs.map(|v| count("logprobs", &v)).transpose();
        }
        let on = match logprobs {
            None => false,
            Some(serde_json::Value::Bool(b)) => b,
            Some(v) => {
                return Err(("logprobs", format!("logprobs must be a boolean, got {v}")));
            }
        };
        let top = top.map(|v| count("top_logprobs", &v)).transpose()?;
        match (on, top) {
            (true, top) => Ok(Some(top.unwrap_or(0))),
            // OpenAI refuses alternatives without logprobs; 0 asks for none.
            (false, Some(k)) if k > 0 => Err((
                "top_logprobs",
                "top_logprobs needs logprobs set to true".into(),
            )),
            (false, _) => Ok(None),
        }
    }

    /// Takes the structured-output fields out: OpenAI's `response_format` (`text`,
    /// `json_object`, `json_schema`), vLLM's `structured_outputs` (`json`, `json_object`,
    /// `regex`, `choice`, `grammar`) and its older `guided_json`, `guided_regex`,
    /// `guided_choice` and `guided_grammar`, and SGLang's `regex` and `json_schema`.
    /// Grammars are Lark (llguidance's dialect). `Some((field, format))` names the field the
    /// format came from; two formats, or a malformed field, are refused with its name. The
    /// format itself is not compiled here ([`Format::check`](dolphin_grammar::Format::check)).
    pub fn take_format(
        &mut self,
    ) -> Result<Option<(&'static str, dolphin_grammar::Format)>, (&'static str, String)> {
        use dolphin_grammar::Format;
        if self.0.is_empty() {
            return Ok(None);
        }
        let mut found: Option<(&'static str, Format)> = None;
        for name in [
            "response_format",
            "structured_outputs",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "json_schema",
            "regex",
        ] {
            let Some(v) = self.0.remove(name).filter(|v| !v.is_null()) else {
                continue;
            };
            let format = match name {
                "response_format" => response_format(&v)?,
                "structured_outputs" => structured_outputs(&v)?,
                "guided_json" | "json_schema" => Some(Format::JsonSchema(schema_text(name, &v)?)),
                "guided_regex" | "regex" => Some(Format::Regex(text(name, &v)?)),
                "guided_choice" => Some(Format::Choice(choice(name, &v)?)),
                _ => Some(Format::Lark(text(name, &v)?)),
            };
            let Some(format) = format else {
                continue;
            };
            if let Some((first, _)) = found {
                return Err((
                    name,
                    format!("{name} and {first} both ask for a format; send one"),
                ));
            }
            found = Some((name, format));
        }
        Ok(found)
    }

    /// The first field that asks for something the server does not do.
    pub fn first_used(&self) -> Option<&'static str> {
        use serde_json::Value;
        if self.0.is_empty() {
            return None;
        }
        // A value that asks for nothing: what the field's absence means.
        let inert = |v: &Value| match v {
            Value::Null => true,
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
        };
        let one = |v: &Value| v.as_f64() == Some(1.0);
        // `tools`, `tool_choice` and `parallel_tool_calls` are taken out before
        // (`tools::take`); OpenAI's deprecated functions are not served.
        let fields: [UnsupportedField; 27] = [
            ("functions", |_| false),
            ("function_call", |v| v == "none"),
            ("best_of", one),
            // Completions read it (`CompletionRequest::echo`); chat has no such field.
            ("echo", |_| false),
            ("suffix", |_| false),
            ("audio", |_| false),
            ("prediction", |_| false),
            // Web search is a hosted tool: not served.
            ("web_search_options", |_| false),
            // Text is what is served.
            ("modalities", |v| v == &serde_json::json!(["text"])),
            // Chat takes these out (`take_chat_extras`); completions render no template.
            ("continue_final_message", |_| false),
            ("chat_template", |_| false),
            ("chat_template_kwargs", |_| false),
            ("documents", |_| false),
            ("use_beam_search", |_| false),
            // Only beam search reads it.
            ("length_penalty", one),
            // SGLang's EBNF grammars (`take_format` serves Lark ones).
            ("ebnf", |_| false),
            // vLLM's: text is always detokenized; request-side logits processors and their arguments; connector parameters; multimodal inputs; the
            // format's whitespace.
            ("detokenize", |v| v == true),
            ("logits_processors", |_| false),
            ("vllm_xargs", |_| false),
            ("kv_transfer_params", |_| false),
            ("mm_processor_kwargs", |_| false),
            ("guided_whitespace_pattern", |_| false),
            // SGLang's: reasoning held back to the end; adapters; hidden states; request-side
            // logits processors; sessions.
            ("stream_reasoning", |v| v == true),
            ("lora_path", |_| false),
            ("return_hidden_states", |_| false),
            ("custom_logit_processor", |_| false),
            ("session_params", |_| false),
        ];
        fields.into_iter().find_map(|(name, accepted)| {
            let v = self.0.get(name)?;
            // An empty `web_search_options` still asks for a search; `detokenize: false`
            // asks for no text.
            let asks = match name {
                "web_search_options" | "detokenize" | "stream_reasoning" => !v.is_null(),
                _ => !inert(v),
            };
            (asks && !accepted(v)).then_some(name)
        })
    }
}

/// A string field's text.
fn text(name: &'static str, v: &serde_json::Value) -> Result<String, (&'static str, String)> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| (name, format!("{name} must be a string, got {v}")))
}

/// A JSON Schema field's schema as JSON text: an object (or boolean) as is, or a string
/// holding one (vLLM's clients send either).
fn schema_text(
    name: &'static str,
    v: &serde_json::Value,
) -> Result<String, (&'static str, String)> {
    match v {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Object(_) | serde_json::Value::Bool(_) => Ok(v.to_string()),
        _ => Err((
            name,
            format!("{name} must be a JSON Schema (an object, or a string holding one), got {v}"),
        )),
    }
}

/// A choice field's strings.
fn choice(
    name: &'static str,
    v: &serde_json::Value,
) -> Result<Vec<String>, (&'static str, String)> {
    let options: Option<Vec<String>> = v
        .as_array()
        .map(|a| a.iter().map(|o| o.as_str().map(str::to_owned)).collect())
        .unwrap_or(None);
    options.ok_or_else(|| (name, format!("{name} must be a list of strings, got {v}")))
}

/// OpenAI's `response_format`: `text` (no format), `json_object`, or `json_schema` with its
/// `json_schema.schema` (absent: any JSON value).
fn response_format(
    v: &serde_json::Value,
) -> Result<Option<dolphin_grammar::Format>, (&'static str, String)> {
    use dolphin_grammar::Format;
    const NAME: &str = "response_format";
    match v["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Format::JsonObject)),
        Some("json_schema") => {
            let spec = &v["json_schema"];
            if !spec.is_object() {
                return Err((
                    NAME,
                    format!(
                        "response_format.json_schema must be an object with the schema, got {spec}"
                    ),
                ));
            }
            let schema = match &spec["schema"] {
                serde_json::Value::Null => "true".to_owned(),
                s => schema_text(NAME, s)?,
            };
            Ok(Some(Format::JsonSchema(schema)))
        }
        _ => Err((
            NAME,
            format!(
                "response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {}",
                v["type"]
            ),
        )),
    }
}

/// vLLM's `structured_outputs`: one of `json` (a schema), `json_object: true`, `regex`,
/// `choice` or `grammar` (Lark); its other keys (`disable_any_whitespace`, ...) ask for
/// nothing served differently and are refused when set.
fn structured_outputs(
    v: &serde_json::Value,
) -> Result<Option<dolphin_grammar::Format>, (&'static str, String)> {
    use dolphin_grammar::Format;
    const NAME: &str = "structured_outputs";
    let Some(map) = v.as_object() else {
        return Err((NAME, format!("{NAME} must be an object, got {v}")));
    };
    let mut found = None;
    for (key, value) in map.iter().filter(|(_, value)| !value.is_null()) {
        let format = match key.as_str() {
            "json" => Format::JsonSchema(schema_text(NAME, value)?),
            "json_object" if value == &serde_json::Value::Bool(false) => continue,
            "json_object" if value == &serde_json::Value::Bool(true) => Format::JsonObject,
            "regex" => Format::Regex(text(NAME, value)?),
            "choice" => Format::Choice(choice(NAME, value)?),
            "grammar" => Format::Lark(text(NAME, value)?),
            other => {
                return Err((
                    NAME,
                    format!(
                        "structured_outputs.{other} is not supported by this server (json, json_object, regex, choice and grammar are)"
                    ),
                ));
            }
        };
        if found.is_some() {
            return Err((NAME, format!("{NAME} names more than one format")));
        }
        found = Some(format);
    }
    Ok(found)
}

/// The `handoff` extension field.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoffField {
    /// Algorithm spec, e.g. `confidence:span=4`; empty: the worker's default.
    #[serde(default)]
    pub algorithm: String,
    /// Overrides the algorithm's main threshold.
    pub threshold: Option<f64>,
}

/// `/v1/completions` request.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// Model name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub model: String,
    /// The prompt.
    pub prompt: PromptInput,
    /// Tokens to generate (OpenAI's default is 16).
    pub max_tokens: Option<u32>,
    /// Start the text with the prompt (for token ids, their text). Chat requests have no
    /// such field: there it is one of the refused ones.
    #[serde(default, deserialize_with = "null_as_default")]
    pub echo: bool,
    /// The rest.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// Content of a chat message: a string or a list of parts.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    /// Plain text.
    Text(String),
    /// Parts; only `text` parts are served.
    Parts(Vec<ContentPart>),
}

/// One part of a chat message.
#[derive(Clone, Debug, Deserialize)]
pub struct ContentPart {
    /// "text" (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default)]
    pub text: String,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessageIn {
    /// "system", "user", "assistant", "tool", ...
    pub role: String,
    /// The content (absent for some assistant messages).
    #[serde(default)]
    pub content: Option<ChatContent>,
    /// The tools an assistant message called.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tool_calls: Vec<ToolCallIn>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// The author's name, which some templates write.
    #[serde(default)]
    pub name: Option<String>,
    /// An earlier assistant answer's thinking (vLLM's `reasoning_content`, or `reasoning`),
    /// which reasoning models' templates write back where they keep it.
    #[serde(default, alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

/// A tool call of an assistant message in the conversation.
#[derive(Clone, Debug, Deserialize)]
pub struct ToolCallIn {
    /// The call's id.
    #[serde(default, deserialize_with = "null_as_default")]
    pub id: String,
    /// The function called.
    pub function: FunctionCallIn,
}

/// The function of a [`ToolCallIn`].
#[derive(Clone, Debug, Deserialize)]
pub struct FunctionCallIn {
    /// Its name.
    pub name: String,
    /// Its arguments, JSON text (as OpenAI sends them).
    #[serde(default, deserialize_with = "null_as_default")]
    pub arguments: String,
}

/// `/v1/chat/completions` request.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    /// Model name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessageIn>,
    /// Tokens to generate (deprecated name).
    pub max_tokens: Option<u32>,
    /// Tokens to generate.
    pub max_completion_tokens: Option<u32>,
    /// The rest.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// Token counts.
#[derive(Clone, Debug, Serialize)]
pub struct UsageOut {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Both.
    pub total_tokens: u32,
    /// Cached prompt tokens (not known in a chunk's running usage, before the end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<CachedDetails>,
    /// On a model group (a Dolphin extension): completion tokens by model and handoffs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffUsage>,
}

/// The `usage.handoff` extension: how a model group's models shared the answer.
#[derive(Clone, Debug, Serialize)]
pub struct HandoffUsage {
    /// The algorithm the request ran.
    pub algorithm: String,
    /// Handoffs between models.
    pub handoffs: u32,
    /// Completion tokens by model.
    pub completion_tokens_by_model: std::collections::BTreeMap<String, u32>,
}

/// `prompt_tokens_details`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CachedDetails {
    /// Prompt tokens served from a prefix cache.
    pub cached_tokens: u32,
}

impl From<&dolphin_proto::v1::Usage> for UsageOut {
    fn from(u: &dolphin_proto::v1::Usage) -> Self {
        UsageOut {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: Some(CachedDetails {
                cached_tokens: u.cached_tokens,
            }),
            handoff: (!u.by_model.is_empty()).then(|| HandoffUsage {
                algorithm: u.handoff_algorithm.clone(),
                handoffs: u.handoffs,
                completion_tokens_by_model: u
                    .by_model
                    .iter()
                    .map(|m| (m.model.clone(), m.completion_tokens))
                    .collect(),
            }),
        }
    }
}

/// One choice of a completion (whole or chunk).
#[derive(Clone, Debug, Serialize)]
pub struct CompletionChoice {
    /// Which of the request's `n` choices.
    pub index: u32,
    /// Generated text.
    pub text: String,
    /// The tokens' log probabilities, where the request asked for them.
    pub logprobs: Option<CompletionLogprobs>,
    /// "stop", "length", or null while streaming.
    pub finish_reason: Option<&'static str>,
    /// The prompt's log probabilities (vLLM's `prompt_logprobs`): null for its first token,
    /// then for each token an object from token ids to `{logprob, rank, decoded_token}`, the
    /// prompt's token and its alternatives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<serde_json::Value>>,
    /// The prompt's token ids (vLLM's `return_token_ids`; in a stream, on the choice's first
    /// chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The generated tokens' ids (vLLM's `return_token_ids`; in a stream, this chunk's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `/v1/completions` response (and stream chunk).
#[derive(Clone, Debug, Serialize)]
pub struct CompletionResponse {
    /// "cmpl-...".
    pub id: String,
    /// "text_completion".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// One choice (none in a usage-only chunk).
    pub choices: Vec<CompletionChoice>,
    /// Token counts (last chunk or whole response).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
}

/// The assistant message of a chat response.
#[derive(Clone, Debug, Serialize)]
pub struct ChatMessageOut {
    /// "assistant".
    pub role: &'static str,
    /// The text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// A reasoning model's thinking, split from the text (`--reasoning-parser`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tools the model called.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A tool call of an answer, whole or as a stream chunk's part of it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ToolCallOut {
    /// Which call of the answer (stream chunks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// The call's id (in a stream, on the call's first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// "function" (with the id).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The function and its arguments.
    pub function: FunctionCallOut,
}

/// The function of a [`ToolCallOut`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct FunctionCallOut {
    /// The function's name (in a stream, on the call's first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its arguments as JSON text (in a stream, the next part of it).
    pub arguments: String,
}

/// A chat choice (whole response).
#[derive(Clone, Debug, Serialize)]
pub struct ChatChoice {
    /// Which of the request's `n` choices.
    pub index: u32,
    /// The answer.
    pub message: ChatMessageOut,
    /// The tokens' log probabilities, where the request asked for them.
    pub logprobs: Option<ChatLogprobs>,
    /// "stop" or "length".
    pub finish_reason: Option<&'static str>,
    /// The generated tokens' ids (vLLM's `return_token_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `/v1/chat/completions` response.
#[derive(Clone, Debug, Serialize)]
pub struct ChatResponse {
    /// "chatcmpl-...".
    pub id: String,
    /// "chat.completion".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: UsageOut,
    /// The prompt's log probabilities, as completions' choices carry them (vLLM's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<serde_json::Value>>,
    /// The prompt's token ids (vLLM's `return_token_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// The delta of a chat stream chunk.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChatDelta {
    /// "assistant" on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// More of a reasoning model's thinking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// New tool calls, or more of their arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A chat stream choice.
#[derive(Clone, Debug, Serialize)]
pub struct ChatChunkChoice {
    /// Which of the request's `n` choices.
    pub index: u32,
    /// New output.
    pub delta: ChatDelta,
    /// The new tokens' log probabilities, where the request asked for them.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the last chunk.
    pub finish_reason: Option<&'static str>,
    /// This chunk's tokens' ids (vLLM's `return_token_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A chat stream chunk.
#[derive(Clone, Debug, Serialize)]
pub struct ChatChunk {
    /// Same id on every chunk.
    pub id: String,
    /// "chat.completion.chunk".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// One choice (none in a usage-only chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// Token counts (usage-only chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
    /// The prompt's token ids (vLLM's `return_token_ids`), on a choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A completions choice's `logprobs` (OpenAI's legacy shape), one entry per token in each list.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log probability (`null` for an echoed prompt's first token).
    pub token_logprobs: Vec<Option<f32>>,
    /// Each step's most likely tokens and the drawn one, text to log probability (`null` for
    /// an echoed prompt's first token).
    pub top_logprobs: Vec<Option<TopLogprobs>>,
    /// Where each token's text starts in the choice's text, in characters.
    pub text_offset: Vec<u32>,
}

/// One step's alternatives as a JSON object of text to log probability, most likely first
/// (a text that two tokens share is listed once, with the likelier one's).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopLogprobs(pub Vec<(String, f32)>);

impl Serialize for TopLogprobs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (text, logprob) in &self.0 {
            map.serialize_entry(text, logprob)?;
        }
        map.end()
    }
}

/// A chat choice's `logprobs`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// A generated token's log probability and its step's most likely tokens.
#[derive(Clone, Debug, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log probability.
    pub logprob: f32,
    /// Its text's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The step's most likely tokens, most likely first.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One of a step's most likely tokens.
#[derive(Clone, Debug, Serialize)]
pub struct ChatTopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log probability.
    pub logprob: f32,
    /// Its text's UTF-8 bytes.
    pub bytes: Vec<u8>,
}

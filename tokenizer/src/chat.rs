//! Chat templates: the model's own Jinja template (`tokenizer.chat_template`), rendered with
//! minijinja configured as Hugging Face `transformers` configures Jinja2 (`trim_blocks`,
//! `lstrip_blocks`, `raise_exception`, `bos_token`/`eos_token` in the context), so the prompt is
//! the one the model was trained on, default system message included.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::error::TokenizerError;

/// ChatML, for models whose file carries no template. Unlike SmolLM2's own template it adds no
/// default system message.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Name of the one template in the environment (no extension: no auto-escaping).
const NAME: &str = "chat";

/// One chat message to render into a prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatMessage {
    /// "system", "user", "assistant", "tool", ...
    pub role: String,
    /// The message text.
    pub content: String,
    /// The tools an assistant message called (empty: none).
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    /// The author's name (OpenAI's `name`), which some templates write.
    pub name: Option<String>,
    /// An assistant message's thinking (vLLM's `reasoning_content`), which reasoning models'
    /// templates (Qwen3's) write back for the turns they keep it in.
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }

    /// The message as templates read it: `role` and `content`, and where set `tool_calls`
    /// (each `{id, type: "function", function: {name, arguments}}`, as `transformers` passes
    /// them), `tool_call_id`, `name` and `reasoning_content`.
    fn to_value(&self) -> Value {
        let mut fields = vec![
            ("role", Value::from(self.role.as_str())),
            ("content", Value::from(self.content.as_str())),
        ];
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self.tool_calls.iter().map(ToolCall::to_value).collect();
            fields.push(("tool_calls", Value::from(calls)));
        }
        for (key, value) in [
            ("tool_call_id", &self.tool_call_id),
            ("name", &self.name),
            ("reasoning_content", &self.reasoning_content),
        ] {
            if let Some(v) = value {
                fields.push((key, Value::from(v.as_str())));
            }
        }
        Value::from_pairs(fields)
    }
}

/// Where the rendered conversation ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ending {
    /// With the assistant's turn opened (`add_generation_prompt`): the model answers.
    #[default]
    AssistantTurn,
    /// Where the template ends the last message (`add_generation_prompt: false`).
    LastMessage,
    /// Inside the last message, left open for the model to go on writing it
    /// (`continue_final_message`, as `transformers` renders it: the text is cut right after the
    /// last message's content, before the template closes the turn).
    ContinueLast,
}

/// What a request adds to its conversation when the template renders it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatExtras {
    /// The tools the model may call: the request's list (`[{"type": "function", "function":
    /// {...}}]`, the shape `transformers` passes); templates that know tools describe them in
    /// the prompt. Without tools, templates see `tools` as none, as `transformers` renders
    /// them.
    pub tools: Option<serde_json::Value>,
    /// Further variables of the template (vLLM's and SGLang's `chat_template_kwargs`, such as
    /// Qwen3's `enable_thinking`). The names the renderer sets ([`RESERVED_NAMES`]) are not
    /// among them.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// Documents for retrieval-augmented generation (`[{"title": ..., "text": ...}]`, the shape
    /// `transformers` passes as `documents`); templates that know them put them in the prompt.
    pub documents: Option<serde_json::Value>,
    /// Where the rendered text ends.
    pub ending: Ending,
    /// The request's own template source, used instead of the model's (vLLM's
    /// `chat_template`); compiled for the request and run with a bounded budget
    /// ([`REQUEST_TEMPLATE_FUEL`]).
    pub template: Option<String>,
}

/// The template variables the renderer sets itself.
pub const RESERVED_NAMES: [&str; 6] = [
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// Instructions a request's own template may run (minijinja's fuel): a loop that would run for
/// minutes ends in an error instead. SmolLM2's template takes about 30 a message (30,205 for a
/// 1,000-message conversation, measured), so conversations are far inside it.
pub const REQUEST_TEMPLATE_FUEL: u64 = 5_000_000;

/// A tool call in an assistant message of the conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, which the `tool` message answering it names.
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments: a JSON object where the client's text parses as one (templates write
    /// them with `tojson`), else the text as a string.
    pub arguments: serde_json::Value,
}

impl ToolCall {
    /// A call as clients send it, its arguments JSON text: templates write arguments with
    /// `tojson`, so they get an object where the text parses as one, else the text.
    pub fn from_text(id: String, name: String, arguments: String) -> ToolCall {
        let arguments =
            serde_json::from_str(&arguments).unwrap_or(serde_json::Value::String(arguments));
        ToolCall {
            id,
            name,
            arguments,
        }
    }

    fn to_value(&self) -> Value {
        let function = Value::from_pairs([
            ("name", Value::from(self.name.as_str())),
            ("arguments", Value::from(Serde(&self.arguments))),
        ]);
        Value::from_pairs([
            ("id", Value::from(self.id.as_str())),
            ("type", Value::from("function")),
            ("function", function),
        ])
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts templates see under those
    /// names (empty when the model has none).
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks; many templates rely on them
        // to drop the newlines around {% %} tags.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(TokenizerError::ChatTemplate)?;
        env.set_syntax(syntax);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        // Llama 3.2 and 3.3 put today's date in the system prompt through it, as transformers
        // provides it.
        env.add_function("strftime_now", |format: String| -> Result<Value, Error> {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            strftime(&format, now).map(Value::from)
        });
        // Templates are Python's Jinja2, where strings, lists and dicts have their Python
        // methods: Qwen3's calls `content.startswith(...)`, `.split(...)` and `.strip(...)`.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_template_owned(NAME, source.to_string())
            .map_err(TokenizerError::ChatTemplate)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The built-in ChatML template ([`CHATML_TEMPLATE`]).
    pub fn chatml() -> ChatTemplate {
        // A constant template; the unit tests render it.
        Self::new(CHATML_TEMPLATE, "", "").expect("the ChatML template compiles")
    }

    /// Another template with this one's `bos_token` and `eos_token`, under a bounded budget
    /// ([`REQUEST_TEMPLATE_FUEL`]): a request's own template.
    pub fn for_request(&self, source: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut t = Self::new(source, &self.bos_token, &self.eos_token)?;
        t.env.set_fuel(Some(REQUEST_TEMPLATE_FUEL));
        Ok(t)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// answer begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let extras = ChatExtras {
            ending: if add_generation_prompt {
                Ending::AssistantTurn
            } else {
                Ending::LastMessage
            },
            ..ChatExtras::default()
        };
        self.render_with(messages, &extras)
    }

    /// Renders `messages` with what the request adds ([`ChatExtras`]): the tools the model may
    /// call, documents, the template's own variables, where the text ends, and the request's
    /// own template when it brings one.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
    ) -> Result<String, TokenizerError> {
        match &extras.template {
            Some(source) => self.for_request(source)?.render_own(messages, extras),
            None => self.render_own(messages, extras),
        }
    }

    fn render_own(
        &self,
        messages: &[ChatMessage],
        extras: &ChatExtras,
    ) -> Result<String, TokenizerError> {
        let values: Vec<Value> = messages.iter().map(ChatMessage::to_value).collect();
        // The names set here come first: a variable of the request cannot replace them.
        let ctx = minijinja::context! {
            messages => values,
            tools => extras.tools.as_ref().map(|t| Value::from(Serde(t))),
            documents => extras.documents.as_ref().map(|d| Value::from(Serde(d))),
            add_generation_prompt => extras.ending == Ending::AssistantTurn,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            ..Value::from(Serde(&extras.kwargs))
        };
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(TokenizerError::ChatTemplate)?;
        let text = tmpl.render(ctx).map_err(TokenizerError::ChatTemplate)?;
        match extras.ending {
            Ending::ContinueLast => continue_last(text, messages),
            Ending::AssistantTurn | Ending::LastMessage => Ok(text),
        }
    }
}

/// `text` cut right after the last message's content, as `transformers` renders
/// `continue_final_message`: at its last occurrence, or its trimmed text's where the template
/// trims contents (Llama 3.1's does).
fn continue_last(mut text: String, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
    let content = messages.last().map_or("", |m| m.content.as_str());
    let end = [content, content.trim()]
        .into_iter()
        .find_map(|c| text.rfind(c).map(|at| at + c.len()))
        .ok_or_else(|| {
            TokenizerError::ChatTemplate(Error::new(
                ErrorKind::InvalidOperation,
                "continue_final_message: the template does not write the final message's content as it is, so it cannot be continued",
            ))
        })?;
    text.truncate(end);
    Ok(text)
}

/// `tojson` as `transformers` defines it for chat templates, `json.dumps(x, ensure_ascii=False,
/// indent=indent)`: `", "` and `": "` between items (newlines and `indent` spaces with an
/// indent), text as it is. minijinja's own filter writes compact JSON and escapes `<`, `>`, `&`
/// and `'` for HTML, which would change the prompt a model was trained on (tool schemas go
/// into it through this filter).
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    use serde::Serialize;
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(n) => Some(n),
        None => indent,
    };
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let pretty = serde_json::ser::PrettyFormatter::with_indent(&spaces);
            value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut out, pretty,
            ))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonSeparators,
        )),
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from(text))
}

/// `format` as Python's `strftime` writes the UTC time `unix_secs`, for the directives chat
/// templates use (`%d %m %Y %y %b %B %a %A %H %M %S %j %%`); another directive is an error.
fn strftime(format: &str, unix_secs: u64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(month - 1) as usize] + day + i64::from(leap && month > 2);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 3).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: %{} is not supported", other.unwrap_or(' ')),
                ));
            }
        }
    }
    Ok(out)
}

/// Python's default JSON separators: `", "` between items and `": "` after a key.
struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as stored in its GGUF.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    const DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

    #[test]
    fn smollm2_adds_its_default_system_message() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi!")], true).unwrap();
        assert_eq!(
            out,
            format!("{DEFAULT_SYSTEM}<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
        );
        let out = t.render(&[ChatMessage::new("user", "Hi!")], false).unwrap();
        assert_eq!(
            out,
            format!("{DEFAULT_SYSTEM}<|im_start|>user\nHi!<|im_end|>\n")
        );
    }

    #[test]
    fn smollm2_keeps_a_given_system_message_and_all_roles() {
        let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "2+2?"),
            ChatMessage::new("assistant", "4"),
            ChatMessage::new("user", "{{ not a tag }} and 'quotes' \"too\""),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n4<|im_end|>\n\
             <|im_start|>user\n{{ not a tag }} and 'quotes' \"too\"<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.render(&[], true).unwrap(), "<|im_start|>assistant\n");
    }

    /// The tool parts of Qwen2.5's template (Hermes-style calls), shortened.
    const TOOLS: &str = "{% if tools %}<tools>{% for tool in tools %}{{ tool | tojson }};{% endfor %}</tools>\n{% endif %}\
{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}\
{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}} {{ c.id }} {{ c.type }}</tool_call>{% endfor %}\
{% elif m.role == 'tool' %}<tool_response {{ m.tool_call_id }}>{{ m.content }}</tool_response>\
{% else %}{{ m.role }}: {{ m.content }}{% endif %}{{ '\n' }}{% endfor %}";

    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let t = ChatTemplate::new(TOOLS, "", "").unwrap();
        let tools = serde_json::json!([{"type": "function", "function": {"name": "weather", "description": "Today's weather"}}]);
        let call = ToolCall {
            id: "call_1".into(),
            name: "weather".into(),
            arguments: serde_json::json!({"city": "Paris"}),
        };
        let msgs = [
            ChatMessage::new("user", "Paris?"),
            ChatMessage {
                role: "assistant".into(),
                tool_calls: vec![call],
                ..ChatMessage::default()
            },
            ChatMessage {
                tool_call_id: Some("call_1".into()),
                ..ChatMessage::new("tool", "sunny")
            },
        ];
        let extras = ChatExtras {
            tools: Some(tools),
            ending: Ending::LastMessage,
            ..ChatExtras::default()
        };
        assert_eq!(
            t.render_with(&msgs, &extras).unwrap(),
            "<tools>{\"type\": \"function\", \"function\": {\"name\": \"weather\", \"description\": \"Today's weather\"}};</tools>\n\
             user: Paris?\n\
             <tool_call>{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}} call_1 function</tool_call>\n\
             <tool_response call_1>sunny</tool_response>\n"
        );
        // As Python writes it: text as is, and with an indent.
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "").unwrap();
        let ctx = minijinja::context! { x => Value::from(Serde(serde_json::json!({"a": ["<b> & 'é'", 1.5]}))) };
        let out = t.env.get_template(NAME).unwrap().render(ctx).unwrap();
        assert_eq!(
            out,
            "{\"a\": [\"<b> & 'é'\", 1.5]}|{\n  \"a\": [\n    \"<b> & 'é'\",\n    1.5\n  ]\n}"
        );
        let t = ChatTemplate::new(TOOLS, "", "").unwrap();
        // No tools: `tools` is none, as transformers renders it.
        assert_eq!(t.render(&msgs[..1], false).unwrap(), "user: Paris?\n");
    }

    /// A message's `name` and an assistant message's `reasoning_content` reach the template
    /// (Qwen3's writes the thinking back as `<think>` for the turns it keeps it in); unset,
    /// they are undefined there, as in `transformers`.
    #[test]
    fn names_and_earlier_thinking_reach_the_template() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}{% if m.name %}({{ m.name }}){% endif %}: \
             {% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}\
             {{ m.content }}\n{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let msgs = [
            ChatMessage {
                name: Some("ada".into()),
                ..ChatMessage::new("user", "2+2?")
            },
            ChatMessage {
                reasoning_content: Some("Add them.".into()),
                ..ChatMessage::new("assistant", "4")
            },
            ChatMessage::new("user", "And 3+3?"),
        ];
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "user(ada): 2+2?\nassistant: <think>Add them.</think>4\nuser: And 3+3?\n"
        );
    }

    /// What Qwen3's template does with a conversation: a namespace set in a reversed loop,
    /// Python's string methods to split the reasoning from an answer and to find tool results,
    /// `is string` and `is not defined` tests.
    const PYTHONIC: &str = "{%- set ns = namespace(last_query=-1) %}\
{%- for m in messages[::-1] %}{%- if m.role == 'user' and not m.content.startswith('<tool_response>') and ns.last_query == -1 %}\
{%- set ns.last_query = (messages|length - 1) - loop.index0 %}{%- endif %}{%- endfor %}\
{%- for m in messages %}{%- set content = m.content if m.content is string else '' %}\
{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}\
{{- m.role + ':' + content.strip() + '|' }}{%- endfor %}\
{{- ns.last_query }}{%- if enable_thinking is not defined %}:think{%- endif %}";

    #[test]
    fn templates_call_pythons_string_methods() {
        let t = ChatTemplate::new(PYTHONIC, "", "").unwrap();
        let msgs = [
            ChatMessage::new("user", "Q1"),
            ChatMessage::new("assistant", "<think>\nhm\n</think>\n\n A1 "),
            ChatMessage::new("user", "<tool_response>x</tool_response>"),
        ];
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "user:Q1|assistant:A1|user:<tool_response>x</tool_response>|0:think"
        );
        // The request's own variables, which cannot replace the renderer's.
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), false.into());
        kwargs.insert("messages".into(), serde_json::json!([]));
        let extras = ChatExtras {
            kwargs,
            ending: Ending::LastMessage,
            ..ChatExtras::default()
        };
        assert_eq!(t.render_with(&msgs[..1], &extras).unwrap(), "user:Q1|0");
    }

    const LLAMA_LIKE: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}<|eot|>{% endfor %}\
{% if documents %}{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}{% endif %}\
{% if add_generation_prompt %}<|assistant|>{% endif %}";

    #[test]
    fn a_conversation_ends_where_the_request_says() {
        let t = ChatTemplate::new(LLAMA_LIKE, "", "").unwrap();
        let msgs = [
            ChatMessage::new("user", "Name a colour."),
            ChatMessage::new("assistant", "The colour is "),
        ];
        let with = |ending| ChatExtras {
            ending,
            ..ChatExtras::default()
        };
        assert_eq!(
            t.render_with(&msgs, &with(Ending::AssistantTurn)).unwrap(),
            "<|user|>Name a colour.<|eot|><|assistant|>The colour is<|eot|><|assistant|>"
        );
        assert_eq!(
            t.render_with(&msgs, &with(Ending::LastMessage)).unwrap(),
            "<|user|>Name a colour.<|eot|><|assistant|>The colour is<|eot|>"
        );
        // The template trims the content: cut after the trimmed text, before the turn's end.
        assert_eq!(
            t.render_with(&msgs, &with(Ending::ContinueLast)).unwrap(),
            "<|user|>Name a colour.<|eot|><|assistant|>The colour is"
        );
        // A template that does not write the content as it is cannot be continued.
        let upper = ChatTemplate::new(
            "{% for m in messages %}{{ m.content | upper }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let err = upper
            .render_with(&msgs, &with(Ending::ContinueLast))
            .unwrap_err();
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert!(
            source.is_some_and(|s| s.contains("continue_final_message")),
            "{err:?}"
        );
    }

    #[test]
    fn documents_and_a_request_template_reach_the_renderer() {
        let t = ChatTemplate::new(LLAMA_LIKE, "<s>", "</s>").unwrap();
        let msgs = [ChatMessage::new("user", "Who?")];
        let extras = ChatExtras {
            documents: Some(serde_json::json!([{"title": "A", "text": "Ada"}])),
            ..ChatExtras::default()
        };
        assert_eq!(
            t.render_with(&msgs, &extras).unwrap(),
            "<|user|>Who?<|eot|>[A: Ada]<|assistant|>"
        );
        // The request's own template, with the model's special tokens.
        let own = ChatExtras {
            template: Some("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into()),
            ..ChatExtras::default()
        };
        assert_eq!(t.render_with(&msgs, &own).unwrap(), "<s>Who?</s>");
        // One that does not compile, and one that would run for minutes: errors.
        let broken = ChatExtras {
            template: Some("{% for %}".into()),
            ..ChatExtras::default()
        };
        assert!(t.render_with(&msgs, &broken).is_err());
        let endless = ChatExtras {
            template: Some(
                "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
                    .into(),
            ),
            ..ChatExtras::default()
        };
        // (Without the budget this would not end: 10^10 iterations.)
        assert!(t.render_with(&msgs, &endless).is_err());
    }

    #[test]
    fn strftime_writes_dates_as_python_does() {
        // 2024-07-26 13:25:09 UTC, a Friday, day 208 of a leap year (Python gives the same).
        let t = 1_722_000_309;
        assert_eq!(
            strftime("%d %b %Y|%B %m %y|%a %A|%H:%M:%S|%j|%%", t).unwrap(),
            "26 Jul 2024|July 07 24|Fri Friday|13:25:09|208|%"
        );
        assert_eq!(strftime("%d %b %Y", 0).unwrap(), "01 Jan 1970");
        assert_eq!(
            strftime("%Y-%m-%d %a", 951_782_400).unwrap(),
            "2000-02-29 Tue"
        );
        assert!(strftime("%Q", t).is_err());
        let today = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
        assert!(today.render(&[], false).unwrap().starts_with("20"));
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::chatml();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "hi")], true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.source(), CHATML_TEMPLATE);
    }

    #[test]
    fn transformers_whitespace_control_and_context() {
        let src = "{% for m in messages %}\n  {{ bos_token }}{{ m.content }}\n{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(
                &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
                false,
            )
            .unwrap();
        assert_eq!(out, "  <s>a\n  <s>b\n</s>");
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_errors() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], false).unwrap(),
            "ok"
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], false)
            .unwrap_err();
        let TokenizerError::ChatTemplate(e) = &err else {
            panic!("{err:?}")
        };
        assert!(e.to_string().contains("first must be user"), "{e}");
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(TokenizerError::ChatTemplate(_))
        ));
    }
}

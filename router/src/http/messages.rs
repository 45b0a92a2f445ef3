//! Anthropic's Messages API, `POST /v1/messages` (and `/v1/messages/count_tokens`), for the
//! clients that speak only it (Anthropic's SDKs, Claude Code and the agents built on them), as
//! vLLM serves it: a request is turned into the chat request it means (`system`, content
//! blocks, `tool_use` and `tool_result` blocks, tools with `input_schema`, `tool_choice`,
//! `stop_sequences`, `thinking`), checked and dispatched by the chat path, and its answer read
//! by the same [`AnswerReader`](crate::answer::AnswerReader) into content blocks
//! ([`super::message_events`]): whole, or streamed as Anthropic's typed events. Errors take
//! Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::AppState;
use super::completions::{self, Prepared};
use super::error::ApiError;
use super::message_events::Blocks;

type Fields = Map<String, Value>;

/// A Messages request turned into its chat request, with the model its answer names.
pub(crate) fn prepare(
    st: &AppState,
    headers: &HeaderMap,
    body: Fields,
) -> Result<(Prepared, String), ApiError> {
    let chat = to_chat(body)?;
    let model = match chat.get("model").and_then(Value::as_str) {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => st.dispatcher.config().model.clone(),
    };
    Ok((completions::chat_from(st, headers, chat)?, model))
}

/// Dispatches a prepared Messages request and answers it, whole or as events.
pub(crate) async fn run(
    st: &AppState,
    prepared: Prepared,
    model: String,
) -> Result<Response, ApiError> {
    let started = completions::start(st, prepared).await?;
    let id = format!("msg_{}", started.rs.request_id());
    let blocks = Blocks::new(id, model, &started.tools, started.readers);
    let mut resp = if started.stream {
        blocks.stream(started.rs)
    } else {
        blocks.whole(started.rs).await?
    };
    resp.headers_mut().extend(started.headers);
    Ok(resp)
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, `{"input_tokens": N}`.
pub(crate) async fn count_tokens(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    match counted(&st, &headers, body).await {
        Ok(n) => axum::Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error_response(e),
    }
}

async fn counted(
    st: &AppState,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<usize, ApiError> {
    let bytes = super::public::read_body(body).await?;
    let Value::Object(mut body) = serde_json::from_slice::<Value>(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}"), None))?
    else {
        return Err(ApiError::invalid("the body must be a JSON object", None));
    };
    // Counting needs no answer length.
    body.entry("max_tokens").or_insert(json!(1));
    let (prepared, _) = prepare(st, headers, body)?;
    let tokens = super::tokenize::tokenize_off_thread(st, prepared.into_prompt(), None).await?;
    Ok(tokens.len())
}

/// An error in Anthropic's shape, with the status it came with (the field it names leads the
/// message, as Anthropic's name theirs).
pub(crate) fn error_response(e: ApiError) -> Response {
    let body = error_json(&e);
    (e.status, axum::Json(body)).into_response()
}

/// `{"type": "error", "error": {"type", "message"}}` for `e`.
pub(crate) fn error_json(e: &ApiError) -> Value {
    let kind = match e.status.as_u16() {
        400 | 405 | 415 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let message = match e.param {
        Some(field) if !e.message.starts_with(field) => format!("{field}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn invalid(field: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(message.into(), Some(field))
}

/// The chat request a Messages request means.
fn to_chat(mut body: Fields) -> Result<Fields, ApiError> {
    for (field, why) in [
        ("mcp_servers", "MCP servers are not served"),
        ("container", "code execution containers are not served"),
        ("context_management", "context management is not served"),
    ] {
        if body.get(field).is_some_and(|v| !v.is_null()) {
            return Err(invalid(field, format!("{field} is not supported: {why}")));
        }
    }
    let mut chat = Fields::new();
    let max_tokens = match body.remove("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some() => n,
        None | Some(Value::Null) => return Err(invalid("max_tokens", "max_tokens is required")),
        Some(other) => {
            return Err(invalid(
                "max_tokens",
                format!("max_tokens must be a non-negative integer, got {other}"),
            ));
        }
    };
    chat.insert("max_tokens".into(), Value::Number(max_tokens));
    let mut messages = Vec::new();
    if let Some(system) = body.remove("system").filter(|v| !v.is_null()) {
        let text = text_of("system", &system)?;
        messages.push(json!({"role": "system", "content": text}));
    }
    match body.remove("messages") {
        Some(Value::Array(list)) => {
            for (i, m) in list.into_iter().enumerate() {
                message(i, m, &mut messages)?;
            }
        }
        None | Some(Value::Null) => return Err(invalid("messages", "messages is required")),
        Some(other) => {
            return Err(invalid(
                "messages",
                format!("messages must be a list, got {other}"),
            ));
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body.remove("tools").filter(|v| !v.is_null()) {
        let Value::Array(tools) = tools else {
            return Err(invalid(
                "tools",
                format!("tools must be a list, got {tools}"),
            ));
        };
        let tools = tools
            .iter()
            .enumerate()
            .map(|(i, t)| chat_tool(i, t))
            .collect::<Result<Vec<Value>, ApiError>>()?;
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = body.remove("tool_choice").filter(|v| !v.is_null()) {
        let (choice, parallel) = chat_tool_choice(&choice)?;
        chat.insert("tool_choice".into(), choice);
        if let Some(parallel) = parallel {
            chat.insert("parallel_tool_calls".into(), Value::Bool(parallel));
        }
    }
    if let Some(stops) = body.remove("stop_sequences").filter(|v| !v.is_null()) {
        chat.insert("stop".into(), stops);
    }
    if let Some(thinking) = body.remove("thinking").filter(|v| !v.is_null()) {
        // The templates that can think or not read `enable_thinking` (Qwen3's).
        let on = match thinking["type"].as_str() {
            Some("enabled" | "adaptive") => true,
            Some("disabled") => false,
            _ => {
                return Err(invalid(
                    "thinking",
                    format!("thinking.type must be \"enabled\" or \"disabled\", got {thinking}"),
                ));
            }
        };
        chat.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": on}),
        );
    }
    if let Some(config) = body.remove("output_config").filter(|v| !v.is_null()) {
        output_config(&config, &mut chat)?;
    }
    // Fields that change nothing of the answer here, taken out: a prefix cache is always on
    // (`cache_control` marks what to cache), and there is one place and speed to serve from.
    for field in [
        "metadata",
        "service_tier",
        "anthropic_version",
        "cache_control",
        "inference_geo",
        "speed",
        "diagnostics",
        "user_profile_id",
        "workspace_id",
    ] {
        body.remove(field);
    }
    // The rest (model, stream, temperature, top_p, top_k, the sampling extensions) means the
    // same to chat, which refuses by name what it does not serve.
    chat.extend(body);
    Ok(chat)
}

/// `output_config`: its JSON Schema `format` as chat's `response_format`, its `effort` as the
/// template variable `reasoning_effort` (as chat's `reasoning_effort` passes it).
fn output_config(config: &Value, chat: &mut Fields) -> Result<(), ApiError> {
    const NAME: &str = "output_config";
    let Value::Object(config) = config else {
        return Err(invalid(
            NAME,
            format!("{NAME} must be an object, got {config}"),
        ));
    };
    for (key, v) in config.iter().filter(|(_, v)| !v.is_null()) {
        match key.as_str() {
            "format" => match (v["type"].as_str(), &v["schema"]) {
                (Some("json_schema"), schema @ (Value::Object(_) | Value::Bool(_))) => {
                    chat.insert(
                        "response_format".into(),
                        json!({"type": "json_schema",
                            "json_schema": {"name": "output", "schema": schema}}),
                    );
                }
                _ => {
                    return Err(invalid(
                        NAME,
                        format!(
                            "output_config.format must be {{\"type\": \"json_schema\", \"schema\": {{...}}}}, got {v}"
                        ),
                    ));
                }
            },
            "effort" => {
                chat.insert("reasoning_effort".into(), v.clone());
            }
            other => {
                return Err(invalid(
                    NAME,
                    format!("output_config.{other} is not supported (format and effort are)"),
                ));
            }
        }
    }
    Ok(())
}

/// The text of a `system` value or a tool result: a string, or text blocks joined.
fn text_of(field: &'static str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for b in blocks {
                match (b["type"].as_str(), b["text"].as_str()) {
                    (Some("text"), Some(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    _ => {
                        return Err(invalid(
                            field,
                            format!("{field}: only text blocks are served, got {}", b["type"]),
                        ));
                    }
                }
            }
            Ok(text)
        }
        other => Err(invalid(
            field,
            format!("{field} must be a string or a list of text blocks, got {other}"),
        )),
    }
}

/// Message `i` of the conversation as chat messages: a user turn's tool results become `tool`
/// messages (before its text), an assistant turn's `tool_use` blocks its calls and its
/// `thinking` blocks its `reasoning_content` (which reasoning models' templates write back
/// where they keep it; a `redacted_thinking` block's data is Anthropic's, not text).
fn message(i: usize, m: Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    const NAME: &str = "messages";
    let role = m["role"].as_str().unwrap_or_default().to_owned();
    if role != "user" && role != "assistant" {
        return Err(invalid(
            NAME,
            format!(
                "messages.{i}.role must be \"user\" or \"assistant\", got {}",
                m["role"]
            ),
        ));
    }
    let blocks = match &m["content"] {
        Value::String(s) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        other => {
            return Err(invalid(
                NAME,
                format!("messages.{i}.content must be a string or a list of blocks, got {other}"),
            ));
        }
    };
    let (mut text, mut calls, mut thought) = (String::new(), Vec::new(), String::new());
    for (j, b) in blocks.iter().enumerate() {
        let kind = b["type"].as_str().unwrap_or_default();
        match (role.as_str(), kind) {
            (_, "text") => {
                // Blocks are paragraphs of one turn.
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(b["text"].as_str().unwrap_or_default());
            }
            ("assistant", "tool_use") => {
                let (Some(id), Some(name)) = (b["id"].as_str(), b["name"].as_str()) else {
                    return Err(invalid(
                        NAME,
                        format!("messages.{i}.content.{j}: a tool_use block needs id and name"),
                    ));
                };
                let input = match &b["input"] {
                    Value::Null => json!({}),
                    v => v.clone(),
                };
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("assistant", "thinking") => {
                if !thought.is_empty() {
                    thought.push('\n');
                }
                thought.push_str(b["thinking"].as_str().unwrap_or_default());
            }
            ("assistant", "redacted_thinking") => {}
            ("user", "tool_result") => {
                let Some(id) = b["tool_use_id"].as_str() else {
                    return Err(invalid(
                        NAME,
                        format!("messages.{i}.content.{j}: a tool_result block needs tool_use_id"),
                    ));
                };
                let content = match &b["content"] {
                    Value::Null => String::new(),
                    v => text_of(NAME, v)?,
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            _ => {
                return Err(invalid(
                    NAME,
                    format!(
                        "messages.{i}.content.{j}: {kind:?} blocks are not served in {role} messages (text, tool_use, tool_result and thinking are)"
                    ),
                ));
            }
        }
    }
    if role == "assistant" {
        let mut turn = json!({"role": "assistant", "content": text});
        if !thought.is_empty() {
            turn["reasoning_content"] = Value::String(thought);
        }
        if !calls.is_empty() {
            turn["tool_calls"] = Value::Array(calls);
            if text.is_empty() {
                turn["content"] = Value::Null;
            }
        }
        out.push(turn);
    } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// A client tool, `{name, description, input_schema}`, as chat's function tool; the tools
/// Anthropic hosts or runs (`bash_...`, `web_search_...`, ...) are not served.
fn chat_tool(i: usize, tool: &Value) -> Result<Value, ApiError> {
    match tool["type"].as_str() {
        None | Some("custom") => {}
        Some(other) => {
            return Err(invalid(
                "tools",
                format!("tools.{i}: {other:?} tools are not served (client tools are)"),
            ));
        }
    }
    let mut function = Fields::new();
    for (from, to) in [
        ("name", "name"),
        ("description", "description"),
        ("input_schema", "parameters"),
        ("strict", "strict"),
    ] {
        if let Some(v) = tool.get(from).filter(|v| !v.is_null()) {
            function.insert(to.into(), v.clone());
        }
    }
    Ok(json!({"type": "function", "function": function}))
}

/// Anthropic's `tool_choice` as chat's, and `parallel_tool_calls` where it says
/// (`disable_parallel_tool_use`).
fn chat_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = choice["disable_parallel_tool_use"].as_bool().map(|d| !d);
    let chat = match choice["type"].as_str() {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice["name"].as_str() {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(invalid(
                    "tool_choice",
                    "tool_choice of type tool needs a name",
                ));
            }
        },
        _ => {
            return Err(invalid(
                "tool_choice",
                format!(
                    "tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\", got {}",
                    choice["type"]
                ),
            ));
        }
    };
    Ok((chat, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn chat_of(body: Value) -> Result<Value, ApiError> {
        let Value::Object(body) = body else {
            panic!("an object")
        };
        to_chat(body).map(Value::Object)
    }

    #[test]
    fn a_conversation_with_tools_becomes_chat_messages() {
        let chat = chat_of(json!({
            "model": "m",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "wx", "input": {"c": "Paris"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "Thanks. And Oslo?"},
                ]},
            ],
            "tools": [{"name": "wx", "description": "Weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"],
            "thinking": {"type": "disabled"},
            "metadata": {"user_id": "u"},
            "cache_control": {"type": "ephemeral"},
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
            "temperature": 0,
        }))
        .expect("converts");
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
                 "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "wx", "arguments": "{\"c\":\"Paris\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "user", "content": "Thanks. And Oslo?"},
            ])
        );
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "wx", "description": "Weather", "parameters": {"type": "object"}}}])
        );
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["max_tokens"], 64);
        assert_eq!(
            chat["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        assert!(chat.get("metadata").is_none() && chat.get("system").is_none());
        assert!(chat.get("cache_control").is_none());
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(
            chat["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}})
        );
    }

    #[test]
    fn what_is_not_served_is_refused_by_name() {
        for (body, field) in [
            (json!({"messages": []}), "max_tokens"),
            (json!({"max_tokens": 8}), "messages"),
            (
                json!({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}),
                "messages",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages",
            ),
            (
                json!({"max_tokens": 8, "messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools",
            ),
            (
                json!({"max_tokens": 8, "messages": [], "tool_choice": {"type": "sometimes"}}),
                "tool_choice",
            ),
            (
                json!({"max_tokens": 8, "messages": [], "mcp_servers": [{}]}),
                "mcp_servers",
            ),
            (
                json!({"max_tokens": 8, "messages": [], "thinking": {"type": "maybe"}}),
                "thinking",
            ),
            (
                json!({"max_tokens": 8, "messages": [], "output_config": {"format": {"type": "xml"}}}),
                "output_config",
            ),
        ] {
            let err = chat_of(body.clone()).expect_err("refused");
            assert_eq!(err.param, Some(field), "{body}: {}", err.message);
        }
    }

    #[test]
    fn errors_take_anthropics_shape() {
        let e = ApiError::invalid("must be positive", Some("max_tokens"));
        assert_eq!(
            error_json(&e),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "max_tokens: must be positive"}})
        );
        assert_eq!(error_response(e).status(), StatusCode::BAD_REQUEST);
    }
}

//! OpenAI's Responses API, `POST /v1/responses`, stateless: a request is turned into the chat
//! request it means (its `input` items into messages, its flat function tools into chat's,
//! `text.format` into `response_format`), checked and dispatched by the chat path, and its
//! answer read by the same [`AnswerReader`](crate::answer::AnswerReader) into output items
//! ([`super::response_events`]): whole, or streamed as the typed events OpenAI's SDKs read.
//!
//! Responses are kept only where the router keeps some (`--responses-store` in memory,
//! `--responses-etcd-ttl` in etcd, [`super::response_store`]): then `previous_response_id` continues a kept one's
//! conversation and `GET`/`DELETE /v1/responses/{id}` read and forget one; otherwise such
//! requests are refused by name, as are `conversation`, `background` and the tools OpenAI
//! hosts (web search, file search, ...).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::AppState;
use super::completions::{self, Prepared};
use super::error::ApiError;
use super::response_events::{Echo, Events};

type Fields = Map<String, Value>;

/// A Responses request turned into its chat request, with what its answer repeats back.
pub(crate) async fn prepare(
    st: &AppState,
    headers: &HeaderMap,
    mut body: Fields,
) -> Result<(Prepared, Echo), ApiError> {
    let history = match body.remove("previous_response_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(_)) if !st.responses.enabled() => {
            return Err(invalid(
                "previous_response_id",
                "previous_response_id is not supported: this router keeps no responses (--responses-store, --responses-etcd-ttl); send the whole conversation in input",
            ));
        }
        Some(Value::String(id)) => match st.responses.get(&id).await? {
            Some(stored) => stored.conversation,
            None => return Err(not_found("previous_response_id", &id)),
        },
        Some(other) => {
            return Err(invalid(
                "previous_response_id",
                format!("previous_response_id must be a string, got {other}"),
            ));
        }
    };
    // OpenAI stores by default; here only where the router keeps responses.
    let store = body
        .remove("store")
        .and_then(|v| v.as_bool())
        .unwrap_or(true)
        && st.responses.enabled();
    let (chat, mut echo) = to_chat(body, history)?;
    if store {
        // What a later response continues from: the messages, less the instructions.
        let skip = usize::from(echo.instructions.is_some());
        echo.conversation = chat
            .get("messages")
            .and_then(Value::as_array)
            .map_or_else(Vec::new, |m| m[skip..].to_vec());
        echo.store = Some(st.responses.clone());
    }
    Ok((completions::chat_from(st, headers, chat)?, echo))
}

/// Dispatches a prepared Responses request and answers it, whole or as events.
pub(crate) async fn run(
    st: &AppState,
    prepared: Prepared,
    echo: Echo,
) -> Result<Response, ApiError> {
    let mut echo = echo;
    if echo.model.is_empty() {
        echo.model = st.dispatcher.config().model.clone();
    }
    let started = completions::start(st, prepared).await?;
    // Not the request's id, which a client may choose (`x-request-id`): a kept response's id
    // must name one response only.
    let id = crate::selection::with_rng(|r| {
        use rand::Rng;
        format!("resp_{:016x}{:016x}", r.random::<u64>(), r.random::<u64>())
    });
    let events = Events::new(
        id,
        completions::now(),
        echo,
        &started.tools,
        started.readers,
    )
    .with_logprobs(started.logprobs);
    let mut resp = if started.stream {
        events.stream(started.rs)
    } else {
        events.whole(started.rs).await?
    };
    resp.headers_mut().extend(started.headers);
    Ok(resp)
}

fn invalid(field: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(message.into(), Some(field))
}

fn not_found(field: &'static str, id: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no response with id {id:?} is kept by this router"),
        kind: "invalid_request_error",
        param: Some(field),
        code: None,
    }
}

/// `GET /v1/responses/{id}`: a kept response.
pub(crate) async fn retrieve(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    match st.responses.get(&id).await {
        Ok(Some(stored)) => axum::Json(stored.response).into_response(),
        Ok(None) => not_found("id", &id).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// `DELETE /v1/responses/{id}`: forgets a kept response.
pub(crate) async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    match st.responses.delete(&id).await {
        Ok(true) => {
            axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
        }
        Ok(false) => not_found("id", &id).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// The chat request a Responses request means (its conversation after `history`, a kept
/// response's), and what its answer repeats back.
fn to_chat(mut body: Fields, history: Vec<Value>) -> Result<(Fields, Echo), ApiError> {
    // What needs state this router does not keep, or a tool OpenAI hosts, cannot be served.
    for (field, why) in [
        (
            "conversation",
            "conversations are not stored: send the whole conversation in input",
        ),
        ("prompt", "stored prompt templates are not served"),
        ("max_tool_calls", "a limit on tool calls is not served"),
    ] {
        if body.get(field).is_some_and(|v| !v.is_null()) {
            return Err(invalid(field, format!("{field} is not supported: {why}")));
        }
    }
    if body
        .get("n")
        .is_some_and(|v| !v.is_null() && v.as_u64() != Some(1))
    {
        return Err(invalid(
            "n",
            "n is not a Responses field: a response has one output",
        ));
    }
    if body
        .get("background")
        .is_some_and(|v| v == &Value::Bool(true))
    {
        return Err(invalid(
            "background",
            "background is not supported: responses are not stored; stream instead",
        ));
    }
    let logprobs = output_logprobs(&body)?;
    match body.get("truncation").and_then(Value::as_str) {
        None | Some("disabled" | "auto") => {}
        Some(other) => {
            return Err(invalid(
                "truncation",
                format!("truncation must be \"disabled\" or \"auto\", got {other:?}"),
            ));
        }
    }
    let mut chat = Fields::new();
    let instructions = take_string(&mut body, "instructions")?;
    // A kept response's instructions are not inherited: the conversation is.
    let mut messages = history;
    match body.remove("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => input_items(items, &mut messages)?,
        None | Some(Value::Null) => return Err(invalid("input", "input is required")),
        Some(other) => {
            return Err(invalid(
                "input",
                format!("input must be a string or a list of items, got {other}"),
            ));
        }
    }
    if let Some(text) = &instructions {
        messages.insert(0, json!({"role": "system", "content": text}));
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(top) = logprobs {
        // Chat's fields for the same: the chat path reports each token's.
        chat.insert("logprobs".into(), Value::Bool(true));
        chat.insert("top_logprobs".into(), top.into());
    }
    let tools = match body.remove("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => Some(tools),
        Some(other) => {
            return Err(invalid(
                "tools",
                format!("tools must be a list, got {other}"),
            ));
        }
    };
    if let Some(tools) = &tools {
        let chat_tools = tools
            .iter()
            .map(chat_tool)
            .collect::<Result<Vec<Value>, ApiError>>()?;
        chat.insert("tools".into(), Value::Array(chat_tools));
    }
    let tool_choice = body.remove("tool_choice").filter(|v| !v.is_null());
    if let Some(choice) = &tool_choice {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    let text = body.remove("text").filter(|v| !v.is_null());
    if let Some(format) = text
        .as_ref()
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null())
        && let Some(f) = response_format(format)?
    {
        chat.insert("response_format".into(), f);
    }
    if let Some(reasoning) = body.remove("reasoning").filter(|v| !v.is_null()) {
        // Chat's `reasoning_effort` (which the template reads).
        if let Some(effort) = reasoning.get("effort").filter(|e| !e.is_null()) {
            chat.insert("reasoning_effort".into(), effort.clone());
        }
    }
    let max_output_tokens = body.remove("max_output_tokens").filter(|v| !v.is_null());
    if let Some(max) = &max_output_tokens {
        chat.insert("max_tokens".into(), max.clone());
    }
    let metadata = body.remove("metadata").filter(|v| !v.is_null());
    // Fields that change nothing of the answer, taken out.
    for field in [
        "store",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "truncation",
        "include",
        "top_logprobs",
        "background",
        "stream_options",
    ] {
        body.remove(field);
    }
    let echo = Echo {
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        instructions,
        max_output_tokens,
        temperature: body.get("temperature").cloned().filter(|v| !v.is_null()),
        top_p: body.get("top_p").cloned().filter(|v| !v.is_null()),
        parallel_tool_calls: body
            .get("parallel_tool_calls")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        tool_choice: tool_choice.unwrap_or_else(|| json!("auto")),
        tools: tools.map_or(Value::Array(Vec::new()), Value::Array),
        text: text.unwrap_or_else(|| json!({"format": {"type": "text"}})),
        metadata: metadata.unwrap_or_else(|| Value::Object(Fields::new())),
        top_logprobs: logprobs,
        conversation: Vec::new(),
        store: None,
    };
    // The rest (model, temperature, top_p, stream, parallel_tool_calls, the sampling
    // extensions) means the same to chat, which refuses by name what it does not serve.
    chat.extend(body);
    Ok((chat, echo))
}

/// What a request's `include` and `top_logprobs` ask of the output text's log probabilities:
/// `Some(alternatives)` where they are wanted. `message.output_text.logprobs` asks for them,
/// and so does asking for alternatives (they come with them); reasoning is answered in the
/// clear, so there is no encrypted form to include (clients that keep no state, Codex among
/// them, ask for it and send the items back, which are read as they came); other extra
/// output (hosted tools' results, images) is not served.
fn output_logprobs(body: &Fields) -> Result<Option<u32>, ApiError> {
    const LOGPROBS: &str = "message.output_text.logprobs";
    const ENCRYPTED_REASONING: &str = "reasoning.encrypted_content";
    use dolphin_proto::sampling::MAX_TOP_LOGPROBS;
    let asked = match body.get("include") {
        None | Some(Value::Null) => false,
        Some(Value::Array(asked))
            if asked
                .iter()
                .all(|a| matches!(a.as_str(), Some(LOGPROBS | ENCRYPTED_REASONING))) =>
        {
            asked.iter().any(|a| a == LOGPROBS)
        }
        Some(other) => {
            return Err(invalid(
                "include",
                format!(
                    "include may name \"{LOGPROBS}\" and \"{ENCRYPTED_REASONING}\" only (no other extra output is served), got {other}"
                ),
            ));
        }
    };
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|k| u32::try_from(k).ok())
            .filter(|&k| k <= MAX_TOP_LOGPROBS)
            .ok_or_else(|| {
                invalid(
                    "top_logprobs",
                    format!(
                        "top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {v}"
                    ),
                )
            })?,
    };
    Ok((asked || top > 0).then_some(top))
}

fn take_string(body: &mut Fields, field: &'static str) -> Result<Option<String>, ApiError> {
    match body.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(
            field,
            format!("{field} must be a string, got {other}"),
        )),
    }
}

/// `input`'s items as chat messages: messages (a `developer` one as `system`), the calls an
/// earlier answer made (joined into one assistant message) and their outputs (`tool`
/// messages); an earlier answer's reasoning becomes the `reasoning_content` of the assistant
/// turn after it (which reasoning models' templates write back where they keep it).
fn input_items(items: Vec<Value>, messages: &mut Vec<Value>) -> Result<(), ApiError> {
    // Reasoning waiting for the assistant turn it led to.
    let mut thought: Option<String> = None;
    for item in items {
        let kind = item.get("type").and_then(Value::as_str);
        let thought_before = thought.take();
        match kind {
            None | Some("message") => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer") => "system",
                    Some(role @ ("system" | "user" | "assistant")) => role,
                    other => {
                        return Err(invalid(
                            "input",
                            format!(
                                "an input message's role must be user, assistant, system or developer, got {other:?}"
                            ),
                        ));
                    }
                };
                let content = content_text(item.get("content"))?;
                let mut message = json!({"role": role, "content": content});
                if let Some(t) = thought_before.filter(|_| role == "assistant") {
                    message["reasoning_content"] = Value::String(t);
                }
                messages.push(message);
            }
            Some("function_call") => {
                let field = |name: &str| item.get(name).and_then(Value::as_str);
                let (Some(call_id), Some(name)) = (field("call_id"), field("name")) else {
                    return Err(invalid(
                        "input",
                        "a function_call item needs call_id and name",
                    ));
                };
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": field("arguments").unwrap_or("{}")}});
                // Calls made together are one assistant turn.
                match messages.last_mut() {
                    Some(last)
                        if last["role"] == "assistant"
                            && last.get("tool_calls").is_some_and(Value::is_array) =>
                    {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => {
                        let mut turn =
                            json!({"role": "assistant", "content": null, "tool_calls": [call]});
                        if let Some(t) = thought_before {
                            turn["reasoning_content"] = Value::String(t);
                        }
                        messages.push(turn);
                    }
                }
            }
            Some("function_call_output") => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(invalid(
                        "input",
                        "a function_call_output item needs call_id",
                    ));
                };
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => content_text(other)?,
                };
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            Some("reasoning") => {
                // Its text (open models' `reasoning_text` content), else its summary.
                let texts = |key: &str| -> Vec<String> {
                    item.get(key)
                        .and_then(Value::as_array)
                        .map(|parts| {
                            parts
                                .iter()
                                .filter_map(|p| p.get("text").and_then(Value::as_str))
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let mut parts = texts("content");
                if parts.is_empty() {
                    parts = texts("summary");
                }
                let mut all: Vec<String> = thought_before.into_iter().collect();
                all.extend(parts);
                thought = (!all.is_empty()).then(|| all.join("\n"));
            }
            Some(other) => {
                return Err(invalid(
                    "input",
                    format!(
                        "input items of type {other:?} are not supported (message, function_call, function_call_output and reasoning are)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A message's content as text: a string, or its text parts joined.
fn content_text(content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text" | "reasoning_text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or_default());
                    }
                    other => {
                        return Err(invalid(
                            "input",
                            format!(
                                "content parts of type {other:?} are not supported (text only)"
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(invalid(
            "input",
            format!("a message's content must be text or a list of parts, got {other}"),
        )),
    }
}

/// A Responses function tool (`{"type": "function", "name", "description", "parameters"}`)
/// in chat's shape; the tools OpenAI hosts are refused.
fn chat_tool(tool: &Value) -> Result<Value, ApiError> {
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {
            let mut function = Fields::new();
            for key in ["name", "description", "parameters", "strict"] {
                if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                    function.insert(key.into(), v.clone());
                }
            }
            Ok(json!({"type": "function", "function": function}))
        }
        other => Err(invalid(
            "tools",
            format!("tools of type {other:?} are not supported (function tools are)"),
        )),
    }
}

/// `tool_choice` in chat's shape: the same words, or `{"type": "function", "name"}` as chat's
/// named function.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").cloned().unwrap_or(Value::Null);
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        other => Err(invalid(
            "tool_choice",
            format!(
                "tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": ...}}, got {other}"
            ),
        )),
    }
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn response_format(format: &Value) -> Result<Option<Value>, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Fields::new();
            for key in ["name", "description", "schema", "strict"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        other => Err(invalid(
            "text",
            format!(
                "text.format.type must be \"text\", \"json_object\" or \"json_schema\", got {other:?}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(body: Value) -> Result<Value, ApiError> {
        let Value::Object(body) = body else {
            panic!("an object")
        };
        to_chat(body, Vec::new()).map(|(chat, _)| Value::Object(chat))
    }

    #[test]
    fn a_conversation_with_calls_becomes_chat_messages() {
        let chat = chat_of(json!({
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Look it up."}]},
                {"type": "function_call", "call_id": "call_1", "name": "wx", "arguments": "{\"c\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
            ],
            "tools": [{"type": "function", "name": "wx", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "wx"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "max_output_tokens": 20,
            "reasoning": {"effort": "low"},
            "store": true,
            "temperature": 0,
        }))
        .expect("converts");
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "reasoning_content": "Look it up.",
                 "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "wx", "arguments": "{\"c\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
            ])
        );
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "wx", "parameters": {"type": "object"}, "strict": true}}])
        );
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "wx"}})
        );
        assert_eq!(
            chat["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}})
        );
        assert_eq!(chat["max_tokens"], 20);
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["temperature"], 0);
        assert!(chat.get("store").is_none() && chat.get("input").is_none());
    }

    #[test]
    fn what_needs_storage_or_hosted_tools_is_refused_by_name() {
        for (body, field) in [
            (json!({"input": "hi", "background": true}), "background"),
            (
                json!({"input": "hi", "include": ["file_search_call.results"]}),
                "include",
            ),
            (json!({"input": "hi", "top_logprobs": 21}), "top_logprobs"),
            (json!({"input": "hi", "top_logprobs": -1}), "top_logprobs"),
            (
                json!({"input": "hi", "tools": [{"type": "web_search"}]}),
                "tools",
            ),
            (json!({"input": "hi", "tool_choice": 3}), "tool_choice"),
            (json!({"input": [{"type": "input_image"}]}), "input"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input",
            ),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input",
            ),
            (json!({}), "input"),
            (
                json!({"input": "hi", "text": {"format": {"type": "xml"}}}),
                "text",
            ),
            (json!({"input": "hi", "instructions": 3}), "instructions"),
        ] {
            let err = chat_of(body.clone()).expect_err("refused");
            assert_eq!(err.param, Some(field), "{body}: {}", err.message);
        }
        // What asks for nothing is accepted.
        let chat = chat_of(
            json!({"input": "hi", "include": ["reasoning.encrypted_content"], "background": false,
            "truncation": "disabled"}),
        )
        .expect("accepted");
        assert_eq!(chat["messages"], json!([{"role": "user", "content": "hi"}]));
        assert!(chat.get("logprobs").is_none() && chat.get("top_logprobs").is_none());
    }

    #[test]
    fn output_logprobs_become_chats() {
        for (body, top) in [
            (
                json!({"input": "hi", "include": ["message.output_text.logprobs"]}),
                Some(0),
            ),
            (
                json!({"input": "hi", "include": ["reasoning.encrypted_content", "message.output_text.logprobs"], "top_logprobs": 3}),
                Some(3),
            ),
            // Alternatives come with the log probabilities.
            (json!({"input": "hi", "top_logprobs": 2}), Some(2)),
            (json!({"input": "hi", "top_logprobs": 0}), None),
        ] {
            let chat = chat_of(body.clone()).expect("accepted");
            match top {
                Some(top) => {
                    assert_eq!(chat["logprobs"], true, "{body}");
                    assert_eq!(chat["top_logprobs"], top, "{body}");
                }
                None => assert!(chat.get("logprobs").is_none(), "{body}"),
            }
        }
    }
}

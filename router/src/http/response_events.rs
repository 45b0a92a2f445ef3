//! A Responses API answer ([`super::responses`]): the output items (the model's reasoning, its
//! message, each function call) built as the answer streams, sent whole or as the typed
//! server-sent events OpenAI's SDKs read (`response.created`, `response.output_item.added`,
//! `response.output_text.delta`, ..., `response.completed`), each numbered, with a comment
//! after every [`KEEP_ALIVE`](super::sse::KEEP_ALIVE) of silence.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::{Value, json};

use super::error::ApiError;
use super::logprobs;
use super::types::ChatTokenLogprob;
use crate::answer::{AnswerReader, Read, Readers};
use crate::stream::{Delta, ResponseStream};
use crate::tokenizer::Tokenizer;
use crate::tools::{CallPart, Mode};
use dolphin_proto::v1::{self, FinishReason};

/// What a response repeats of its request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Echo {
    pub(crate) model: String,
    pub(crate) instructions: Option<String>,
    pub(crate) max_output_tokens: Option<Value>,
    pub(crate) temperature: Option<Value>,
    pub(crate) top_p: Option<Value>,
    pub(crate) parallel_tool_calls: bool,
    pub(crate) tool_choice: Value,
    pub(crate) tools: Value,
    pub(crate) text: Value,
    pub(crate) metadata: Value,
    /// The alternatives asked for each output token, where log probabilities were asked.
    pub(crate) top_logprobs: Option<u32>,
    /// The conversation as chat messages, without instructions (what a kept response keeps).
    pub(crate) conversation: Vec<Value>,
    /// Where the finished response is kept (`None`: not kept).
    pub(crate) store: Option<super::response_store::ResponseStore>,
}

/// The output item being written.
#[derive(Debug)]
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
        logprobs: Vec<ChatTokenLogprob>,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// One response's output and events.
pub(crate) struct Events {
    id: String,
    created: u64,
    echo: Echo,
    reader: Option<AnswerReader>,
    /// Finished output items.
    items: Vec<Value>,
    open: Option<Open>,
    /// The next event's `sequence_number`.
    seq: u64,
    /// Events not yet sent.
    out: VecDeque<Value>,
    /// The model the response names.
    model: String,
    /// Whether events are kept (streaming); a whole answer builds its items only.
    emit: bool,
    /// Names the tokens of log probabilities, where the request asked for them.
    logprobs: Option<Arc<dyn Tokenizer>>,
    /// Log probabilities of tokens whose text has not come out yet (held back by the
    /// answer's reader); they go with the output text the tokens become, and are dropped
    /// where the tokens become reasoning or a call instead.
    pending: Vec<ChatTokenLogprob>,
}

impl Events {
    pub(crate) fn new(
        id: String,
        created: u64,
        echo: Echo,
        tools: &Mode,
        readers: Readers,
    ) -> Self {
        Self {
            id,
            created,
            model: echo.model.clone(),
            echo,
            reader: AnswerReader::new(tools, readers),
            items: Vec::new(),
            open: None,
            seq: 0,
            out: VecDeque::new(),
            emit: false,
            logprobs: None,
            pending: Vec::new(),
        }
    }

    /// Reports the output text's log probabilities, `tokenizer` naming their tokens.
    pub(crate) fn with_logprobs(mut self, tokenizer: Option<Arc<dyn Tokenizer>>) -> Self {
        self.logprobs = tokenizer;
        self
    }

    /// The whole response, once the answer ended.
    pub(crate) async fn whole(mut self, mut rs: ResponseStream) -> Result<Response, ApiError> {
        while let Some(item) = rs.next().await {
            let d = item?;
            let finish = d.finish.clone();
            self.absorb(&d);
            if let Some(f) = finish {
                let mut body = self.response(Some((f.reason, &f.usage)));
                self.keep(&mut body).await;
                // The buffer grows past this where the answer is longer.
                return Ok(super::completions::json_response(&body, 2048));
            }
        }
        Err(ApiError::from(rs.truncated()))
    }

    /// The response as server-sent events.
    pub(crate) fn stream(mut self, rs: ResponseStream) -> Response {
        self.emit = true;
        let first = self.response(None);
        self.event("response.created", json!({"response": first}));
        let in_progress = self.response(None);
        self.event("response.in_progress", json!({"response": in_progress}));
        let events = futures::stream::unfold((self, Some(rs)), |(mut ev, rs)| async move {
            let mut rs = rs?;
            loop {
                if let Some(frame) = ev.frame() {
                    return Some((Ok::<_, std::convert::Infallible>(frame), (ev, Some(rs))));
                }
                // A comment while nothing else goes out, as the chat stream sends, so that
                // proxies keep a silent stream open.
                let Ok(next) = tokio::time::timeout(super::sse::KEEP_ALIVE, rs.next()).await else {
                    return Some((Ok(Bytes::from_static(b":\n\n")), (ev, Some(rs))));
                };
                match next {
                    Some(Ok(d)) => {
                        let finish = d.finish.clone();
                        ev.absorb(&d);
                        if let Some(f) = finish {
                            ev.finish(f.reason, &f.usage).await;
                            let frame = ev.frame()?;
                            return Some((Ok(frame), (ev, None)));
                        }
                    }
                    Some(Err(e)) => {
                        let e = ApiError::from(e);
                        ev.event(
                            "error",
                            json!({"code": e.code, "message": e.message, "param": e.param}),
                        );
                        let frame = ev.frame()?;
                        return Some((Ok(frame), (ev, None)));
                    }
                    None => {
                        ev.event(
                            "error",
                            json!({"code": null, "message": "the answer ended early", "param": null}),
                        );
                        let frame = ev.frame()?;
                        return Some((Ok(frame), (ev, None)));
                    }
                }
            }
        });
        super::sse::event_stream(Body::from_stream(events))
    }

    /// The events queued, as one frame (`event:` and `data:` lines each).
    fn frame(&mut self) -> Option<Bytes> {
        let frame = super::sse::typed_frame(
            self.out
                .iter()
                .map(|e| (e["type"].as_str().unwrap_or_default(), e)),
        );
        self.out.clear();
        frame
    }

    /// Queues an event of `kind` with `fields`, numbered.
    fn event(&mut self, kind: &str, fields: Value) {
        if !self.emit {
            return;
        }
        let mut e = json!({"type": kind, "sequence_number": self.seq});
        if let (Some(e), Value::Object(fields)) = (e.as_object_mut(), fields) {
            e.extend(fields);
        }
        self.seq += 1;
        self.out.push_back(e);
    }

    /// Reads a delta of the answer into the output items: message by message of the worker's
    /// where it joined several and log probabilities are reported, so that each piece of text
    /// takes the log probabilities of the tokens that brought it out.
    fn absorb(&mut self, d: &Delta) {
        let end = d.finish.is_some();
        if self.logprobs.is_none() || d.joins.is_empty() {
            self.absorb_piece(&d.text, &d.token_ids, &d.logprobs, end);
            return;
        }
        let whole = (d.token_ids.len(), d.text.len());
        let last = d.joins.len();
        let (mut tokens, mut text) = (0, 0);
        for (i, (t, x)) in d.joins.iter().copied().chain([whole]).enumerate() {
            let ids = d.token_ids.get(tokens..t).unwrap_or_default();
            let lps = d.logprobs.get(tokens..t).unwrap_or_default();
            let piece = d.text.get(text..x).unwrap_or_default();
            self.absorb_piece(piece, ids, lps, end && i == last);
            (tokens, text) = (t, x);
        }
    }

    /// Reads `text`, which `ids` brought out, into the output items (`end`: the answer's last).
    fn absorb_piece(&mut self, text: &str, ids: &[u32], lps: &[v1::TokenLogprobs], end: bool) {
        if let Some(tok) = &self.logprobs {
            self.pending
                .extend(logprobs::chat(tok.as_ref(), ids, lps).content);
        }
        let read = match &mut self.reader {
            Some(reader) => reader.read(text, end),
            None => Read {
                text: text.to_owned(),
                ..Read::default()
            },
        };
        if !read.reasoning.is_empty() {
            self.reasoning(&read.reasoning);
        }
        if !read.text.is_empty() {
            self.text(&read.text);
        } else if !read.reasoning.is_empty() || !read.calls.is_empty() {
            // The delta's tokens were reasoning or a call.
            self.pending.clear();
        }
        for part in read.calls {
            self.call(part);
        }
    }

    fn output_index(&self) -> usize {
        self.items.len()
    }

    fn reasoning(&mut self, delta: &str) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close();
            let id = format!("rs_{}", item_suffix(&self.id, self.items.len()));
            self.event(
                "response.output_item.added",
                json!({"output_index": self.output_index(),
                    "item": {"type": "reasoning", "id": id, "summary": [], "content": []}}),
            );
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.output_index();
        if let Some(Open::Reasoning { id, text }) = &mut self.open {
            text.push_str(delta);
            let id = id.clone();
            self.event(
                "response.reasoning_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
            );
        }
    }

    fn text(&mut self, delta: &str) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close();
            let id = format!("msg_{}", item_suffix(&self.id, self.items.len()));
            let index = self.output_index();
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": {"type": "message", "id": id,
                    "status": "in_progress", "role": "assistant", "content": []}}),
            );
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": [],
                        "logprobs": []}}),
            );
            self.open = Some(Open::Message {
                id,
                text: String::new(),
                logprobs: Vec::new(),
            });
        }
        let index = self.output_index();
        let these = std::mem::take(&mut self.pending);
        if let Some(Open::Message { id, text, logprobs }) = &mut self.open {
            text.push_str(delta);
            let id = id.clone();
            let event = json!({"item_id": id, "output_index": index, "content_index": 0,
                "delta": delta, "logprobs": these});
            logprobs.extend(these);
            self.event("response.output_text.delta", event);
        }
    }

    fn call(&mut self, part: CallPart) {
        if let (Some(call_id), Some(name)) = (part.id, part.name) {
            self.close();
            let id = format!("fc_{}", call_id.strip_prefix("call_").unwrap_or(&call_id));
            self.event(
                "response.output_item.added",
                json!({"output_index": self.output_index(), "item": {"type": "function_call",
                    "id": id, "call_id": call_id, "name": name, "arguments": "",
                    "status": "in_progress"}}),
            );
            self.open = Some(Open::Call {
                id,
                call_id,
                name,
                arguments: String::new(),
            });
        }
        if part.arguments.is_empty() {
            return;
        }
        let index = self.output_index();
        if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
            arguments.push_str(&part.arguments);
            let id = id.clone();
            self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": part.arguments}),
            );
        }
    }

    /// Ends the open item: its `done` events, and it joins the output.
    fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.output_index();
        let item = match open {
            Open::Reasoning { id, text } => {
                self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                json!({"type": "reasoning", "id": id, "summary": [],
                    "content": [{"type": "reasoning_text", "text": text}]})
            }
            Open::Message {
                id,
                text,
                mut logprobs,
            } => {
                // Tokens whose text never came out (a stop string's) end the message's.
                logprobs.append(&mut self.pending);
                let part = json!({"type": "output_text", "text": text, "annotations": [],
                    "logprobs": logprobs});
                self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "text": text, "logprobs": logprobs}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                json!({"type": "message", "id": id, "status": "completed", "role": "assistant",
                    "content": [part]})
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments}),
                );
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
                    "arguments": arguments, "status": "completed"})
            }
        };
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.items.push(item);
    }

    /// The answer ended: the last item closed, and the whole response as the last event.
    async fn finish(&mut self, reason: FinishReason, usage: &v1::Usage) {
        self.close();
        let mut response = self.response(Some((reason, usage)));
        self.keep(&mut response).await;
        let kind = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(kind, json!({"response": response}));
    }

    /// The response object: `ended` with how and the token counts once the answer ended
    /// (its items closed), else in progress.
    fn response(&mut self, ended: Option<(FinishReason, &v1::Usage)>) -> Value {
        if ended.is_some() {
            self.close();
        }
        let e = &self.echo;
        let (status, incomplete, usage) = match ended {
            None => ("in_progress", Value::Null, Value::Null),
            Some((reason, usage)) => {
                // Calls that were read whole complete the answer, as chat's `tool_calls`.
                let calls = self
                    .reader
                    .as_ref()
                    .is_some_and(AnswerReader::ends_in_calls);
                let cut = reason == FinishReason::Length && !calls;
                (
                    if cut { "incomplete" } else { "completed" },
                    if cut {
                        json!({"reason": "max_output_tokens"})
                    } else {
                        Value::Null
                    },
                    json!({
                        "input_tokens": usage.prompt_tokens,
                        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                        "output_tokens": usage.completion_tokens,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                    }),
                )
            }
        };
        let output = match ended {
            Some(_) => self.items.clone(),
            None => Vec::new(),
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "temperature": e.temperature,
            "top_p": e.top_p,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "text": e.text,
            "truncation": "disabled",
            "store": e.store.is_some(),
            "metadata": e.metadata,
            "top_logprobs": e.top_logprobs,
            "usage": usage,
        })
    }

    /// Keeps the finished `response` where the request asked (`store`), with its conversation
    /// and its output as the chat messages a later response continues from, before the client
    /// learns its id (so that any replica finds it). Where the store fails, the answer still
    /// goes out, saying `store: false`.
    async fn keep(&mut self, response: &mut Value) {
        let Some(store) = self.echo.store.take() else {
            return;
        };
        let mut conversation = std::mem::take(&mut self.echo.conversation);
        conversation.extend(as_messages(&self.items));
        let stored = super::response_store::Stored {
            conversation,
            response: response.clone(),
        };
        let outcome = match store.put(self.id.clone(), stored).await {
            Ok(()) => "kept",
            Err(e) => {
                tracing::warn!(id = %self.id, error = %e, "response not kept");
                response["store"] = Value::Bool(false);
                "failed"
            }
        };
        metrics::counter!(crate::metrics::RESPONSES_STORED_TOTAL, "outcome" => outcome)
            .increment(1);
    }
}

/// Output items as chat messages: the message's text and the calls made with it in one
/// assistant turn; reasoning left out, as chat templates drop earlier thinking.
fn as_messages(items: &[Value]) -> Vec<Value> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for item in items {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    text.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            Some("function_call") => calls.push(json!({
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })),
            _ => {}
        }
    }
    if text.is_empty() && calls.is_empty() {
        return Vec::new();
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    vec![message]
}

/// An item id's part after its prefix: the response's id less `resp_`, and the item's place.
fn item_suffix(response_id: &str, index: usize) -> String {
    format!(
        "{}_{index}",
        response_id.strip_prefix("resp_").unwrap_or(response_id)
    )
}

//! A Messages API answer ([`super::messages`]): its content blocks (the model's thinking, its
//! text, each tool call) built as the answer streams, sent whole or as Anthropic's events
//! (`message_start`, `content_block_start`, `content_block_delta`, `content_block_stop`,
//! `message_delta`, `message_stop`), with a `ping` after every
//! [`KEEP_ALIVE`](super::sse::KEEP_ALIVE) of silence.

use std::collections::VecDeque;

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::{Value, json};

use super::error::ApiError;
use crate::answer::{AnswerReader, Read, Readers};
use crate::stream::{Delta, Finish, ResponseStream};
use crate::tools::{CallPart, Mode};
use dolphin_proto::v1::FinishReason;

/// The block being written.
#[derive(Debug)]
enum Open {
    /// A `thinking` block (`thinking`), else a `text` one, and its text so far.
    Prose { thinking: bool, text: String },
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
}

/// One answer's content blocks and events.
pub(crate) struct Blocks {
    id: String,
    /// The model the message names.
    model: String,
    reader: Option<AnswerReader>,
    /// Finished blocks.
    done: Vec<Value>,
    open: Option<Open>,
    /// Events not yet sent.
    out: VecDeque<(&'static str, Value)>,
    /// Whether events are kept (streaming); a whole answer builds its blocks only.
    emit: bool,
}

impl Blocks {
    pub(crate) fn new(id: String, model: String, tools: &Mode, readers: Readers) -> Self {
        Self {
            id,
            model,
            reader: AnswerReader::new(tools, readers),
            done: Vec::new(),
            open: None,
            out: VecDeque::new(),
            emit: false,
        }
    }

    /// The whole message, once the answer ended.
    pub(crate) async fn whole(mut self, mut rs: ResponseStream) -> Result<Response, ApiError> {
        while let Some(item) = rs.next().await {
            let d = item?;
            self.absorb(&d);
            if let Some(f) = &d.finish {
                self.close();
                let body = self.message(Some(f), f.usage.prompt_tokens);
                return Ok(super::completions::json_response(&body, 2048));
            }
        }
        Err(ApiError::from(rs.truncated()))
    }

    /// The message as Anthropic's server-sent events.
    pub(crate) fn stream(mut self, rs: ResponseStream) -> Response {
        self.emit = true;
        let start = self.message(None, rs.prompt_tokens().len() as u32);
        self.event("message_start", json!({"message": start}));
        let events = futures::stream::unfold((self, Some(rs)), |(mut b, rs)| async move {
            let mut rs = rs?;
            loop {
                if let Some(frame) = b.frame() {
                    return Some((Ok::<_, std::convert::Infallible>(frame), (b, Some(rs))));
                }
                let Ok(next) = tokio::time::timeout(super::sse::KEEP_ALIVE, rs.next()).await else {
                    b.event("ping", json!({}));
                    continue;
                };
                match next {
                    Some(Ok(d)) => {
                        b.absorb(&d);
                        if let Some(f) = &d.finish {
                            b.finish(f);
                            let frame = b.frame()?;
                            return Some((Ok(frame), (b, None)));
                        }
                    }
                    Some(Err(e)) => {
                        b.error(ApiError::from(e));
                        let frame = b.frame()?;
                        return Some((Ok(frame), (b, None)));
                    }
                    None => {
                        b.error(ApiError::from(rs.truncated()));
                        let frame = b.frame()?;
                        return Some((Ok(frame), (b, None)));
                    }
                }
            }
        });
        super::sse::event_stream(Body::from_stream(events))
    }

    /// The events queued, as one frame (`event:` and `data:` lines each).
    fn frame(&mut self) -> Option<Bytes> {
        let frame = super::sse::typed_frame(self.out.iter().map(|(kind, e)| (*kind, e)));
        self.out.clear();
        frame
    }

    /// Queues an event of `kind` with `fields` (and `type`).
    fn event(&mut self, kind: &'static str, fields: Value) {
        if !self.emit {
            return;
        }
        let mut e = json!({"type": kind});
        if let (Some(e), Value::Object(fields)) = (e.as_object_mut(), fields) {
            e.extend(fields);
        }
        self.out.push_back((kind, e));
    }

    /// An error ends the stream (in Anthropic's shape).
    fn error(&mut self, e: ApiError) {
        let body = super::messages::error_json(&e);
        self.event("error", body);
    }

    /// Reads a delta of the answer into the blocks.
    fn absorb(&mut self, d: &Delta) {
        let end = d.finish.is_some();
        let read = match &mut self.reader {
            Some(reader) => reader.read(&d.text, end),
            None => Read {
                text: d.text.clone(),
                ..Read::default()
            },
        };
        if !read.reasoning.is_empty() {
            self.prose(true, &read.reasoning);
        }
        if !read.text.is_empty() {
            self.prose(false, &read.text);
        }
        for part in read.calls {
            self.call(part);
        }
    }

    fn index(&self) -> usize {
        self.done.len()
    }

    /// More thinking (`thinking`) or text: into the open block of that kind, else a new one.
    fn prose(&mut self, thinking: bool, delta: &str) {
        let (kind, delta_kind) = if thinking {
            ("thinking", "thinking_delta")
        } else {
            ("text", "text_delta")
        };
        if !matches!(&self.open, Some(Open::Prose { thinking: t, .. }) if *t == thinking) {
            self.close();
            let mut block = json!({"type": kind, kind: ""});
            if thinking {
                block["signature"] = json!("");
            }
            let index = self.index();
            self.event(
                "content_block_start",
                json!({"index": index, "content_block": block}),
            );
            self.open = Some(Open::Prose {
                thinking,
                text: String::new(),
            });
        }
        if let Some(Open::Prose { text, .. }) = &mut self.open {
            text.push_str(delta);
        }
        let index = self.index();
        self.event(
            "content_block_delta",
            json!({"index": index, "delta": {"type": delta_kind, kind: delta}}),
        );
    }

    fn call(&mut self, part: CallPart) {
        if let (Some(call_id), Some(name)) = (part.id, part.name) {
            self.close();
            let id = format!(
                "toolu_{}",
                call_id.strip_prefix("call_").unwrap_or(&call_id)
            );
            let index = self.index();
            self.event(
                "content_block_start",
                json!({"index": index, "content_block": {"type": "tool_use", "id": id,
                    "name": name, "input": {}}}),
            );
            self.open = Some(Open::ToolUse {
                id,
                name,
                input: String::new(),
            });
        }
        if part.arguments.is_empty() {
            return;
        }
        let index = self.index();
        if let Some(Open::ToolUse { input, .. }) = &mut self.open {
            input.push_str(&part.arguments);
            self.event(
                "content_block_delta",
                json!({"index": index, "delta": {"type": "input_json_delta",
                    "partial_json": part.arguments}}),
            );
        }
    }

    /// Ends the open block: its stop event, and it joins the content.
    fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.index();
        let block = match open {
            Open::Prose {
                thinking: true,
                text,
            } => {
                // No signature: the thinking is the model's own, in the clear.
                self.event(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "signature_delta", "signature": ""}}),
                );
                json!({"type": "thinking", "thinking": text, "signature": ""})
            }
            Open::Prose { text, .. } => json!({"type": "text", "text": text}),
            Open::ToolUse { id, name, input } => {
                // Arguments that do not read as an object (a call cut off) are given as read.
                let input = match serde_json::from_str::<Value>(&input) {
                    Ok(v @ Value::Object(_)) => v,
                    _ if input.trim().is_empty() => json!({}),
                    _ => json!({"_raw": input}),
                };
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
        };
        self.event("content_block_stop", json!({"index": index}));
        self.done.push(block);
    }

    /// The answer ended: the last block closed, then `message_delta` and `message_stop`.
    fn finish(&mut self, f: &Finish) {
        self.close();
        let (reason, sequence) = self.stop_reason(f);
        let usage = usage(Some(f), f.usage.prompt_tokens);
        self.event(
            "message_delta",
            json!({"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}),
        );
        self.event("message_stop", json!({}));
    }

    /// Anthropic's `stop_reason` and `stop_sequence` for how the answer ended.
    fn stop_reason(&self, f: &Finish) -> (&'static str, Option<String>) {
        let calls = self
            .reader
            .as_ref()
            .is_some_and(AnswerReader::ends_in_calls);
        let forced_call = self.reader.as_ref().is_some_and(AnswerReader::made_calls);
        match f.reason {
            _ if calls => ("tool_use", None),
            FinishReason::Length => ("max_tokens", None),
            // Unlike OpenAI's finish reason, Anthropic's says `tool_use` for a forced call too.
            _ if forced_call => ("tool_use", None),
            FinishReason::Stop if f.stop_sequence.is_some() => {
                ("stop_sequence", f.stop_sequence.clone())
            }
            _ => ("end_turn", None),
        }
    }

    /// The message object: the content and how it ended once `ended`, else as it starts.
    fn message(&self, ended: Option<&Finish>, prompt_tokens: u32) -> Value {
        let (reason, sequence) = match ended {
            None => (None, None),
            Some(f) => {
                let (reason, sequence) = self.stop_reason(f);
                (Some(reason), sequence)
            }
        };
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": if ended.is_some() { Value::Array(self.done.clone()) } else { json!([]) },
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(ended, prompt_tokens),
        })
    }
}

/// Anthropic's usage: the prompt's tokens read from a prefix cache apart from the others
/// (known once the answer ended; before, all count as input).
fn usage(ended: Option<&Finish>, prompt_tokens: u32) -> Value {
    let (output, cached) = ended.map_or((0, 0), |f| {
        (
            f.usage.completion_tokens,
            f.usage.cached_tokens.min(prompt_tokens),
        )
    });
    json!({
        "input_tokens": prompt_tokens - cached,
        "output_tokens": output,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thinking and text each open a block of their kind once, grow it by deltas of their
    /// kind, and close it (a thinking block with its empty signature) when the other begins.
    #[test]
    fn thinking_then_text_make_two_blocks() {
        let mut b = Blocks::new("msg_1".into(), "m".into(), &Mode::Text, Readers::default());
        b.emit = true;
        b.prose(true, "Hm, ");
        b.prose(true, "rain.");
        b.prose(false, "Take an umbrella.");
        b.close();
        assert_eq!(
            b.done,
            vec![
                json!({"type": "thinking", "thinking": "Hm, rain.", "signature": ""}),
                json!({"type": "text", "text": "Take an umbrella."}),
            ]
        );
        let events: Vec<(&str, Value)> = b.out.drain(..).collect();
        let kinds: Vec<&str> = events
            .iter()
            .map(|(k, e)| match k {
                &"content_block_delta" => e["delta"]["type"].as_str().unwrap_or_default(),
                k => k,
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start",
                "thinking_delta",
                "thinking_delta",
                "signature_delta",
                "content_block_stop",
                "content_block_start",
                "text_delta",
                "content_block_stop",
            ]
        );
        assert_eq!(
            events[0].1["content_block"],
            json!({"type": "thinking", "thinking": "", "signature": ""})
        );
        assert_eq!(events[5].1["index"], 1);
        assert_eq!(
            events[6].1["delta"],
            json!({"type": "text_delta", "text": "Take an umbrella."})
        );
    }
}

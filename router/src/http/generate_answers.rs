//! SGLang's `/generate` answers (see `generate.rs`): each generation's text, ids and
//! `meta_info` as they grow, whole or as SGLang's stream of events holding everything so far.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use dolphin_proto::v1::{self, FinishReason};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::generate::LogprobAsk;
use crate::stream::{Delta, Finish, ResponseStream};
use crate::tokenizer::Tokenizer;

type Fields = Map<String, Value>;

/// One generation's answer as it grows.
struct Answer {
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<v1::TokenLogprobs>,
    prompt_logprobs: Vec<v1::TokenLogprobs>,
    /// `max_new_tokens: 0`: the output is not reported.
    prefill_only: bool,
}

impl Answer {
    fn new(prefill_only: bool) -> Self {
        Self {
            text: String::new(),
            ids: Vec::new(),
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            prefill_only,
        }
    }

    fn absorb(&mut self, d: &Delta) {
        self.prompt_logprobs
            .extend(d.prompt_logprobs.iter().cloned());
        if self.prefill_only {
            return;
        }
        self.text.push_str(&d.text);
        self.ids.extend_from_slice(&d.token_ids);
        self.logprobs.extend(d.logprobs.iter().cloned());
    }

    /// SGLang's output object: text and ids so far, and `meta_info`.
    fn object(
        &self,
        rs: &ResponseStream,
        finish: Option<&Finish>,
        ask: LogprobAsk,
        tokenizer: &dyn Tokenizer,
        started: Instant,
    ) -> Value {
        let prompt = rs.prompt_tokens();
        let mut meta = Fields::new();
        meta.insert("id".into(), json!(rs.request_id()));
        let reason = match finish {
            None => Value::Null,
            Some(_) if self.prefill_only => json!({"type": "length", "length": 0}),
            Some(f) => finish_reason(f, &self.ids),
        };
        meta.insert("finish_reason".into(), reason);
        meta.insert("prompt_tokens".into(), json!(prompt.len()));
        let generated = match finish {
            Some(f) if !self.prefill_only => f.usage.completion_tokens,
            _ => self.ids.len() as u32,
        };
        meta.insert("completion_tokens".into(), json!(generated));
        meta.insert(
            "cached_tokens".into(),
            json!(finish.map_or(0, |f| f.usage.cached_tokens)),
        );
        meta.insert("e2e_latency".into(), json!(started.elapsed().as_secs_f64()));
        if ask.on {
            self.logprob_fields(prompt, ask, tokenizer, &mut meta);
        }
        json!({"text": self.text, "output_ids": self.ids, "meta_info": meta})
    }

    /// SGLang's log-probability fields: the output's, and the prompt's from
    /// `logprob_start_len` (-1: its last token), the first position's being `null`.
    fn logprob_fields(
        &self,
        prompt: &[u32],
        ask: LogprobAsk,
        tokenizer: &dyn Tokenizer,
        meta: &mut Fields,
    ) {
        let name = |id: u32| {
            if ask.text {
                json!(tokenizer.decode(&[id]))
            } else {
                Value::Null
            }
        };
        let triple = |lp: Option<f32>, id: u32| json!([lp, id, name(id)]);
        let tops = |lp: Option<&v1::TokenLogprobs>| match lp {
            None => Value::Null,
            Some(lp) => Value::Array(
                lp.top_ids
                    .iter()
                    .zip(&lp.top_logprobs)
                    .map(|(&id, &p)| triple(Some(p), id))
                    .collect(),
            ),
        };
        // -1 (or past the end): the prompt's last token alone.
        let last = prompt.len().saturating_sub(1);
        let start = usize::try_from(ask.start).map_or(last, |s| s.min(last));
        // `prompt_logprobs[i]` is prompt token `i + 1`'s; the first reported position's is
        // unknown (`null`) whatever it is, as SGLang reports it.
        let at = |pos: usize| {
            pos.checked_sub(1)
                .filter(|_| pos > start)
                .and_then(|i| self.prompt_logprobs.get(i))
        };
        let input: Vec<Value> = (start..prompt.len())
            .map(|pos| triple(at(pos).map(|lp| lp.logprob), prompt[pos]))
            .collect();
        let output: Vec<Value> = self
            .ids
            .iter()
            .zip(&self.logprobs)
            .map(|(&id, lp)| triple(Some(lp.logprob), id))
            .collect();
        meta.insert("input_token_logprobs".into(), Value::Array(input));
        meta.insert("output_token_logprobs".into(), Value::Array(output));
        if ask.top > 0 {
            let input_top: Vec<Value> = (start..prompt.len()).map(|pos| tops(at(pos))).collect();
            let output_top: Vec<Value> = self.logprobs.iter().map(|lp| tops(Some(lp))).collect();
            meta.insert("input_top_logprobs".into(), Value::Array(input_top));
            meta.insert("output_top_logprobs".into(), Value::Array(output_top));
        }
    }
}

/// SGLang's `finish_reason` object.
fn finish_reason(f: &Finish, ids: &[u32]) -> Value {
    match f.reason {
        FinishReason::Length => json!({"type": "length", "length": f.usage.completion_tokens}),
        FinishReason::Stop | FinishReason::ToolCalls => match &f.stop_sequence {
            Some(s) => json!({"type": "stop", "matched": s}),
            None => json!({"type": "stop", "matched": ids.last()}),
        },
        FinishReason::Cancelled => json!({"type": "abort", "message": "cancelled"}),
        FinishReason::Error | FinishReason::Unspecified => {
            json!({"type": "abort", "message": "the generation failed"})
        }
    }
}

/// One generation's whole answer.
pub(super) async fn whole(
    mut rs: ResponseStream,
    prefill_only: bool,
    ask: LogprobAsk,
    tokenizer: Arc<dyn Tokenizer>,
    started: Instant,
) -> Result<Value, ApiError> {
    let mut answer = Answer::new(prefill_only);
    while let Some(item) = rs.next().await {
        let d = item?;
        answer.absorb(&d);
        if let Some(f) = &d.finish {
            return Ok(answer.object(&rs, Some(f), ask, tokenizer.as_ref(), started));
        }
    }
    Err(ApiError::from(rs.truncated()))
}

/// Every generation's answer streamed: an event per delta with that generation's text and
/// ids so far (tagged with its `index` where there are several), an error event if one
/// fails, then `[DONE]`; a comment after [`KEEP_ALIVE`](super::sse::KEEP_ALIVE) of silence, so
/// proxies keep a stream open through a long prefill.
pub(super) fn streamed(
    streams: Vec<(ResponseStream, bool)>,
    ask: LogprobAsk,
    tokenizer: Arc<dyn Tokenizer>,
    list: bool,
    started: Instant,
) -> Response {
    let each = streams
        .into_iter()
        .enumerate()
        .map(move |(index, (rs, only))| {
            let tokenizer = tokenizer.clone();
            futures::stream::unfold((Some(rs), Answer::new(only)), move |(rs, mut answer)| {
                let tokenizer = tokenizer.clone();
                async move {
                    let mut rs = rs?;
                    let Ok(next) = tokio::time::timeout(super::sse::KEEP_ALIVE, rs.next()).await
                    else {
                        let comment = axum::body::Bytes::from_static(b":\n\n");
                        return Some((comment, (Some(rs), answer)));
                    };
                    let event = match next {
                        Some(Ok(d)) => {
                            answer.absorb(&d);
                            let finish = d.finish.as_ref();
                            let mut out =
                                answer.object(&rs, finish, ask, tokenizer.as_ref(), started);
                            if list {
                                out["index"] = json!(index);
                            }
                            let rest = finish.is_none().then_some(rs);
                            return Some((event(&out), (rest, answer)));
                        }
                        Some(Err(e)) => error_event(ApiError::from(e)),
                        None => error_event(ApiError::from(rs.truncated())),
                    };
                    Some((event, (None, answer)))
                }
            })
            .boxed()
        });
    let events = futures::stream::select_all(each)
        .chain(futures::stream::once(async {
            axum::body::Bytes::from_static(b"data: [DONE]\n\n")
        }))
        .map(Ok::<_, std::convert::Infallible>);
    super::sse::event_stream(Body::from_stream(events))
}

/// One `data:` event.
fn event(value: &Value) -> axum::body::Bytes {
    let mut out = b"data: ".to_vec();
    // A Value always serializes.
    serde_json::to_writer(&mut out, value).unwrap_or_default();
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// An error inside a stream, as SGLang's server writes it.
fn error_event(e: ApiError) -> axum::body::Bytes {
    event(&json!({"error": {"message": e.message}}))
}

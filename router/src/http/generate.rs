//! SGLang's native API, `POST /generate`, for the clients written against SGLang's server or
//! its gateway (`sglang.bench_serving`'s default backend, SGLang's frontend language, RL
//! rollout loops that send token ids and read token ids back), and `GET /get_model_info`.
//!
//! A request is one prompt or a batch (`text` or `input_ids`), with `sampling_params` for all
//! of them or one object each. Each prompt becomes the `/v1/completions` request it means
//! (SGLang's sampling fields under their OpenAI and vLLM names), checked and dispatched by the
//! completions path; the answers are written in SGLang's shape: `{"text", "output_ids",
//! "meta_info"}` for one generation, a list of them for a batch or `n` > 1, and when streamed
//! one `data:` event per step holding the text and ids *so far* (SGLang's default; a batch's
//! events carry their `index`), then `data: [DONE]`. `meta_info.finish_reason` is
//! `{"type": "length", "length": N}`, `{"type": "stop", "matched": TOKEN_ID | "stop string"}`
//! or `{"type": "abort", "message"}`. Log probabilities (`return_logprob`,
//! `top_logprobs_num`, `logprob_start_len`, `return_text_in_logprobs`) come as SGLang's
//! `[logprob, token_id, text]` triples. `max_new_tokens: 0` prefills only (SGLang's frontend
//! caches a prefix and scores choices so): the worker draws one token, which is not reported.
//! Unknown sampling fields are refused, as SGLang's
//! `SamplingParams` refuses them; top-level fields this server does not serve (LoRA, images,
//! hidden states, sessions) are refused when they ask for something.

use std::time::Instant;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::AppState;
use super::completions::{self, Dispatched};
use super::error::ApiError;
use super::generate_answers::{streamed, whole};
use super::types::CompletionRequest;

type Fields = Map<String, Value>;

/// SGLang's default `max_new_tokens` (at most the server's limit).
const DEFAULT_MAX_NEW_TOKENS: u32 = 128;

/// `sampling_params` fields and the completions field each becomes (`None`: served by SGLang
/// as a hint this server needs not follow, dropped).
const SAMPLING_FIELDS: &[(&str, Option<&str>)] = &[
    ("max_new_tokens", Some("max_tokens")),
    ("min_new_tokens", Some("min_tokens")),
    ("temperature", Some("temperature")),
    ("top_p", Some("top_p")),
    ("top_k", Some("top_k")),
    ("min_p", Some("min_p")),
    ("frequency_penalty", Some("frequency_penalty")),
    ("presence_penalty", Some("presence_penalty")),
    ("repetition_penalty", Some("repetition_penalty")),
    ("logit_bias", Some("logit_bias")),
    ("stop", Some("stop")),
    ("stop_token_ids", Some("stop_token_ids")),
    ("ignore_eos", Some("ignore_eos")),
    ("skip_special_tokens", Some("skip_special_tokens")),
    (
        "spaces_between_special_tokens",
        Some("spaces_between_special_tokens"),
    ),
    ("no_stop_trim", Some("no_stop_trim")),
    ("n", Some("n")),
    ("regex", Some("regex")),
    ("json_schema", Some("json_schema")),
    ("ebnf", Some("ebnf")),
    ("structural_tag", Some("structural_tag")),
    ("sampling_seed", Some("seed")),
    ("custom_params", Some("custom_params")),
    // How often SGLang's server flushes a stream: every step here.
    ("stream_interval", None),
];

/// Top-level fields that ask for what this server does not serve, refused unless they ask
/// for nothing (`null`, `false`, empty).
const UNSERVED: &[&str] = &[
    "lora_path",
    "lora_id",
    "image_data",
    "video_data",
    "audio_data",
    "input_embeds",
    "custom_logit_processor",
    "return_hidden_states",
    "session_params",
    "token_ids_logprob",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "data_parallel_rank",
];

/// Top-level fields read here.
const KNOWN: &[&str] = &[
    "text",
    "input_ids",
    "sampling_params",
    "stream",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "model",
    // Whether SGLang logs the request's metrics: nothing to change here.
    "log_metrics",
];

/// What the answers report besides text and ids.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LogprobAsk {
    /// `return_logprob`.
    pub(super) on: bool,
    /// `top_logprobs_num`.
    pub(super) top: u32,
    /// First prompt position reported (`logprob_start_len`; -1: the last token alone), with
    /// no log probability of its own, as SGLang reports it.
    pub(super) start: i64,
    /// `return_text_in_logprobs`.
    pub(super) text: bool,
}

/// One prompt of a request.
struct Part {
    /// Its `/v1/completions` request.
    body: Fields,
    /// `max_new_tokens: 0`.
    prefill_only: bool,
}

/// A request, read.
struct Read {
    parts: Vec<Part>,
    ask: LogprobAsk,
    /// The client streams.
    stream: bool,
    /// The prompts came as a list (answered as a list, even of one).
    batch: bool,
}

/// `POST /generate`, after the body is read.
pub(crate) async fn run(
    st: &AppState,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let Value::Object(body) = serde_json::from_slice::<Value>(bytes)
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}"), None))?
    else {
        return Err(ApiError::invalid("the body must be a JSON object", None));
    };
    let default_max = DEFAULT_MAX_NEW_TOKENS.min(st.dispatcher.config().max_output_tokens);
    let Read {
        parts,
        ask,
        stream,
        batch,
    } = read(body, default_max)?;
    let generations_asked: u64 = parts
        .iter()
        .map(|p| p.body.get("n").and_then(Value::as_u64).unwrap_or(1))
        .sum();
    if generations_asked > u64::from(super::types::MAX_CHOICES) {
        return Err(ApiError::invalid(
            format!(
                "a request makes at most {} generations (prompts times n), got {generations_asked}",
                super::types::MAX_CHOICES
            ),
            Some("text"),
        ));
    }
    // Each prompt checked first, so a bad one dispatches nothing.
    let mut prepared = Vec::with_capacity(parts.len());
    let mut prefill_only = Vec::with_capacity(parts.len());
    for Part {
        body,
        prefill_only: only,
    } in parts
    {
        let req: CompletionRequest = serde_json::from_value(Value::Object(body))
            .map_err(|e| ApiError::invalid(format!("invalid sampling_params: {e}"), None))?;
        prepared.push(completions::completions(st, headers, req)?);
        prefill_only.push(only);
    }
    let dispatched =
        futures::future::try_join_all(prepared.into_iter().map(|p| completions::dispatch(st, p)))
            .await?;
    let mut headers = HeaderMap::new();
    let mut streams = Vec::new();
    for (
        Dispatched {
            streams: s,
            headers: h,
        },
        only,
    ) in dispatched.into_iter().zip(prefill_only)
    {
        if headers.is_empty() {
            headers = h;
        }
        streams.extend(s.into_iter().map(|rs| (rs, only)));
    }
    let tokenizer = st.dispatcher.tokenizer().clone();
    let list = batch || streams.len() > 1;
    let mut resp = if stream {
        streamed(streams, ask, tokenizer, list, started)
    } else {
        let outs = futures::future::try_join_all(
            streams
                .into_iter()
                .map(|(rs, only)| whole(rs, only, ask, tokenizer.clone(), started)),
        )
        .await?;
        let body = if list {
            Value::Array(outs)
        } else {
            outs.into_iter().next().unwrap_or(Value::Null)
        };
        completions::json_response(&body, 512)
    };
    resp.headers_mut().extend(headers);
    Ok(resp)
}

/// The request read into one completions body a prompt (`max_tokens` `default_max` where
/// the prompt's sampling fields do not say) with whether it only prefills, what to report,
/// whether it streams and whether it is a batch (answered as a list even of one).
fn read(mut body: Fields, default_max: u32) -> Result<Read, ApiError> {
    for (key, value) in &body {
        if UNSERVED.contains(&key.as_str()) {
            if asks_for_something(value) {
                return Err(ApiError::invalid(
                    format!("{key} is not supported by this server"),
                    None,
                ));
            }
        } else if !KNOWN.contains(&key.as_str()) && !value.is_null() {
            return Err(ApiError::invalid(format!("unknown field {key}"), None));
        }
    }
    let (prompts, batch) = prompts(&mut body)?;
    let flag = |body: &Fields, key: &'static str| -> Result<bool, ApiError> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid(
                format!("{key} must be a boolean"),
                Some(key),
            )),
        }
    };
    let stream = flag(&body, "stream")?;
    let ask = LogprobAsk {
        on: flag(&body, "return_logprob")?,
        top: match body.get("top_logprobs_num") {
            None | Some(Value::Null) => 0,
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "top_logprobs_num must be a non-negative integer",
                        Some("top_logprobs_num"),
                    )
                })?,
        },
        start: match body.get("logprob_start_len") {
            None | Some(Value::Null) => -1,
            Some(v) => v.as_i64().filter(|&s| s >= -1).ok_or_else(|| {
                ApiError::invalid(
                    "logprob_start_len must be an integer of at least -1",
                    Some("logprob_start_len"),
                )
            })?,
        },
        text: flag(&body, "return_text_in_logprobs")?,
    };
    let n = prompts.len();
    let sampling = per_prompt(body.remove("sampling_params"), n, "sampling_params")?;
    let rids = per_prompt(body.remove("rid"), n, "rid")?;
    let model = body.remove("model").filter(|m| !m.is_null());
    let mut parts = Vec::with_capacity(n);
    for ((prompt, sampling), rid) in prompts.into_iter().zip(sampling).zip(rids) {
        let mut out = completion_fields(sampling, default_max)?;
        out.insert("prompt".into(), prompt);
        // No `stream`: the completions path only dispatches here, and the answer streams
        // (or not) in SGLang's shape whatever it holds.
        if let Some(rid) = rid {
            if !rid.is_string() {
                return Err(ApiError::invalid("rid must be a string", Some("rid")));
            }
            out.insert("rid".into(), rid);
        }
        if let Some(m) = &model {
            out.insert("model".into(), m.clone());
        }
        if ask.on {
            out.insert("logprobs".into(), json!(ask.top));
            // The first position reported has no log probability: from the last token alone
            // (the default), the prompt's are not needed.
            if ask.start >= 0 {
                out.insert("prompt_logprobs".into(), json!(ask.top));
            }
        }
        // Prefill only: one token drawn, none reported.
        let only = out.get("max_tokens").and_then(Value::as_u64) == Some(0);
        if only {
            out.insert("max_tokens".into(), json!(1));
        }
        parts.push(Part {
            body: out,
            prefill_only: only,
        });
    }
    Ok(Read {
        parts,
        ask,
        stream,
        batch,
    })
}

/// Whether a refused field's value asks for anything.
fn asks_for_something(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => a.iter().any(asks_for_something),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// The prompts (`text` or `input_ids`, one or a batch) as completions prompts, and whether
/// they came as a batch.
fn prompts(body: &mut Fields) -> Result<(Vec<Value>, bool), ApiError> {
    let text = body.remove("text").filter(|v| !v.is_null());
    let ids = body.remove("input_ids").filter(|v| !v.is_null());
    let (prompts, batch) = match (text, ids) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give either text or input_ids, not both",
                Some("input_ids"),
            ));
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "text or input_ids is required",
                Some("text"),
            ));
        }
        (Some(Value::String(s)), None) => (vec![Value::String(s)], false),
        (Some(Value::Array(texts)), None) => {
            if !texts.iter().all(Value::is_string) {
                return Err(ApiError::invalid(
                    "text must be a string or a list of strings",
                    Some("text"),
                ));
            }
            (texts, true)
        }
        (Some(_), None) => {
            return Err(ApiError::invalid(
                "text must be a string or a list of strings",
                Some("text"),
            ));
        }
        (None, Some(Value::Array(ids))) => {
            if ids.iter().all(Value::is_array) {
                (ids, true)
            } else {
                (vec![Value::Array(ids)], false)
            }
        }
        (None, Some(_)) => {
            return Err(ApiError::invalid(
                "input_ids must be a list of token ids or a list of such lists",
                Some("input_ids"),
            ));
        }
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("the batch is empty", Some("text")));
    }
    for p in &prompts {
        let empty = match p {
            Value::String(s) => s.is_empty(),
            Value::Array(ids) => ids.is_empty(),
            _ => true,
        };
        if empty {
            return Err(ApiError::invalid(
                "a prompt must not be empty",
                Some(if p.is_string() { "text" } else { "input_ids" }),
            ));
        }
    }
    Ok((prompts, batch))
}

/// A per-prompt field: absent, one value for every prompt, or a list of one each.
fn per_prompt(
    value: Option<Value>,
    n: usize,
    key: &'static str,
) -> Result<Vec<Option<Value>>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(vec![None; n]),
        Some(Value::Array(each)) => {
            if each.len() != n {
                return Err(ApiError::invalid(
                    format!("{key} has {} entries for {n} prompts", each.len()),
                    Some(key),
                ));
            }
            Ok(each.into_iter().map(Some).collect())
        }
        Some(one) => Ok(vec![Some(one); n]),
    }
}

/// A prompt's `sampling_params` as completions fields.
fn completion_fields(sampling: Option<Value>, default_max: u32) -> Result<Fields, ApiError> {
    let sampling = match sampling {
        None | Some(Value::Null) => Fields::new(),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(ApiError::invalid(
                "sampling_params must be an object (or a list of one a prompt)",
                Some("sampling_params"),
            ));
        }
    };
    let mut out = Fields::new();
    for (key, value) in sampling {
        let Some((_, to)) = SAMPLING_FIELDS.iter().find(|(k, _)| *k == key) else {
            return Err(ApiError::invalid(
                format!("unknown sampling parameter {key}"),
                Some("sampling_params"),
            ));
        };
        if let Some(to) = to
            && !value.is_null()
        {
            out.insert((*to).into(), value);
        }
    }
    // SGLang's default answer length, not OpenAI's 16.
    out.entry("max_tokens").or_insert(json!(default_max));
    // SGLang takes a JSON schema as a string.
    if let Some(Value::String(schema)) = out.get("json_schema") {
        let parsed: Value = serde_json::from_str(schema).map_err(|e| {
            ApiError::invalid(
                format!("json_schema is not JSON: {e}"),
                Some("sampling_params"),
            )
        })?;
        out.insert("json_schema".into(), parsed);
    }
    Ok(out)
}

/// `GET /get_model_info`: what SGLang's clients read to learn the model.
pub(crate) async fn model_info(
    axum::extract::State(st): axum::extract::State<AppState>,
) -> Response {
    let model = st.dispatcher.config().model.clone();
    axum::Json(json!({
        "model_path": model,
        "tokenizer_path": model,
        "is_generation": true,
    }))
    .into_response()
}

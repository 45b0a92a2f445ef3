//! `/v1/completions` and `/v1/chat/completions`, streamed (SSE) or whole.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use dolphin_proto::v1::{self, FinishReason};
use futures::StreamExt;

use super::AppState;
use super::error::ApiError;
use super::logprobs;
use super::sse::SseBody;
use super::types::*;
use crate::answer::{AnswerReader, Readers};
use crate::dispatch::{GenerateParams, Prompt};
use crate::policy::Decision;
use crate::stream::{Api, Delta, ResponseStream};
use crate::tokenizer::{ChatExtras, ChatMessage, Tokenizer};
use crate::tools::{self, Mode};

/// OpenAI's default `max_tokens` for completions.
const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;
/// Chat requests without a limit get this many tokens at most (capped by the router's limit):
/// "unlimited" would turn every such request into a context-length error on the worker.
const CHAT_DEFAULT_MAX_TOKENS: u32 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// Sampling parameters and options common to both endpoints; `forced` is the format a
/// forced tool call is drawn under, and the field that asked for it.
#[allow(clippy::too_many_arguments)]
fn build(
    st: &AppState,
    headers: &HeaderMap,
    model: String,
    prompt: Prompt,
    max_tokens: Option<u32>,
    ep: Endpoint,
    mut f: SamplingFields,
    forced: Option<(&'static str, dolphin_grammar::Format)>,
) -> Result<(GenerateParams, u32), ApiError> {
    let default_max_tokens = match ep {
        Endpoint::Completions => COMPLETIONS_DEFAULT_MAX_TOKENS,
        Endpoint::Chat => CHAT_DEFAULT_MAX_TOKENS.min(st.dispatcher.config().max_output_tokens),
    };
    let choices = f.n.unwrap_or(1);
    if !(1..=MAX_CHOICES).contains(&choices) {
        return Err(ApiError::invalid(
            format!("n must be between 1 and {MAX_CHOICES}, got {choices}"),
            Some("n"),
        ));
    }
    let logits = f
        .other
        .take_logit_rules()
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    let logprobs = f
        .other
        .take_logprobs(ep == Endpoint::Chat)
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    // vLLM's and SGLang's extras: banned words, special tokens, priority, cache salt, ...
    let extras = super::extras::Extras::take(&mut f)?;
    let prompt_logprobs = f
        .other
        .take_prompt_logprobs()
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    if prompt_logprobs.is_some() && f.stream {
        // As vLLM: they come with the whole answer.
        return Err(ApiError::invalid(
            "prompt_logprobs is not available when stream is true",
            Some("prompt_logprobs"),
        ));
    }
    let format = f
        .other
        .take_format()
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    let format = match (format, forced) {
        (Some((field, _)), Some((tool_field, _))) => {
            return Err(ApiError::invalid(
                format!(
                    "{field} cannot be set with {tool_field}, which forces a tool call: send one"
                ),
                Some(field),
            ));
        }
        (format, forced) => format.or(forced),
    };
    // Whether the format compiles is checked by the dispatcher with the tokenizing, off the
    // serving thread (`GenerateParams::format_field` names the field in its error).
    if let Some((field, _)) = &format
        && f.ignore_eos
    {
        return Err(ApiError::invalid(
            format!("ignore_eos cannot be set with {field}: a complete format ends the output"),
            Some("ignore_eos"),
        ));
    }
    if let Some(field) = f.other.first_used() {
        return Err(ApiError::invalid(
            format!("{field} is not supported by this server"),
            Some(field),
        ));
    }
    // Refused, not clamped: 0 would mean "off" on the gRPC wire, and a client asking for it
    // over HTTP expects something else.
    if let Some(p) = f.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(ApiError::invalid(
            format!("top_p must be in (0, 1], got {p}"),
            Some("top_p"),
        ));
    }
    let max_prompt = st.dispatcher.config().max_prompt_tokens;
    let truncate_prompt_tokens = match f.truncate_prompt_tokens {
        None => None,
        Some(-1) => Some(max_prompt),
        Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX).min(max_prompt)),
        Some(n) => {
            return Err(ApiError::invalid(
                format!(
                    "truncate_prompt_tokens must be at least 1, or -1 for the longest prompt the server takes, got {n}"
                ),
                Some("truncate_prompt_tokens"),
            ));
        }
    };
    // -1 and 0 both mean "off" (vLLM's and SGLang's clients send -1); a larger k than the
    // vocabulary is all of it.
    let top_k = match f.top_k {
        None | Some(-1 | 0) => 0,
        Some(k) if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                format!("top_k must be -1 or 0 (off) or at least 1, got {k}"),
                Some("top_k"),
            ));
        }
    };
    let force = match f.prefill_mode.as_deref() {
        None => None,
        Some("local") => Some(Decision::Local),
        Some("remote") => Some(Decision::Remote),
        Some(other) => {
            return Err(ApiError::invalid(
                format!("prefill_mode must be \"local\" or \"remote\", got {other:?}"),
                Some("prefill_mode"),
            ));
        }
    };
    // The client's id for the request (its logs and traces; never the engine's key): the
    // `x-request-id` header, else SGLang's `rid`.
    let fits = |v: &String| !v.is_empty() && v.len() <= 128;
    let request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .filter(fits)
        .or(extras.rid.filter(fits))
        .unwrap_or_default();
    let model = if model.is_empty() {
        st.dispatcher.config().model.clone()
    } else {
        model
    };
    let sampling = v1::SamplingParams {
        temperature: f.temperature.unwrap_or(1.0),
        top_k,
        top_p: f.top_p.unwrap_or(1.0),
        seed: f.seed.map(Seed::bits),
        max_tokens: max_tokens.unwrap_or(default_max_tokens),
        stop: f.stop.map(StopInput::into_vec).unwrap_or_default(),
        ignore_eos: f.ignore_eos,
        handoff: f.handoff.map(|h| v1::HandoffParams {
            algorithm: h.algorithm,
            threshold: h.threshold,
        }),
        // Trace replay's end is a gRPC field of `dolphinctl replay`, not an OpenAI one.
        replay_output_tokens: None,
        logits: logits.map(Box::new),
        logprobs,
        prompt_logprobs,
        structured: format.as_ref().map(|(_, f)| Box::new(f.to_wire())),
        output_in_prompt: 0,
        include_stop_str_in_output: f.include_stop_str_in_output,
        cache_salt: extras.cache_salt,
        priority: extras.priority,
    };
    let params = GenerateParams {
        request_id,
        model,
        prompt,
        sampling,
        max_tokens_is_default: max_tokens.is_none(),
        force,
        slo: None,
        api: Api::Http,
        timeout: None,
        trace: crate::dispatch::TraceHeaders::read(|k| {
            headers.get(k)?.to_str().ok().map(str::to_owned)
        }),
        format_field: format.map_or("structured", |(field, _)| field),
        truncate_prompt_tokens,
        keep_call_markers: false,
        bad_words: extras.bad_words,
        add_special_tokens: extras.add_special_tokens,
        keep_special_tokens: extras.keep_special_tokens,
    };
    Ok((params, choices))
}

/// A request checked and turned into dispatcher parameters, ready to [`run`].
pub(crate) struct Prepared {
    params: GenerateParams,
    /// OpenAI's `n`: generations of the same request.
    choices: u32,
    /// A batch's prompts after the first (completions), each answered `choices` times.
    more_prompts: Vec<Prompt>,
    /// The prompt's text, which each choice's text starts with (`echo`, completions only).
    echo: Option<Echo>,
    endpoint: Endpoint,
    stream: bool,
    include_usage: bool,
    /// vLLM's `continuous_usage_stats`: every chunk carries its choice's usage so far.
    running_usage: bool,
    /// How a chat answer is read for tool calls.
    tools: Mode,
    /// vLLM's `return_token_ids`: the prompt's and the output's token ids beside the text.
    return_token_ids: bool,
    /// vLLM's `return_tokens_as_token_ids`: log probabilities name tokens `token_id:<id>`.
    tokens_as_ids: bool,
    /// A reasoning model's thinking goes into `reasoning_content` (SGLang's
    /// `separate_reasoning`, true by default; false leaves it in the answer's text).
    separate_reasoning: bool,
}

impl Prepared {
    /// The prompt the request would send (for counting its tokens).
    pub(crate) fn into_prompt(self) -> Prompt {
        self.params.prompt
    }
}

/// `POST /v1/completions`, up to the dispatch (kept out of the async part: what a future holds
/// across its awaits, it holds for the whole request).
pub(crate) fn completions(
    st: &AppState,
    headers: &HeaderMap,
    mut req: CompletionRequest,
) -> Result<Prepared, ApiError> {
    tools::refuse_outside_chat(&mut req.sampling.other)
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    if req.echo && req.sampling.truncate_prompt_tokens.is_some() {
        return Err(ApiError::invalid(
            "truncate_prompt_tokens cannot be set with echo: the echoed prompt would not be the one the model read",
            Some("truncate_prompt_tokens"),
        ));
    }
    let mut prompts: Vec<Prompt> = match req.prompt {
        PromptInput::Text(t) => vec![Prompt::Text(t)],
        PromptInput::Tokens(t) => vec![Prompt::Tokens(t)],
        PromptInput::TextBatch(v) => v.into_iter().map(Prompt::Text).collect(),
        PromptInput::TokenBatch(v) => v.into_iter().map(Prompt::Tokens).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(
            "prompt must not be an empty list",
            Some("prompt"),
        ));
    }
    let more_prompts = prompts.split_off(1);
    let prompt = prompts.remove(0);
    // `max_tokens: 0` with echo scores the prompt and generates nothing (OpenAI's legacy
    // way, which vLLM serves too): the worker generates one token, which is not sent.
    let score_only = req.echo && req.max_tokens == Some(0);
    let echo = req.echo.then(|| Echo {
        texts: std::iter::once(&prompt)
            .chain(&more_prompts)
            .map(|p| match p {
                Prompt::Text(t) => t.clone(),
                Prompt::Tokens(ids) => st.dispatcher.tokenizer().decode(ids),
                Prompt::Chat { .. } => String::new(),
            })
            .collect(),
        score_only,
    });
    let (stream_mode, opts) = (
        req.sampling.stream,
        req.sampling.stream_options.unwrap_or_default(),
    );
    let (return_token_ids, tokens_as_ids) = take_token_id_flags(&mut req.sampling)?;
    let (mut params, choices) = build(
        st,
        headers,
        req.model,
        prompt,
        if score_only { Some(1) } else { req.max_tokens },
        Endpoint::Completions,
        req.sampling,
        None,
    )?;
    let generations = choices as usize * (1 + more_prompts.len());
    if generations > MAX_CHOICES as usize {
        return Err(ApiError::invalid(
            format!(
                "a request makes at most {MAX_CHOICES} generations (prompts times n), got {generations}"
            ),
            Some(if choices > 1 { "n" } else { "prompt" }),
        ));
    }
    if echo.is_some() && params.sampling.prompt_logprobs.is_some() {
        return Err(ApiError::invalid(
            "prompt_logprobs cannot be set with echo: with echo, logprobs covers the prompt",
            Some("prompt_logprobs"),
        ));
    }
    if echo.is_some() {
        // With echo the logprobs cover the prompt too (OpenAI's legacy API; what evaluation
        // harnesses read to score a text).
        params.sampling.prompt_logprobs = params.sampling.logprobs;
    }
    Ok(Prepared {
        params,
        choices,
        more_prompts,
        echo,
        endpoint: Endpoint::Completions,
        stream: stream_mode,
        include_usage: opts.include_usage,
        running_usage: opts.continuous_usage_stats,
        tools: Mode::Text,
        return_token_ids,
        tokens_as_ids,
        separate_reasoning: true,
    })
}

/// A chat request written by another API's reader (the Responses and Messages APIs), as
/// `/v1/chat/completions` takes it; a body that does not read as one is a 400.
pub(crate) fn chat_from(
    st: &AppState,
    headers: &HeaderMap,
    chat: serde_json::Map<String, serde_json::Value>,
) -> Result<Prepared, ApiError> {
    let req = serde_json::from_value(serde_json::Value::Object(chat))
        .map_err(|e| ApiError::invalid(format!("invalid request: {e}"), None))?;
    self::chat(st, headers, req)
}

/// `POST /v1/chat/completions`, up to the dispatch.
pub(crate) fn chat(
    st: &AppState,
    headers: &HeaderMap,
    mut req: ChatRequest,
) -> Result<Prepared, ApiError> {
    let tool_request = tools::take(
        &mut req.sampling.other,
        st.dispatcher.config().tool_call_parser,
    )
    .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    let extras = req
        .sampling
        .other
        .take_chat_extras(st.dispatcher.config().trust_request_chat_template)
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    let forced = tool_request.format().map(|f| {
        let field = match tool_request.mode {
            Mode::Named(_) => "tool_choice",
            _ => "tools",
        };
        (field, f)
    });
    let strict = st.dispatcher.strict_tools(&tool_request);
    let messages = chat_messages(req.messages)?;
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let (stream_mode, opts) = (
        req.sampling.stream,
        req.sampling.stream_options.unwrap_or_default(),
    );
    let (return_token_ids, tokens_as_ids) = take_token_id_flags(&mut req.sampling)?;
    let separate_reasoning = req
        .sampling
        .other
        .take_flag("separate_reasoning")
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?
        .unwrap_or(true);
    let (mut params, choices) = build(
        st,
        headers,
        req.model,
        Prompt::Chat {
            messages,
            extras: Box::new(ChatExtras {
                tools: tool_request.tools,
                ..extras
            }),
        },
        max_tokens,
        Endpoint::Chat,
        req.sampling,
        forced,
    )?;
    // Strict tools under "auto": the answer is drawn under their calls' grammar.
    if crate::tools::draw_strict(strict, &mut params.sampling) {
        params.format_field = "tools";
    }
    params.keep_call_markers = matches!(tool_request.mode, Mode::Auto { .. });
    Ok(Prepared {
        params,
        choices,
        more_prompts: Vec::new(),
        echo: None,
        endpoint: Endpoint::Chat,
        stream: stream_mode,
        include_usage: opts.include_usage,
        running_usage: opts.continuous_usage_stats,
        tools: tool_request.mode,
        return_token_ids,
        tokens_as_ids,
        separate_reasoning,
    })
}

/// vLLM's `return_token_ids` and `return_tokens_as_token_ids` (false when absent).
fn take_token_id_flags(f: &mut SamplingFields) -> Result<(bool, bool), ApiError> {
    let mut flag = |name| {
        f.other
            .take_flag(name)
            .map(|on| on.unwrap_or(false))
            .map_err(|(field, message)| ApiError::invalid(message, Some(field)))
    };
    Ok((
        flag("return_token_ids")?,
        flag("return_tokens_as_token_ids")?,
    ))
}

/// A request's conversation as the chat template reads it: text parts joined (other parts are
/// refused), earlier calls with their arguments as objects where they parse.
pub(crate) fn chat_messages(input: Vec<ChatMessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::with_capacity(input.len());
    for m in input {
        let content = match m.content {
            None => String::new(),
            Some(ChatContent::Text(t)) => t,
            Some(ChatContent::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::invalid(
                            format!("content parts of type {:?} are not supported", p.kind),
                            Some("messages"),
                        ));
                    }
                    text.push_str(&p.text);
                }
                text
            }
        };
        let tool_calls = m
            .tool_calls
            .into_iter()
            .map(|c| {
                crate::tokenizer::ToolCall::from_text(c.id, c.function.name, c.function.arguments)
            })
            .collect();
        messages.push(ChatMessage {
            role: m.role,
            content,
            tool_calls,
            tool_call_id: m.tool_call_id,
            name: m.name,
            reasoning_content: m.reasoning_content,
        });
    }
    Ok(messages)
}

/// Dispatches a prepared request and answers it, whole or as server-sent events.
pub(crate) async fn run(st: &AppState, prepared: Prepared) -> Result<Response, ApiError> {
    let Prepared {
        params,
        choices,
        more_prompts,
        echo,
        endpoint: ep,
        stream,
        include_usage,
        running_usage,
        tools,
        return_token_ids,
        tokens_as_ids,
        separate_reasoning,
    } = prepared;
    let cfg = st.dispatcher.config();
    let tokens = logprobs_tokenizer(st, &params, tokens_as_ids);
    let reasoning = cfg.reasoning_parser.filter(|_| separate_reasoning);
    let readers = Readers::of(reasoning, cfg.tool_call_parser);
    // vLLM's `prompt_logprobs`, reported beside the output (with echo they are the echoed
    // text's, in `logprobs`).
    let prompt_scores = (params.sampling.prompt_logprobs.is_some() && echo.is_none())
        .then(|| st.dispatcher.tokenizer().clone());
    if choices > 1 || !more_prompts.is_empty() {
        let prompts = 1 + more_prompts.len() as u32;
        let enc = |id, model| {
            Encoder::new(ep, id, model, now(), include_usage)
                .with_choices(prompts * choices, choices)
                .with_echo(echo)
                .with_answers(tools, readers)
                .with_prompt_scores(prompt_scores)
                .with_running_usage(running_usage)
                .with_token_ids(return_token_ids)
                .with_logprobs(tokens, Vec::new())
        };
        // Boxed: only `n` > 1 and batched prompts take it, and inline its state would grow
        // every completion's future.
        return Box::pin(run_choices(
            st,
            params,
            more_prompts,
            choices,
            ep,
            enc,
            stream,
        ))
        .await;
    }
    let model = params.model.clone();
    let rs = st.dispatcher.generate(params).await?;
    let headers = routing_headers(&rs);
    let prompt = prompt_of(&rs).into_iter().collect();
    let enc = Encoder::new(ep, response_id(ep, &rs), model, now(), include_usage)
        .with_echo(echo)
        .with_answers(tools, readers)
        .with_prompt_scores(prompt_scores)
        .with_logprobs(tokens, prompt)
        .with_running_usage(running_usage)
        .with_prompt_lengths([&rs])
        .with_token_ids(return_token_ids)
        .with_prompt_ids([&rs]);
    let mut resp = if stream {
        events(rs, enc)
    } else {
        whole(enc, vec![collect(rs, return_token_ids).await?])
    };
    resp.headers_mut().extend(headers);
    Ok(resp)
}

/// Dispatches every generation of a request: prompt `p`'s `i`th is stream `p * n + i` (as
/// vLLM numbers a batch's choices), seeded with the request's seed + `i`.
async fn generations(
    st: &AppState,
    params: GenerateParams,
    more_prompts: Vec<Prompt>,
    choices: u32,
) -> Result<Vec<ResponseStream>, ApiError> {
    let prompts: Vec<Prompt> = std::iter::once(params.prompt.clone())
        .chain(more_prompts)
        .collect();
    let starts = prompts.iter().flat_map(|prompt| {
        let params = &params;
        (0..choices).map(move |i| {
            let mut p = params.clone();
            p.prompt = prompt.clone();
            p.sampling.seed = p.sampling.seed.map(|s| s.wrapping_add(u64::from(i)));
            st.dispatcher.generate(p)
        })
    });
    Ok(futures::future::try_join_all(starts).await?)
}

/// A prepared completions request's generations, dispatched for an answer in another API's
/// shape (SGLang's `/generate`).
pub(crate) struct Dispatched {
    /// Prompt `p`'s `i`th generation is `streams[p * n + i]`.
    pub(crate) streams: Vec<ResponseStream>,
    /// Where the first generation went ([`routing_headers`]).
    pub(crate) headers: HeaderMap,
}

/// Dispatches every generation of `prepared` (see [`generations`]).
pub(crate) async fn dispatch(st: &AppState, prepared: Prepared) -> Result<Dispatched, ApiError> {
    let Prepared {
        params,
        choices,
        more_prompts,
        ..
    } = prepared;
    let streams = generations(st, params, more_prompts, choices).await?;
    let headers = routing_headers(&streams[0]);
    Ok(Dispatched { streams, headers })
}

/// A prepared chat request dispatched for an answer in another shape (the Responses API).
pub(crate) struct Started {
    /// Its output.
    pub(crate) rs: ResponseStream,
    /// How its answer is read for tool calls, and by which readers.
    pub(crate) tools: Mode,
    pub(crate) readers: Readers,
    /// The client streams.
    pub(crate) stream: bool,
    /// Names the tokens of log probabilities, where the request asked for them.
    pub(crate) logprobs: Option<Arc<dyn Tokenizer>>,
    /// Where it went ([`routing_headers`]).
    pub(crate) headers: HeaderMap,
}

/// Dispatches `prepared` (one choice) and hands its output over.
pub(crate) async fn start(st: &AppState, prepared: Prepared) -> Result<Started, ApiError> {
    let Prepared {
        params,
        stream,
        tools,
        ..
    } = prepared;
    let cfg = st.dispatcher.config();
    let readers = Readers::of(cfg.reasoning_parser, cfg.tool_call_parser);
    let logprobs = logprobs_tokenizer(st, &params, false);
    let rs = st.dispatcher.generate(params).await?;
    let headers = routing_headers(&rs);
    Ok(Started {
        rs,
        tools,
        readers,
        stream,
        logprobs,
        headers,
    })
}

/// The tokenizer that names the tokens of log probabilities, where the request asked for them:
/// the model's, or with `as_ids` one that names each `token_id:<id>`.
fn logprobs_tokenizer(
    st: &AppState,
    params: &GenerateParams,
    as_ids: bool,
) -> Option<Arc<dyn Tokenizer>> {
    params.sampling.logprobs?;
    let tokenizer = st.dispatcher.tokenizer().clone();
    Some(if as_ids {
        Arc::new(crate::tokenizer::TokenIdNames(tokenizer))
    } else {
        tokenizer
    })
}

/// The prompt's tokens, where its log probabilities come back (echo with logprobs).
fn prompt_of(rs: &ResponseStream) -> Option<Vec<u32>> {
    rs.asked_prompt_logprobs()
        .then(|| rs.prompt_tokens().to_vec())
}

/// The response's id: the endpoint's prefix and the request's id.
fn response_id(ep: Endpoint, rs: &ResponseStream) -> String {
    let prefix = match ep {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    format!("{prefix}-{}", rs.request_id())
}

/// Unix seconds, the responses' `created`.
pub(crate) fn now() -> u64 {
    crate::request_log::unix_ms() / 1000
}

/// Answers a request for `choices` > 1 generations: each is dispatched as a request of its own
/// (a seeded request's choice `i` uses seed + `i`, so choice 0 is what `n: 1` gives), and their
/// outputs go out as one response (the routing headers are the first choice's) or one stream
/// of events tagged with each choice's index. A choice that fails fails the whole response, and
/// dropping the others cancels them. `enc` makes the response's encoder from its id and model.
async fn run_choices(
    st: &AppState,
    params: GenerateParams,
    more_prompts: Vec<Prompt>,
    choices: u32,
    ep: Endpoint,
    enc: impl FnOnce(String, String) -> Encoder,
    stream: bool,
) -> Result<Response, ApiError> {
    let model = params.model.clone();
    let streams = generations(st, params, more_prompts, choices).await?;
    let headers = routing_headers(&streams[0]);
    // Each prompt's tokens, from its first choice's stream.
    let prompt = streams
        .iter()
        .step_by(choices as usize)
        .filter_map(prompt_of)
        .collect();
    let enc = enc(response_id(ep, &streams[0]), model)
        .with_scored_prompts(prompt)
        .with_prompt_lengths(&streams)
        .with_prompt_ids(streams.iter().step_by(choices as usize));
    let ids = enc.token_ids;
    let mut resp = if stream {
        let tagged = streams.into_iter().zip(0..).map(|(rs, i)| {
            rs.map(move |d| {
                d.map(|mut d| {
                    d.choice = i;
                    d
                })
            })
        });
        events(futures::stream::select_all(tagged), enc)
    } else {
        whole(
            enc,
            futures::future::try_join_all(streams.into_iter().map(|rs| collect(rs, ids))).await?,
        )
    };
    resp.headers_mut().extend(headers);
    Ok(resp)
}

/// A streamed answer: the deltas of `deltas` as server-sent events.
fn events<S>(deltas: S, enc: Encoder) -> Response
where
    S: futures::Stream<Item = Result<crate::stream::Delta, crate::error::DispatchError>>
        + Unpin
        + Send
        + 'static,
{
    super::sse::event_stream(axum::body::Body::new(SseBody::new(deltas, enc)))
}

/// A whole answer from every choice's output (at least one): the usage counts the prompt once,
/// and the prefill path is the first choice's.
fn whole(mut enc: Encoder, outputs: Vec<Output>) -> Response {
    let path = outputs[0].path;
    let mut choices = Vec::with_capacity(outputs.len());
    for (o, index) in outputs.into_iter().zip(0..) {
        enc.count_usage(index, &o.usage);
        choices.push(o.choice);
    }
    let usage = enc.usage.take().unwrap_or_default();
    let mut resp = enc.whole(choices, &usage);
    // Known once the decode worker answered: only a whole response can carry it.
    resp.headers_mut()
        .insert(X_PREFILL_PATH, HeaderValue::from_static(path.as_str()));
    resp
}

/// Adds a further choice's generated tokens (and a model group's split of them) to the
/// request's usage; its prompt's tokens are [`Encoder::count_usage`]'s to add, once a prompt.
fn add_usage(total: &mut v1::Usage, more: &v1::Usage) {
    total.completion_tokens += more.completion_tokens;
    total.handoffs += more.handoffs;
    for m in &more.by_model {
        match total.by_model.iter_mut().find(|t| t.model == m.model) {
            Some(t) => t.completion_tokens += m.completion_tokens,
            None => total.by_model.push(m.clone()),
        }
    }
}

// Response headers, named once (`from_static` checks its name at compile time in a const).
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_DECODE_WORKER: HeaderName = HeaderName::from_static("x-dolphin-decode-worker");
const X_PREFILL_MODE: HeaderName = HeaderName::from_static("x-dolphin-prefill-mode");
const X_POLICY: HeaderName = HeaderName::from_static("x-dolphin-policy");
const X_PREFILL_WORKER: HeaderName = HeaderName::from_static("x-dolphin-prefill-worker");
const X_PREFILL_PATH: HeaderName = HeaderName::from_static("x-dolphin-prefill-path");

/// Where the request went, as response headers (useful to tests and operators).
fn routing_headers(rs: &ResponseStream) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(8);
    let r = rs.route();
    let mut put = |name: HeaderName, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    };
    put(X_REQUEST_ID, rs.request_id());
    put(X_DECODE_WORKER, r.decode.worker.id.as_str());
    put(X_PREFILL_MODE, r.decision.as_str());
    put(X_POLICY, r.decided_by.label());
    if r.decision == Decision::Remote
        && let Some(p) = &r.prefill
    {
        put(X_PREFILL_WORKER, p.worker.id.as_str());
    }
    h
}

/// A JSON answer, serialized straight into a buffer of about its size (axum's `Json` grows a
/// 128-byte one through an `io::Write` adapter).
pub(crate) fn json_response<T: serde::Serialize>(value: &T, size_hint: usize) -> Response {
    let mut body = Vec::with_capacity(size_hint);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => {
            let mut resp = Response::new(axum::body::Body::from(body));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => ApiError {
            status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("cannot write the response: {e}"),
            kind: "server_error",
            param: None,
            code: None,
        }
        .into_response(),
    }
}

fn finish_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// Builds response bodies and stream chunks for one request.
pub(crate) struct Encoder {
    ep: Endpoint,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// Choices whose first chat chunk (the one with the role) went out, one bit each.
    sent_role: u32,
    /// Choices not finished yet, and the usage of those that are: with several choices the
    /// usage chunk follows the last one's end.
    unfinished: u32,
    usage: Option<v1::Usage>,
    /// Choices per prompt (`n`; a batch's choice `c` answers prompt `c / n`), and the prompts
    /// whose tokens the usage counts, one bit each.
    per_prompt: u32,
    counted: u32,
    /// The text each prompt's choices start with (`echo`; empty: none), and the choices that
    /// have sent it, one bit each.
    echo: Vec<String>,
    echoed: u32,
    /// Send the echo alone: the generated token is dropped (`max_tokens: 0` with echo).
    score_only: bool,
    /// Names the tokens of log probabilities (`None`: the request asked for none).
    logprobs: Option<Arc<dyn Tokenizer>>,
    /// Each prompt's tokens, where their log probabilities come (with the echo, or
    /// `prompt_logprobs`); empty where none do.
    prompt: Vec<Vec<u32>>,
    /// Each choice's text so far, in characters: where its next token's text starts
    /// (completions' `text_offset`).
    offsets: Vec<u32>,
    /// How chat answers are read for tool calls and thinking, and each choice's reader
    /// where they are.
    tools: Mode,
    answers: Readers,
    readers: Vec<Option<AnswerReader>>,
    /// Names the prompt's tokens where the request asked for their log probabilities
    /// (`prompt_logprobs`, without echo).
    prompt_scores: Option<Arc<dyn Tokenizer>>,
    /// Every chunk carries its choice's usage so far (vLLM's `continuous_usage_stats`): each
    /// choice's prompt tokens and tokens generated so far; `None`: chunks carry none.
    running: Option<Vec<(u32, u32)>>,
    /// vLLM's `return_token_ids`: each prompt's ids go out (on each choice's first chunk in a
    /// stream, the choices that sent them one bit each), and the output's with its text.
    token_ids: bool,
    prompt_ids: Vec<Vec<u32>>,
    sent_prompt_ids: u32,
}

impl Encoder {
    /// An encoder for a response `id` of `model`, made at `created` (Unix seconds).
    pub(crate) fn new(
        ep: Endpoint,
        id: String,
        model: String,
        created: u64,
        include_usage: bool,
    ) -> Self {
        Self {
            ep,
            id,
            model,
            created,
            include_usage,
            sent_role: 0,
            unfinished: 1,
            usage: None,
            per_prompt: 1,
            counted: 0,
            echo: Vec::new(),
            echoed: 0,
            score_only: false,
            logprobs: None,
            prompt: Vec::new(),
            offsets: Vec::new(),
            tools: Mode::Text,
            answers: Readers::default(),
            readers: Vec::new(),
            prompt_scores: None,
            running: None,
            token_ids: false,
            prompt_ids: Vec::new(),
            sent_prompt_ids: 0,
        }
    }

    /// The encoder of a request that asked for token ids beside the text (`on`).
    pub(crate) fn with_token_ids(mut self, on: bool) -> Self {
        self.token_ids = on;
        self
    }

    /// Each prompt's tokens from its first choice's stream, where token ids go out.
    fn with_prompt_ids<'a>(
        mut self,
        streams: impl IntoIterator<Item = &'a ResponseStream>,
    ) -> Self {
        if self.token_ids {
            self.prompt_ids = streams
                .into_iter()
                .map(|rs| rs.prompt_tokens().to_vec())
                .collect();
        }
        self
    }

    /// Choice `choice`'s prompt ids, where token ids go out.
    fn prompt_ids_of(&self, choice: u32) -> Option<Vec<u32>> {
        self.prompt_ids
            .get((choice / self.per_prompt) as usize)
            .cloned()
    }

    /// Choice `choice`'s prompt ids on its first chunk, where token ids go out.
    fn first_prompt_ids(&mut self, choice: u32) -> Option<Vec<u32>> {
        let bit = 1u32 << choice.min(31);
        if !self.token_ids || self.sent_prompt_ids & bit != 0 {
            return None;
        }
        self.sent_prompt_ids |= bit;
        self.prompt_ids_of(choice)
    }

    /// A delta's token ids, where they go out.
    fn ids_of(&self, d: &Delta) -> Option<Vec<u32>> {
        self.token_ids.then(|| d.token_ids.clone())
    }

    /// The encoder of a request whose every chunk carries its choice's usage so far (`on`).
    pub(crate) fn with_running_usage(mut self, on: bool) -> Self {
        self.running = on.then(Vec::new);
        self
    }

    /// The prompt lengths of the choices' streams, in choice order (for the running usage).
    fn with_prompt_lengths<'a>(
        mut self,
        streams: impl IntoIterator<Item = &'a ResponseStream>,
    ) -> Self {
        if let Some(running) = &mut self.running {
            running.extend(
                streams
                    .into_iter()
                    .map(|rs| (rs.prompt_tokens().len() as u32, 0)),
            );
        }
        self
    }

    /// Choice `choice`'s usage so far, where chunks carry it.
    fn running_usage(&self, choice: u32) -> Option<UsageOut> {
        let &(prompt, generated) = self.running.as_ref()?.get(choice as usize)?;
        Some(UsageOut {
            prompt_tokens: prompt,
            completion_tokens: generated,
            total_tokens: prompt + generated,
            prompt_tokens_details: None,
            handoff: None,
        })
    }

    /// The encoder of a chat request whose answers are read for tool calls as `mode` says
    /// and, as `readers` say, split into thinking and answer.
    pub(crate) fn with_answers(mut self, mode: Mode, readers: Readers) -> Self {
        if self.ep == Endpoint::Chat {
            self.tools = mode;
            self.answers = readers;
        }
        self
    }

    /// A chat delta's text read: its thinking, answer text and calls (`None` where answers
    /// are plain text), and its finish reason.
    fn read_answer(
        &mut self,
        d: &Delta,
        finish: Option<&'static str>,
    ) -> Option<(String, String, Vec<ToolCallOut>, Option<&'static str>)> {
        let i = d.choice as usize;
        while self.readers.len() <= i {
            self.readers
                .push(AnswerReader::new(&self.tools, self.answers));
        }
        let reader = self.readers[i].as_mut()?;
        let read = reader.read(&d.text, finish.is_some());
        let calls = call_parts(read.calls, true);
        let finish = finish.map(|f| reader.finish_reason(f));
        Some((read.reasoning, read.text, calls, finish))
    }

    /// The encoder of a request that asked for log probabilities (`Some`: the tokenizer that
    /// names their tokens); with `prompt`, each prompt's tokens, which come with theirs.
    pub(crate) fn with_logprobs(
        mut self,
        tokenizer: Option<Arc<dyn Tokenizer>>,
        prompt: Vec<Vec<u32>>,
    ) -> Self {
        self.logprobs = tokenizer;
        self.prompt = prompt;
        self
    }

    /// Each prompt's tokens, which come with their log probabilities (echo with logprobs).
    fn with_scored_prompts(mut self, prompt: Vec<Vec<u32>>) -> Self {
        self.prompt = prompt;
        self
    }

    /// The encoder of a request that asked for its prompt's log probabilities
    /// (`prompt_logprobs`): `tokenizer` names their tokens.
    pub(crate) fn with_prompt_scores(mut self, tokenizer: Option<Arc<dyn Tokenizer>>) -> Self {
        self.prompt_scores = tokenizer;
        self
    }

    /// A completions choice's log probabilities for a delta's tokens, after the echoed
    /// prompt's (`echoed`: characters of echo this chunk starts with).
    fn completion_logprobs(&mut self, d: &Delta, echoed: usize) -> Option<CompletionLogprobs> {
        let tok = self.logprobs.as_deref()?;
        let i = d.choice as usize;
        if self.offsets.len() <= i {
            self.offsets.resize(i + 1, 0);
        }
        let prompt = self.prompt.get((d.choice / self.per_prompt) as usize);
        let offset = &mut self.offsets[i];
        match prompt {
            Some(prompt) if echoed > 0 => Some(logprobs::completion_with_prompt(
                tok,
                (prompt, &d.prompt_logprobs),
                &d.token_ids,
                &d.logprobs,
                offset,
            )),
            _ => {
                *offset += echoed as u32;
                Some(logprobs::completion(tok, &d.token_ids, &d.logprobs, offset))
            }
        }
    }

    /// The encoder of a request whose choices' texts start with their prompt's `echo`.
    pub(crate) fn with_echo(mut self, echo: Option<Echo>) -> Self {
        self.score_only = echo.as_ref().is_some_and(|e| e.score_only);
        self.echo = echo.map(|e| e.texts).unwrap_or_default();
        self
    }

    /// The text choice `choice` starts with (`echo`).
    fn echo_of(&self, choice: u32) -> Option<&str> {
        self.echo
            .get((choice / self.per_prompt) as usize)
            .map(String::as_str)
    }

    /// Whether every choice has ended (its last chunk written).
    pub(crate) fn finished(&self) -> bool {
        self.unfinished == 0
    }

    /// The encoder of a request for `choices` generations (at most [`MAX_CHOICES`]),
    /// `per_prompt` of each prompt.
    pub(crate) fn with_choices(mut self, choices: u32, per_prompt: u32) -> Self {
        self.unfinished = choices;
        self.per_prompt = per_prompt.max(1);
        self
    }

    /// Counts choice `choice`'s usage into the request's: each prompt's tokens once, every
    /// choice's generated tokens.
    fn count_usage(&mut self, choice: u32, usage: &v1::Usage) {
        let prompt = 1u32 << (choice / self.per_prompt).min(31);
        match &mut self.usage {
            None => {
                self.usage = Some(usage.clone());
                self.counted = prompt;
            }
            Some(total) => {
                if self.counted & prompt == 0 {
                    self.counted |= prompt;
                    total.prompt_tokens += usage.prompt_tokens;
                    total.cached_tokens += usage.cached_tokens;
                }
                add_usage(total, usage);
            }
        }
    }

    /// JSON chunks for one delta (none when it carries no text and does not finish).
    pub(crate) fn chunks(&mut self, d: &Delta, out: &mut VecDeque<String>) {
        let scored;
        let d = if self.score_only {
            scored = prompt_only(d);
            &scored
        } else {
            d
        };
        let finish = d.finish.as_ref().map(|f| finish_str(f.reason));
        let role_bit = 1u32 << d.choice;
        if let Some(n) = self
            .running
            .as_mut()
            .and_then(|r| r.get_mut(d.choice as usize))
        {
            n.1 += d.token_ids.len() as u32;
        }
        if let Some((reasoning, text, calls, reason)) = self.read_answer(d, finish) {
            // The text the client sees is what the reader gave out.
            let finish = reason;
            let calls = (!calls.is_empty()).then_some(calls);
            let reasoning = (!reasoning.is_empty()).then_some(reasoning);
            if text.is_empty()
                && calls.is_none()
                && reasoning.is_none()
                && finish.is_none()
                && !self.carries_tokens(d)
                && self.sent_role & role_bit != 0
            {
                return;
            }
            let role = (self.sent_role & role_bit == 0).then_some("assistant");
            self.sent_role |= role_bit;
            let content = (!text.is_empty()
                || (role.is_some() && calls.is_none() && reasoning.is_none()))
            .then_some(text);
            let delta = ChatDelta {
                role,
                content,
                reasoning_content: reasoning,
                tool_calls: calls,
            };
            let json = serde_json::to_string(&self.chat_chunk_of(d, delta, finish));
            out.extend(json.ok());
            self.after_chunk(d, out);
            return;
        }
        // The echoed prompt goes out with a choice's first text.
        let mut text = std::borrow::Cow::Borrowed(d.text.as_str());
        if self.echoed & role_bit == 0
            && let Some(echo) = self.echo_of(d.choice)
        {
            text = std::borrow::Cow::Owned(format!("{echo}{}", d.text));
            self.echoed |= role_bit;
        }
        // Tokens whose text is held back still send their log probabilities (and ids).
        if text.is_empty()
            && finish.is_none()
            && !self.carries_tokens(d)
            && (self.sent_role & role_bit != 0 || self.ep == Endpoint::Completions)
        {
            return;
        }
        let json = match self.ep {
            Endpoint::Completions => {
                let echoed = text.len() - d.text.len();
                let echoed = text[..echoed].chars().count();
                let logprobs = self.completion_logprobs(d, echoed);
                let prompt_token_ids = self.first_prompt_ids(d.choice);
                serde_json::to_string(&self.completion(
                    vec![CompletionChoice {
                        index: d.choice,
                        text: text.into_owned(),
                        logprobs,
                        finish_reason: finish,
                        prompt_logprobs: None,
                        prompt_token_ids,
                        token_ids: self.ids_of(d),
                    }],
                    self.running_usage(d.choice),
                ))
            }
            Endpoint::Chat => {
                let role = (self.sent_role & role_bit == 0).then_some("assistant");
                self.sent_role |= role_bit;
                let delta = ChatDelta {
                    role,
                    content: (!d.text.is_empty() || role.is_some()).then(|| d.text.clone()),
                    ..ChatDelta::default()
                };
                serde_json::to_string(&self.chat_chunk_of(d, delta, finish))
            }
        };
        out.extend(json.ok());
        self.after_chunk(d, out);
    }

    /// After a delta's chunk: where it ends its choice, the usage chunk once every choice has
    /// ended (with `include_usage`).
    fn after_chunk(&mut self, d: &Delta, out: &mut VecDeque<String>) {
        let Some(f) = &d.finish else {
            return;
        };
        self.unfinished = self.unfinished.saturating_sub(1);
        if !self.include_usage {
            return;
        }
        self.count_usage(d.choice, &f.usage);
        if self.unfinished > 0 {
            return;
        }
        let usage = self.usage.take().map(|total| UsageOut::from(&total));
        let json = match self.ep {
            Endpoint::Completions => serde_json::to_string(&self.completion(vec![], usage)),
            Endpoint::Chat => serde_json::to_string(&self.chat_chunk(vec![], usage)),
        };
        out.extend(json.ok());
    }

    /// A `/v1/completions` body or stream chunk of this request.
    fn completion(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<UsageOut>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    /// Whether a delta that brings no text still goes out: for its tokens' log probabilities
    /// or ids, where the request asked for them.
    fn carries_tokens(&self, d: &Delta) -> bool {
        !d.logprobs.is_empty() || (self.token_ids && !d.token_ids.is_empty())
    }

    /// The stream chunk of `d`'s choice with `delta` (and `d`'s log probabilities and ids,
    /// where the request asked for them).
    fn chat_chunk_of(
        &mut self,
        d: &Delta,
        delta: ChatDelta,
        finish: Option<&'static str>,
    ) -> ChatChunk {
        let logprobs = self
            .logprobs
            .as_deref()
            .map(|tok| logprobs::chat(tok, &d.token_ids, &d.logprobs));
        let mut chunk = self.chat_chunk(
            vec![ChatChunkChoice {
                index: d.choice,
                delta,
                logprobs,
                finish_reason: finish,
                token_ids: self.ids_of(d),
            }],
            self.running_usage(d.choice),
        );
        chunk.prompt_token_ids = self.first_prompt_ids(d.choice);
        chunk
    }

    /// A `/v1/chat/completions` stream chunk of this request.
    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageOut>) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            prompt_token_ids: None,
        }
    }

    /// The whole answer: each choice's output, in index order.
    fn whole(&self, mut choices: Vec<ChoiceOutput>, usage: &v1::Usage) -> Response {
        let usage = if self.score_only {
            for c in &mut choices {
                c.text.clear();
                c.token_ids.clear();
                c.logprobs.clear();
                c.reason = FinishReason::Length;
            }
            UsageOut::from(&nothing_generated(usage.clone()))
        } else {
            UsageOut::from(usage)
        };
        let text_len: usize = (0..)
            .zip(&choices)
            .map(|(i, c)| self.echo_of(i).map_or(0, str::len) + c.text.len())
            .sum();
        // A token's log probabilities take about 60 bytes, and as many for each alternative.
        let logprobs_len: usize = choices
            .iter()
            .map(|c| {
                c.logprobs
                    .iter()
                    .chain(&c.prompt_logprobs)
                    .map(|l| 60 + 60 * l.top_ids.len())
                    .sum::<usize>()
            })
            .sum();
        let text_len = text_len + logprobs_len;
        // The fixed fields, ids and counts take about 300 bytes, a choice about 100 more; the
        // text may need escapes.
        let size =
            300 + 100 * choices.len() + self.id.len() + self.model.len() + text_len + text_len / 8;
        let tok = self.logprobs.as_deref();
        let prompt_of = |index: u32| self.prompt.get((index / self.per_prompt) as usize);
        let completion_logprobs = |c: &ChoiceOutput, index: u32| {
            let tok = tok?;
            let mut offset = self.echo_of(index).map_or(0, |e| e.chars().count() as u32);
            Some(match prompt_of(index) {
                Some(prompt) if self.prompt_scores.is_none() => logprobs::completion_with_prompt(
                    tok,
                    (prompt, &c.prompt_logprobs),
                    &c.token_ids,
                    &c.logprobs,
                    &mut offset,
                ),
                _ => logprobs::completion(tok, &c.token_ids, &c.logprobs, &mut offset),
            })
        };
        let prompt_logprobs = |c: &ChoiceOutput, index: u32| {
            let tok = self.prompt_scores.as_deref()?;
            let prompt = prompt_of(index)?;
            Some(logprobs::prompt(tok, prompt, &c.prompt_logprobs))
        };
        // Chat reports them once, beside the choices (every choice read the same prompt).
        let chat_prompt_logprobs = match self.ep {
            Endpoint::Chat => choices.first().and_then(|c| prompt_logprobs(c, 0)),
            Endpoint::Completions => None,
        };
        let indexed = choices.into_iter().zip(0..).map(|(mut c, index)| {
            let text = match self.echo_of(index) {
                None | Some("") => std::mem::take(&mut c.text),
                Some(echo) => format!("{echo}{}", c.text),
            };
            (index, text, Some(finish_str(c.reason)), c)
        });
        match self.ep {
            Endpoint::Completions => json_response(
                &self.completion(
                    indexed
                        .map(|(index, text, finish_reason, c)| CompletionChoice {
                            index,
                            text,
                            logprobs: completion_logprobs(&c, index),
                            finish_reason,
                            prompt_logprobs: prompt_logprobs(&c, index),
                            prompt_token_ids: self.prompt_ids_of(index),
                            token_ids: self.token_ids.then(|| c.token_ids.clone()),
                        })
                        .collect(),
                    Some(usage),
                ),
                size,
            ),
            Endpoint::Chat => json_response(
                &ChatResponse {
                    id: self.id.clone(),
                    object: "chat.completion",
                    created: self.created,
                    model: self.model.clone(),
                    choices: indexed
                        .map(|(index, content, finish_reason, c)| {
                            let (reasoning_content, content, tool_calls, finish_reason) =
                                read_whole(&self.tools, self.answers, content, finish_reason);
                            ChatChoice {
                                index,
                                message: ChatMessageOut {
                                    role: "assistant",
                                    content,
                                    reasoning_content,
                                    tool_calls,
                                },
                                logprobs: tok
                                    .map(|tok| logprobs::chat(tok, &c.token_ids, &c.logprobs)),
                                finish_reason,
                                token_ids: self.token_ids.then(|| c.token_ids.clone()),
                            }
                        })
                        .collect(),
                    usage,
                    prompt_logprobs: chat_prompt_logprobs,
                    // Every choice read the same prompt.
                    prompt_token_ids: self.prompt_ids_of(0),
                },
                size,
            ),
        }
    }
}

/// A whole chat answer read for thinking and tool calls: its thinking (where the model
/// thought), its text (null when it is only calls), its calls and its finish reason.
#[allow(clippy::type_complexity)]
fn read_whole(
    mode: &Mode,
    readers: Readers,
    text: String,
    finish: Option<&'static str>,
) -> (
    Option<String>,
    Option<String>,
    Vec<ToolCallOut>,
    Option<&'static str>,
) {
    let Some(mut reader) = AnswerReader::new(mode, readers) else {
        return (None, Some(text), Vec::new(), finish);
    };
    let read = reader.read(&text, true);
    let calls = call_parts(read.calls, false);
    let finish = finish.map(|f| reader.finish_reason(f));
    let text = (!read.text.is_empty() || calls.is_empty()).then_some(read.text);
    let thought = (!read.reasoning.is_empty()).then_some(read.reasoning);
    (thought, text, calls, finish)
}

/// Calls, or the parts of them a stream chunk carries, in OpenAI's shape; in a stream
/// (`streamed`) each part carries its index, and its id, type and name on its first part.
fn call_parts(parts: Vec<tools::CallPart>, streamed: bool) -> Vec<ToolCallOut> {
    parts
        .into_iter()
        .map(|p| ToolCallOut {
            index: streamed.then_some(p.index),
            kind: p.id.is_some().then_some("function"),
            id: p.id,
            function: FunctionCallOut {
                name: p.name,
                arguments: p.arguments,
            },
        })
        .collect()
}

/// What `echo` asks for.
pub(crate) struct Echo {
    /// Each prompt's text.
    texts: Vec<String>,
    /// Nothing generated is sent (`max_tokens: 0`).
    score_only: bool,
}

/// `d` without what was generated: a score-only request's view (its prompt's log probabilities,
/// and an end at the length limit with no completion tokens).
fn prompt_only(d: &Delta) -> Delta {
    Delta {
        token_ids: Vec::new(),
        logprobs: Vec::new(),
        prompt_logprobs: d.prompt_logprobs.clone(),
        text: String::new(),
        finish: d.finish.clone().map(|mut f| {
            f.reason = FinishReason::Length;
            f.usage = nothing_generated(f.usage);
            f
        }),
        choice: d.choice,
        joins: Vec::new(),
    }
}

/// `usage` with no completion tokens.
fn nothing_generated(mut usage: v1::Usage) -> v1::Usage {
    usage.completion_tokens = 0;
    usage.by_model.clear();
    usage.handoffs = 0;
    usage
}

/// One choice of a whole answer.
struct ChoiceOutput {
    text: String,
    reason: FinishReason,
    /// The tokens and their log probabilities, where the request asked for them (else both
    /// empty; the tokens alone where it asked for their ids).
    token_ids: Vec<u32>,
    logprobs: Vec<v1::TokenLogprobs>,
    /// The prompt's log probabilities, where the request asked for them (echo with logprobs).
    prompt_logprobs: Vec<v1::TokenLogprobs>,
}

/// One generation's whole output.
struct Output {
    choice: ChoiceOutput,
    usage: v1::Usage,
    /// The prefill path the decode worker took.
    path: crate::policy::PrefillPath,
}

/// Collects one generation's whole output; its token ids where `ids` (or log probabilities)
/// are asked for.
async fn collect(mut rs: ResponseStream, ids: bool) -> Result<Output, ApiError> {
    let mut text = String::new();
    let (mut token_ids, mut logprobs, mut prompt_logprobs) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(item) = rs.next().await {
        let d = item?;
        text.push_str(&d.text);
        if ids || !d.logprobs.is_empty() {
            token_ids.extend_from_slice(&d.token_ids);
        }
        logprobs.extend(d.logprobs);
        prompt_logprobs.extend(d.prompt_logprobs);
        if let Some(f) = d.finish {
            return Ok(Output {
                choice: ChoiceOutput {
                    text,
                    reason: f.reason,
                    token_ids,
                    logprobs,
                    prompt_logprobs,
                },
                usage: f.usage,
                path: rs.path(),
            });
        }
    }
    Err(ApiError::from(rs.truncated()))
}

//! `POST /tokenize` and `POST /detokenize` (vLLM's and SGLang's extensions): the token ids the
//! router would send for a prompt or a conversation (the model's chat template applied, with
//! the request's tools and template variables), and the text of token ids. What a client needs
//! to count tokens, or to see the prompt a tool template renders.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use super::types::{ChatMessageIn, OtherFields};
use crate::dispatch::Prompt;
use crate::error::DispatchError;
use crate::tokenizer::ChatExtras;

/// `/tokenize`: a `prompt`, or chat `messages` (with `tools` and the fields that shape the
/// rendering: `chat_template_kwargs`, `add_generation_prompt`, ...), and vLLM's
/// `add_special_tokens`.
#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessageIn>>,
    #[serde(flatten)]
    other: OtherFields,
}

/// `/detokenize`: token ids.
#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
}

/// A JSON body, or 400 in OpenAI's shape.
fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}"), None))
}

/// 404 unless `model` is absent or the served one.
fn check_model(st: &AppState, model: Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if !m.is_empty() && m != st.dispatcher.config().model => {
            Err(DispatchError::ModelNotFound(m).into())
        }
        _ => Ok(()),
    }
}

pub(crate) async fn tokenize(State(st): State<AppState>, body: axum::body::Body) -> Response {
    answer(tokenized(st, body).await)
}

pub(crate) async fn detokenize(State(st): State<AppState>, body: axum::body::Body) -> Response {
    answer(detokenized(st, body).await)
}

fn answer(r: Result<serde_json::Value, ApiError>) -> Response {
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn tokenized(st: AppState, body: axum::body::Body) -> Result<serde_json::Value, ApiError> {
    let mut req: TokenizeRequest = parse(&super::public::read_body(body).await?)?;
    check_model(&st, req.model.take())?;
    // vLLM's: the BOS token a text prompt gets by default (a conversation's template writes
    // its own).
    let add_special = req
        .other
        .take_flag("add_special_tokens")
        .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
    let prompt = match (req.prompt, req.messages) {
        (Some(text), None) => Prompt::Text(text),
        (None, Some(messages)) => {
            // The parser decides how an answer is read, which tokenizing does not do: any
            // will let the tools through to the template.
            let tools =
                crate::tools::take(&mut req.other, Some(crate::tools::ToolCallParser::Hermes))
                    .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
            let extras = req
                .other
                .take_chat_extras(st.dispatcher.config().trust_request_chat_template)
                .map_err(|(field, message)| ApiError::invalid(message, Some(field)))?;
            Prompt::Chat {
                messages: super::completions::chat_messages(messages)?,
                extras: Box::new(ChatExtras {
                    tools: tools.tools,
                    ..extras
                }),
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "send either prompt (text) or messages (a conversation)",
                Some("prompt"),
            ));
        }
    };
    let tokens = tokenize_off_thread(&st, prompt, add_special).await?;
    Ok(serde_json::json!({
        "count": tokens.len(),
        "max_model_len": st.dispatcher.context_length(),
        "tokens": tokens,
    }))
}

/// `prompt`'s tokens, as a request would send them, computed on the blocking pool (a template
/// or a long text takes milliseconds: not on the serving thread).
pub(crate) async fn tokenize_off_thread(
    st: &AppState,
    prompt: Prompt,
    add_special: Option<bool>,
) -> Result<Vec<u32>, ApiError> {
    let d = st.dispatcher.clone();
    tokio::task::spawn_blocking(move || d.tokenize(prompt, None, add_special))
        .await
        .map_err(|e| ApiError::from(DispatchError::Internal(format!("tokenizing failed: {e}"))))?
        .map_err(ApiError::from)
}

async fn detokenized(st: AppState, body: axum::body::Body) -> Result<serde_json::Value, ApiError> {
    let req: DetokenizeRequest = parse(&super::public::read_body(body).await?)?;
    check_model(&st, req.model)?;
    let tokenizer = st.dispatcher.tokenizer();
    let vocab = tokenizer.vocab_size();
    if let Some(bad) = req.tokens.iter().find(|&&t| t >= vocab) {
        return Err(ApiError::invalid(
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
            Some("tokens"),
        ));
    }
    Ok(serde_json::json!({ "prompt": tokenizer.decode(&req.tokens) }))
}

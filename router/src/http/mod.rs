//! The OpenAI-compatible HTTP API (`/v1/completions`, `/v1/chat/completions`, `/v1/models`),
//! API keys checked before anything else; and the operators' listener (`/metrics`, `/health`).

mod completions;
pub mod cors;
pub mod error;
mod extras;
mod generate;
mod generate_answers;
mod logprobs;
mod message_events;
mod messages;
mod public;
mod response_events;
pub mod response_store;
pub mod response_store_etcd;
mod responses;
mod sse;
mod tokenize;
pub mod types;

use std::sync::{Arc, LazyLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::admission::InflightLimit;
use crate::auth::{KeySet, Verdict};
use crate::dispatch::Dispatcher;
use crate::shard::ShardListener;
use error::ApiError;
pub use public::PublicApi;

/// Largest request body: a 128k-token prompt as JSON token ids is under 1 MiB; leave room.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// When this process began serving its model (Unix seconds): `/v1/models`' `created`, as
/// vLLM reports it (OpenAI's is the model's release date, which a served file does not carry).
static SERVING_SINCE: LazyLock<u64> = LazyLock::new(|| {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
});

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Runs requests.
    pub dispatcher: Arc<Dispatcher>,
    /// Renders `/metrics` (absent: no recorder installed).
    pub metrics: Option<PrometheusHandle>,
    /// API keys the public routes require (`None`: none required).
    pub api_keys: Option<KeySet>,
    /// The router's in-flight limit (shared with the gRPC listeners).
    pub limit: InflightLimit,
    /// Responses kept for `previous_response_id` (`--responses-store` in memory,
    /// `--responses-etcd-ttl` in etcd).
    pub responses: response_store::ResponseStore,
}

/// The public HTTP API: the inference routes' POSTs straight from hyper's request (see
/// `public.rs`), the rest through axum.
pub fn router(state: AppState) -> PublicApi {
    LazyLock::force(&SERVING_SINCE);
    let rest = Router::new()
        .route("/v1/completions", any(public::post_only))
        .route("/v1/chat/completions", any(public::post_only))
        .route("/v1/responses", any(public::post_only))
        .route("/v1/messages", any(public::post_only))
        // SGLang's native API.
        .route("/generate", any(public::post_only))
        .route("/get_model_info", get(generate::model_info))
        // Anthropic's token counting.
        .route(
            "/v1/messages/count_tokens",
            axum::routing::post(messages::count_tokens),
        )
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/models", get(models))
        // OpenAI's "retrieve model" (`client.models.retrieve`); ids may hold `/` (Hugging Face
        // names), hence the wildcard.
        .route("/v1/models/{*model}", get(model))
        // vLLM's and SGLang's token counting.
        .route("/tokenize", axum::routing::post(tokenize::tokenize))
        .route("/detokenize", axum::routing::post(tokenize::detokenize))
        // First thing on every route (unknown paths too): no key, no answer beyond 401.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        // Bodies past the limit are refused with 413 before any parsing.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state.clone());
    PublicApi::new(state, rest)
}

/// The operators' routes: `/metrics` and `/health`, on their own listener.
pub fn ops_router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
        .with_state(state)
}

/// 401 in OpenAI's shape, before the body is read, unless the request carries a valid key.
async fn require_api_key(
    State(st): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match key_refusal(&st, req.headers()) {
        None => next.run(req).await,
        Some(refusal) => refusal,
    }
}

/// The 401 a request with `headers` gets when it has no valid key (`None`: admitted).
fn key_refusal(st: &AppState, headers: &HeaderMap) -> Option<Response> {
    // Anthropic's clients send the key as `x-api-key`.
    let anthropic = headers
        .get("x-api-key")
        .filter(|_| !headers.contains_key(header::AUTHORIZATION))
        .map(|k| [&b"Bearer "[..], k.as_bytes()].concat());
    let key = match &anthropic {
        Some(k) => Some(k.as_slice()),
        None => headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()),
    };
    let message = match Verdict::of(st.api_keys.as_ref(), key) {
        Verdict::Admitted => return None,
        Verdict::Missing => {
            "You didn't provide an API key. Send it in the Authorization header: \
             `Authorization: Bearer YOUR_KEY`."
        }
        Verdict::Wrong => "Incorrect API key provided.",
    };
    let mut resp = ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("invalid_api_key"),
    }
    .into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    Some(resp)
}

/// The served model's card, as `/v1/models` lists it.
fn model_card(st: &AppState) -> serde_json::Value {
    serde_json::json!({
        "id": st.dispatcher.config().model,
        "object": "model",
        "created": *SERVING_SINCE,
        "owned_by": "dolphin",
        "max_model_len": st.dispatcher.context_length(),
    })
}

async fn models(State(st): State<AppState>) -> Response {
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [model_card(&st)],
    }))
    .into_response()
}

/// One model's card, or 404 `model_not_found` in OpenAI's shape.
async fn model(
    State(st): State<AppState>,
    axum::extract::Path(model): axum::extract::Path<String>,
) -> Response {
    if model != st.dispatcher.config().model {
        return ApiError::from(crate::error::DispatchError::ModelNotFound(model)).into_response();
    }
    axum::Json(model_card(&st)).into_response()
}

async fn health(State(st): State<AppState>) -> Response {
    let (prefill, decode) = st.dispatcher.registry().counts();
    axum::Json(serde_json::json!({
        "status": "ok",
        "prefill_workers": prefill,
        "decode_workers": decode,
        "policy": st.dispatcher.policy().name(),
    }))
    .into_response()
}

async fn metrics_text(State(st): State<AppState>) -> Response {
    match &st.metrics {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled\n").into_response(),
    }
}

/// Serves `app` on the connections one shard is dealt until `shutdown` fires; open
/// connections then finish their requests.
pub(crate) async fn serve(
    listener: ShardListener,
    app: PublicApi,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests;

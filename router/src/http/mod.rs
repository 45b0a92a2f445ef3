//! The OpenAI-compatible HTTP API: `/v1/completions`, `/v1/chat/completions`, `/v1/models`,
//! `/health`, `/metrics`.

mod completions;
pub mod error;
pub mod types;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::dispatch::Dispatcher;
use crate::shard::ShardListener;
use error::ApiError;

/// Largest request body: a 128k-token prompt as JSON token ids is under 1 MiB; leave room.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Runs requests.
    pub dispatcher: Arc<Dispatcher>,
    /// Renders `/metrics` (absent: no recorder installed).
    pub metrics: Option<PrometheusHandle>,
}

/// The HTTP routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
        .method_not_allowed_fallback(|| async {
            ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                message: "method not allowed".into(),
                kind: "invalid_request_error",
                param: None,
                code: None,
            }
        })
        // Bodies past the limit are refused with 413 before any parsing.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn models(State(st): State<AppState>) -> Response {
    let cfg = st.dispatcher.config();
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": cfg.model,
            "object": "model",
            "created": 0,
            "owned_by": "dolphin",
            "max_model_len": cfg.max_prompt_tokens,
        }],
    }))
    .into_response()
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
    app: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests;

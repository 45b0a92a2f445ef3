//! The public listener's service: `POST /v1/completions` and `POST /v1/chat/completions` straight
//! from hyper's request, every other request through axum's [`Router`].
//!
//! Why not axum for the two inference routes too: callgrind counted about 11k instructions a
//! request in axum's routing, its middleware (`from_fn` for the keys, the route layer for the
//! in-flight limit, the body limit) and its extractors (a `HeaderMap` clone, the body collected
//! through two boxes), beside a handler of 60k: the largest piece of the router's CPU per
//! request that was not the request's own work (`docs/dev/profiling.md`). The two routes do the
//! same checks in the same order here (key, then a slot of the in-flight limit, then the body
//! limit), with the same answers, in straight-line code.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Method, header};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower::ServiceExt;

use super::completions::{self, Endpoint};
use super::cors::Cors;
use super::error::ApiError;
use super::{AppState, MAX_BODY_BYTES};
use crate::admission::PermitBody;
use crate::stream::Api;

/// The public HTTP API (see the module doc). Cheap to clone: hyper clones the service for
/// every request.
#[derive(Clone, Debug)]
pub struct PublicApi(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    state: AppState,
    /// Everything but the two inference routes' POSTs.
    rest: Router,
    /// Origins browsers may call from (`None`: no CORS).
    cors: Option<Cors>,
}

impl PublicApi {
    /// The two inference routes over `state`, and `rest` for every other request.
    pub(crate) fn new(state: AppState, rest: Router) -> Self {
        Self(Arc::new(Inner {
            state,
            rest,
            cors: None,
        }))
    }

    /// The same API answering browsers from other origins as `cors` allows.
    pub fn with_cors(self, cors: Option<Cors>) -> Self {
        Self(Arc::new(Inner {
            state: self.0.state.clone(),
            rest: self.0.rest.clone(),
            cors,
        }))
    }

    /// A request to its route: the inference POSTs here, the rest through axum.
    fn route(&self, req: Request) -> ResponseFuture {
        match inference_route(&req) {
            Some(route) => {
                let inner = Arc::clone(&self.0);
                Box::pin(async move { Ok(inner.inference(route, req).await) })
            }
            None => Box::pin(self.0.rest.clone().oneshot(req)),
        }
    }
}

/// An inference route.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// OpenAI's completions or chat completions.
    OpenAi(Endpoint),
    /// OpenAI's Responses API (`responses.rs`).
    Responses,
    /// Anthropic's Messages API (`messages.rs`), which answers errors in its own shape.
    Messages,
    /// SGLang's native `/generate` (`generate.rs`).
    Generate,
}

/// The inference route a request is for, if it is a POST to one.
fn inference_route(req: &Request) -> Option<Route> {
    if req.method() != Method::POST {
        return None;
    }
    match req.uri().path() {
        "/v1/completions" => Some(Route::OpenAi(Endpoint::Completions)),
        "/v1/chat/completions" => Some(Route::OpenAi(Endpoint::Chat)),
        "/v1/responses" => Some(Route::Responses),
        "/v1/messages" => Some(Route::Messages),
        "/generate" => Some(Route::Generate),
        _ => None,
    }
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl tower::Service<Request> for PublicApi {
    type Response = Response;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> ResponseFuture {
        let Some(cors) = &self.0.cors else {
            return self.route(req);
        };
        // Preflights carry no key: answered before the key check.
        if let Some(answer) = cors.preflight(&req) {
            return Box::pin(std::future::ready(Ok(answer)));
        }
        let Some(allow) = cors.for_request(req.headers()) else {
            return self.route(req);
        };
        let (inner, answer) = (Arc::clone(&self.0), self.route(req));
        Box::pin(async move {
            let mut answer = answer.await?;
            if let Some(cors) = &inner.cors {
                cors.decorate(allow, answer.headers_mut());
            }
            Ok(answer)
        })
    }
}

impl Inner {
    /// A request for one of the inference routes, answered in full.
    async fn inference(&self, route: Route, req: Request) -> Response {
        let st = &self.state;
        // First: no key, no answer beyond 401 (as on every other route).
        if let Some(refusal) = super::key_refusal(st, req.headers()) {
            return refusal;
        }
        // A compressed body would fail as JSON with a misleading message: say what is wrong.
        if let Some(refusal) = encoding_refusal(req.headers()) {
            return refusal.into_response();
        }
        // Then a slot, before the body is read: a full router answers 429 at once. The slot
        // travels in the response body and is freed when the body ends (a whole SSE stream).
        let permit = match st.limit.try_admit(Api::Http) {
            Ok(permit) => permit,
            Err(busy) => return ApiError::from(busy).into_response(),
        };
        let (parts, body) = req.into_parts();
        let answered = match read_body(body).await {
            Err(e) => Err(e),
            Ok(bytes) => match route {
                Route::OpenAi(Endpoint::Completions) => {
                    match parse(&bytes)
                        .and_then(|r| completions::completions(st, &parts.headers, r))
                    {
                        Ok(prepared) => completions::run(st, prepared).await,
                        Err(e) => Err(e),
                    }
                }
                Route::OpenAi(Endpoint::Chat) => {
                    match parse(&bytes).and_then(|r| completions::chat(st, &parts.headers, r)) {
                        Ok(prepared) => completions::run(st, prepared).await,
                        Err(e) => Err(e),
                    }
                }
                // The Responses and Messages APIs' futures are boxed: inline, the largest of
                // them (Responses: 10 KB to prepare, 15 KB to run) set the size of every
                // request's future, and each request copied all of it into its box (17 KB,
                // against 3.7 KB for a completion's).
                Route::Responses => match parse(&bytes) {
                    Ok(r) => match Box::pin(super::responses::prepare(st, &parts.headers, r)).await
                    {
                        Ok((prepared, echo)) => {
                            Box::pin(super::responses::run(st, prepared, echo)).await
                        }
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                },
                Route::Generate => Box::pin(super::generate::run(st, &parts.headers, &bytes)).await,
                Route::Messages => {
                    match parse(&bytes)
                        .and_then(|r| super::messages::prepare(st, &parts.headers, r))
                    {
                        Ok((prepared, model)) => {
                            Box::pin(super::messages::run(st, prepared, model)).await
                        }
                        Err(e) => Err(e),
                    }
                }
            },
        };
        match (answered, route) {
            (Ok(response), _) => {
                response.map(|body| Body::new(PermitBody::new(body, Some(permit))))
            }
            (Err(e), Route::Messages) => super::messages::error_response(e),
            (Err(e), _) => e.into_response(),
        }
    }
}

/// Most bytes of a refused body read and thrown away after the 413, within
/// [`DRAIN_TIMEOUT`]: a client that writes its whole body before reading (Python's
/// `http.client`, `requests`) then gets the answer instead of a reset connection, as nginx's
/// lingering close gives it. A larger or slower body is cut off (the connection closes).
const DRAIN_BYTES: u64 = 64 << 20;
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The whole request body, at most [`MAX_BODY_BYTES`] (413 past it, before reading when the
/// length is announced; the rest is drained, see [`DRAIN_BYTES`]).
pub(super) async fn read_body(mut body: Body) -> Result<Bytes, ApiError> {
    if body.size_hint().lower() > MAX_BODY_BYTES as u64 {
        drain(body);
        return Err(ApiError::payload_too_large());
    }
    match Limited::new(&mut body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => {
            drain(body);
            Err(ApiError::payload_too_large())
        }
        Err(e) => Err(ApiError::invalid(
            format!("cannot read the request body: {e}"),
            None,
        )),
    }
}

/// Reads the rest of a refused body in the background and throws it away, up to
/// [`DRAIN_BYTES`] and [`DRAIN_TIMEOUT`]; a body announced larger is dropped at once.
fn drain(mut body: Body) {
    if body.size_hint().lower() > DRAIN_BYTES {
        return;
    }
    tokio::spawn(async move {
        let mut left = DRAIN_BYTES;
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while let Some(Ok(frame)) = body.frame().await {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                match left.checked_sub(n) {
                    Some(rest) => left = rest,
                    None => break,
                }
            }
        })
        .await;
    });
}

/// 415 unless the body comes as sent (no `content-encoding`, or `identity`).
fn encoding_refusal(headers: &header::HeaderMap) -> Option<ApiError> {
    let encoding = headers.get(header::CONTENT_ENCODING)?;
    let encoding = encoding.to_str().map_or("(not text)", str::trim);
    (!encoding.is_empty() && !encoding.eq_ignore_ascii_case("identity"))
        .then(|| ApiError::unsupported_encoding(encoding))
}

/// A JSON request body (any content type: clients often omit it).
fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}"), None))
}

/// 405 for the inference routes' paths with a method other than POST (the POSTs never reach
/// axum's router, which lists the paths only for this).
pub(crate) async fn post_only() -> Response {
    let mut resp = ApiError::method_not_allowed().into_response();
    resp.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    resp
}

/// `axum::serve` asks for a service per connection: the same one.
impl<'a, L: axum::serve::Listener> tower::Service<axum::serve::IncomingStream<'a, L>>
    for PublicApi
{
    type Response = PublicApi;
    type Error = Infallible;
    type Future = std::future::Ready<Result<PublicApi, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: axum::serve::IncomingStream<'a, L>) -> Self::Future {
        std::future::ready(Ok(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use tower::Service;

    use super::*;
    use crate::admission::InflightLimit;
    use crate::policy::Policy;
    use crate::request_log::RequestLog;

    /// Every request's future is boxed at once (and copied into the box whole), so it must not
    /// carry the larger APIs' futures inline: the handler's future stays smaller than running
    /// a Responses request alone (it was 17 KB with that inline, 4.9 KB without).
    #[tokio::test]
    async fn the_handler_future_does_not_carry_the_responses_api_inline() {
        let state = AppState {
            dispatcher: crate::testutil::dispatcher(Policy::AlwaysLocal, RequestLog::disabled()),
            metrics: None,
            api_keys: None,
            limit: InflightLimit::new(16),
            responses: super::super::response_store::ResponseStore::new(4),
        };
        let mut app = super::super::router(state.clone());
        let req = Request::post("/v1/completions")
            .body(Body::empty())
            .expect("request");
        let handler = app.call(req);
        let handler_bytes = std::mem::size_of_val(&*handler);
        let chat: crate::http::types::ChatRequest =
            parse(br#"{"messages": [{"role": "user", "content": "hi"}]}"#).expect("chat");
        let prepared = completions::chat(&state, &http::HeaderMap::new(), chat).expect("prepared");
        let responses = super::super::responses::run(&state, prepared, Default::default());
        let responses_bytes = std::mem::size_of_val(&responses);
        assert!(
            handler_bytes < responses_bytes,
            "handler future {handler_bytes} bytes, a Responses run alone {responses_bytes}"
        );
    }
}

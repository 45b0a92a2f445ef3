//! Cross-origin requests from browsers (CORS) on the public HTTP API, when the operator names
//! the origins (`--cors-allowed-origins`); without them no CORS header is ever sent and a
//! preflight gets 405, as before.
//!
//! A browser app calling the API from another origin first sends a preflight (`OPTIONS` with
//! `Origin` and `Access-Control-Request-Method`), which carries no credentials: it is answered
//! here, before the key check. The real request then goes through the key check like any other,
//! and its answer (an error included, so the app can read a 401) carries
//! `Access-Control-Allow-Origin`. Keys travel in `Authorization`, never in cookies, so `*` is
//! safe to allow and credentials are never allowed. vLLM and SGLang answer CORS the same way
//! (allowing every origin by default; here the operator opts in).

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;

/// Methods the public API serves.
const ALLOW_METHODS: HeaderValue = HeaderValue::from_static("GET, POST, OPTIONS");
/// Headers the public API answers with that a browser app may read (beyond the few it always
/// may): the request id and how the request was routed.
const EXPOSE_HEADERS: HeaderValue = HeaderValue::from_static(
    "x-request-id, x-dolphin-decode-worker, x-dolphin-prefill-worker, x-dolphin-prefill-mode, \
     x-dolphin-prefill-path, x-dolphin-policy",
);
/// How long a browser may reuse a preflight's answer (Chromium caps it at 2 hours).
const MAX_AGE: HeaderValue = HeaderValue::from_static("7200");
/// When the answer depends on the origin asked for, caches must key on it.
const VARY_PREFLIGHT: HeaderValue = HeaderValue::from_static(
    "origin, access-control-request-method, access-control-request-headers",
);
const VARY_ORIGIN: HeaderValue = HeaderValue::from_static("origin");
const ANY: HeaderValue = HeaderValue::from_static("*");

/// Which origins may call the API from a browser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cors {
    /// Every origin (`*`).
    Any,
    /// These origins exactly (`scheme://host[:port]`, as browsers send them).
    Origins(Vec<HeaderValue>),
}

/// A `--cors-allowed-origins` entry that is not an origin.
#[derive(Debug, thiserror::Error)]
#[error(
    "--cors-allowed-origins: {0:?} is not an origin (scheme://host[:port], no path), nor * alone"
)]
pub struct BadOrigin(String);

impl Cors {
    /// From the flag's values: none is `None` (no CORS), `*` alone is every origin, else each
    /// must be an origin as a browser sends it (a trailing `/` is dropped).
    pub fn from_flag(values: &[String]) -> Result<Option<Cors>, BadOrigin> {
        let values: Vec<&str> = values
            .iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .collect();
        match values.as_slice() {
            [] => Ok(None),
            ["*"] => Ok(Some(Cors::Any)),
            _ => values
                .iter()
                .map(|v| origin(v).ok_or_else(|| BadOrigin((*v).to_owned())))
                .collect::<Result<_, _>>()
                .map(|list| Some(Cors::Origins(list))),
        }
    }

    /// The `Access-Control-Allow-Origin` value for a request's `Origin`, if it is allowed.
    fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match self {
            Cors::Any => Some(ANY),
            Cors::Origins(list) => list.contains(origin).then(|| origin.clone()),
        }
    }

    /// The answer to a preflight, or `None` when `req` is not one (it then goes on).
    pub fn preflight(&self, req: &Request) -> Option<Response> {
        let headers = req.headers();
        if req.method() != Method::OPTIONS || !headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD) {
            return None;
        }
        let origin = headers.get(ORIGIN)?;
        let mut resp = Response::new(Body::empty());
        *resp.status_mut() = StatusCode::NO_CONTENT;
        let out = resp.headers_mut();
        out.insert(VARY, VARY_PREFLIGHT);
        // An origin not allowed gets no CORS header: the browser then refuses the call.
        if let Some(allow) = self.allow(origin) {
            out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            out.insert(ACCESS_CONTROL_ALLOW_METHODS, ALLOW_METHODS);
            // Any header the app wants to send (`authorization`, `content-type`,
            // `x-request-id`, `traceparent`...): the server reads what it knows.
            if let Some(asked) = headers.get(ACCESS_CONTROL_REQUEST_HEADERS) {
                out.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
            }
            out.insert(ACCESS_CONTROL_MAX_AGE, MAX_AGE);
        }
        Some(resp)
    }

    /// What a request's answer must carry, from its headers (before the request is consumed):
    /// `None` when it has no `Origin` or the origin is not allowed.
    pub fn for_request(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        self.allow(headers.get(ORIGIN)?)
    }

    /// Adds the CORS headers to an answer to an allowed origin.
    pub fn decorate(&self, allow: HeaderValue, headers: &mut HeaderMap) {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSE_HEADERS);
        if matches!(self, Cors::Origins(_)) {
            headers.append(VARY, VARY_ORIGIN);
        }
    }
}

/// `value` as a browser's `Origin` header: `http(s)://host[:port]`, lowercase scheme and host,
/// nothing after the authority (a single trailing `/` is dropped).
fn origin(value: &str) -> Option<HeaderValue> {
    let value = value.strip_suffix('/').unwrap_or(value);
    let (scheme, authority) = value.split_once("://")?;
    let scheme_ok = scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https");
    let authority_ok = !authority.is_empty()
        && !authority.contains(['/', '?', '#', '@', ' '])
        && authority.parse::<axum::http::uri::Authority>().is_ok();
    (scheme_ok && authority_ok)
        .then(|| HeaderValue::from_str(&value.to_ascii_lowercase()).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(values: &[&str]) -> Result<Option<Cors>, BadOrigin> {
        Cors::from_flag(&values.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn the_flag_names_origins_or_any() {
        assert_eq!(flag(&[]).expect("ok"), None);
        assert_eq!(flag(&[" "]).expect("ok"), None);
        assert_eq!(flag(&["*"]).expect("ok"), Some(Cors::Any));
        assert_eq!(
            flag(&["https://App.example/", "http://localhost:3000"]).expect("ok"),
            Some(Cors::Origins(vec![
                HeaderValue::from_static("https://app.example"),
                HeaderValue::from_static("http://localhost:3000"),
            ]))
        );
        for bad in [
            "app.example",
            "ftp://app.example",
            "https://app.example/path",
            "https://",
            "https://a b",
            "https://user@app.example",
        ] {
            let e = flag(&[bad]).expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
        // `*` only means every origin alone.
        assert!(flag(&["*", "https://app.example"]).is_err());
    }

    fn preflight(cors: &Cors, origin: &str) -> Option<Response> {
        let req = Request::builder()
            .method(Method::OPTIONS)
            .uri("/v1/chat/completions")
            .header(ORIGIN, origin)
            .header(ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .header(
                ACCESS_CONTROL_REQUEST_HEADERS,
                "authorization, content-type",
            )
            .body(Body::empty())
            .expect("request");
        cors.preflight(&req)
    }

    #[test]
    fn preflights_are_answered_for_allowed_origins_only() {
        let cors = flag(&["https://app.example"]).expect("ok").expect("some");
        let resp = preflight(&cors, "https://app.example").expect("a preflight");
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        let h = resp.headers();
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example");
        assert_eq!(
            h[ACCESS_CONTROL_ALLOW_HEADERS],
            "authorization, content-type"
        );
        assert!(
            h[ACCESS_CONTROL_ALLOW_METHODS]
                .to_str()
                .expect("text")
                .contains("POST")
        );
        assert!(!h.contains_key("access-control-allow-credentials"));

        let other = preflight(&cors, "https://evil.example").expect("a preflight");
        assert_eq!(other.status(), StatusCode::NO_CONTENT);
        assert!(!other.headers().contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));

        let any = preflight(&Cors::Any, "https://evil.example").expect("a preflight");
        assert_eq!(any.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], "*");

        // An OPTIONS without the preflight's headers is an ordinary request.
        let plain = Request::builder()
            .method(Method::OPTIONS)
            .uri("/v1/models")
            .header(ORIGIN, "https://app.example")
            .body(Body::empty())
            .expect("request");
        assert!(cors.preflight(&plain).is_none());
    }

    #[test]
    fn answers_carry_the_allowed_origin() {
        let cors = flag(&["https://app.example"]).expect("ok").expect("some");
        let mut asked = HeaderMap::new();
        assert_eq!(cors.for_request(&asked), None, "no Origin, no CORS");
        asked.insert(ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert_eq!(cors.for_request(&asked), None);
        asked.insert(ORIGIN, HeaderValue::from_static("https://app.example"));
        let allow = cors.for_request(&asked).expect("allowed");
        let mut out = HeaderMap::new();
        out.insert(VARY, HeaderValue::from_static("accept-encoding"));
        cors.decorate(allow, &mut out);
        assert_eq!(out[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example");
        assert!(
            out[ACCESS_CONTROL_EXPOSE_HEADERS]
                .to_str()
                .expect("text")
                .contains("x-request-id")
        );
        let vary: Vec<_> = out.get_all(VARY).iter().collect();
        assert_eq!(vary, ["accept-encoding", "origin"]);
    }
}

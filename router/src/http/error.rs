//! Errors in OpenAI's JSON shape, `{"error":{"message","type","param","code"}}`, with the
//! matching HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::{DispatchError, ErrorKind};

/// An error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    /// The offending parameter, when known.
    pub param: Option<&'static str>,
    /// OpenAI's error `code`, when it has one.
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 invalid-request error.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// A 413 for a request body past the limit.
    pub fn payload_too_large() -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: "the request body is too large".into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// A 415 for a request body in a content encoding the server does not decode.
    pub fn unsupported_encoding(encoding: &str) -> Self {
        Self {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!(
                "request bodies with content-encoding {encoding:?} are not supported: send the JSON uncompressed"
            ),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// A 405 for a method the path does not serve.
    pub fn method_not_allowed() -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: "method not allowed".into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// A 404 for an unknown path.
    pub fn no_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("unknown_url"),
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#.into()
        })
    }
}

impl From<DispatchError> for ApiError {
    fn from(e: DispatchError) -> Self {
        let (status, kind) = match e.kind() {
            ErrorKind::InvalidRequest => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "invalid_request_error"),
            ErrorKind::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            ErrorKind::Unavailable => {
                (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error")
            }
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
            ErrorKind::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
        };
        let param = match &e {
            DispatchError::ModelNotFound(_) => Some("model"),
            DispatchError::BadLogitRule(e) => Some(e.field),
            DispatchError::BadFormat { field, .. } | DispatchError::InvalidField { field, .. } => {
                Some(*field)
            }
            _ => None,
        };
        let code = e.openai_code().or(match e.kind() {
            ErrorKind::Overloaded => Some("rate_limit_exceeded"),
            _ => None,
        });
        Self {
            status,
            message: e.to_string(),
            kind,
            param,
            code,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.to_json(),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(e: &ApiError) -> serde_json::Value {
        serde_json::from_str(&e.to_json()).expect("json")
    }

    #[test]
    fn shape_has_all_four_fields() {
        let e = ApiError::invalid("bad", Some("max_tokens"));
        let v = json(&e);
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "max_tokens");
        assert!(
            v["error"]
                .get("code")
                .is_some_and(serde_json::Value::is_null)
        );
    }

    #[test]
    fn dispatch_errors_map_to_statuses() {
        let cases = [
            (DispatchError::InvalidRequest("x".into()), 400),
            (
                DispatchError::PromptTooLong {
                    tokens: 9,
                    limit: 8,
                },
                400,
            ),
            (DispatchError::ModelNotFound("m".into()), 404),
            (DispatchError::RouterBusy(1), 429),
            (DispatchError::NoDecodeWorkers, 503),
            (
                DispatchError::Worker {
                    worker: "d".into(),
                    status: tonic::Status::resource_exhausted("full"),
                },
                429,
            ),
            (
                DispatchError::Worker {
                    worker: "d".into(),
                    status: tonic::Status::invalid_argument("ctx"),
                },
                400,
            ),
            (
                DispatchError::Worker {
                    worker: "d".into(),
                    status: tonic::Status::internal("boom"),
                },
                500,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e).status.as_u16(), status);
        }
        let e = ApiError::from(DispatchError::PromptTooLong {
            tokens: 9,
            limit: 8,
        });
        assert_eq!(json(&e)["error"]["code"], "context_length_exceeded");
        let e = ApiError::from(DispatchError::ModelNotFound("m".into()));
        assert_eq!(json(&e)["error"]["code"], "model_not_found");
        assert_eq!(json(&e)["error"]["param"], "model");
    }
}

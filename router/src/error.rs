//! Why a request failed, and the class of failure each API maps to its own codes.

use tonic::Code;

/// A request the router could not serve.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The request is malformed or out of range.
    #[error("{0}")]
    InvalidRequest(String),
    /// A field of the request is out of range (the error names it: OpenAI's `param`).
    #[error("{message}")]
    InvalidField {
        /// The field, as the OpenAI API names it.
        field: &'static str,
        /// Why.
        message: String,
    },
    /// A logit rule is out of its range (the error names the field).
    #[error("{0}")]
    BadLogitRule(#[from] dolphin_proto::sampling::RuleError),
    /// The structured-output format does not compile.
    #[error("{field}: {source}")]
    BadFormat {
        /// The request's field the format came from (`response_format`, `tools`, ...;
        /// `structured` over gRPC).
        field: &'static str,
        /// Why.
        source: dolphin_grammar::GrammarError,
    },
    /// The prompt is longer than the router accepts.
    #[error("the prompt has {tokens} tokens, more than the limit of {limit}")]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// The limit.
        limit: u32,
    },
    /// The prompt and the tokens asked for do not fit in the model's context (vLLM's check,
    /// before any worker is asked).
    #[error(
        "this model's context is {context} tokens, but the request asks for {} ({prompt} in the prompt, {max_tokens} to generate); shorten the prompt or lower max_tokens",
        *prompt as u64 + u64::from(*max_tokens)
    )]
    ContextExceeded {
        /// Prompt tokens.
        prompt: usize,
        /// Tokens asked for.
        max_tokens: u32,
        /// The shortest context of the live workers.
        context: u32,
    },
    /// The request names a model the router does not serve.
    #[error("the model {0:?} does not exist")]
    ModelNotFound(String),
    /// The router has too many requests in flight.
    #[error("the router is at capacity ({0} requests in flight); retry later")]
    RouterBusy(u32),
    /// The request ran past its deadline (the client's `grpc-timeout` or the router's
    /// `--request-timeout-secs`).
    #[error("the request ran past its deadline")]
    DeadlineExceeded,
    /// The router failed on its own (a bug; the message says where).
    #[error("internal error: {0}")]
    Internal(String),
    /// No decode worker is live.
    #[error("no decode workers are available")]
    NoDecodeWorkers,
    /// The client forced a remote prefill but no prefill worker is live.
    #[error("remote prefill was requested but no prefill workers are available")]
    NoPrefillWorkers,
    /// A decode worker refused or failed the request.
    #[error("decode worker {worker} failed: {}", status.message())]
    Worker {
        /// The worker's id.
        worker: String,
        /// Its answer.
        #[source]
        status: tonic::Status,
    },
    /// The connection to the decode worker broke while the request ran (its host stopped
    /// answering pings, the connection was reset): an error of the transport, not an answer
    /// of the worker.
    #[error(
        "lost the connection to decode worker {worker} before the request finished: {}",
        status.message()
    )]
    Disconnected {
        /// The worker's id.
        worker: String,
        /// The transport's error, as tonic reports it.
        #[source]
        status: tonic::Status,
    },
    /// The worker's stream ended before the request finished.
    #[error("decode worker {worker} ended the stream before the request finished")]
    Truncated {
        /// The worker's id.
        worker: String,
    },
    /// The decode worker streaming a request failed and the request could not move to another
    /// one: none was left, the migration limit was reached, or the new worker failed too.
    #[error(
        "{cause}; the request could not move to another decode worker after {tokens} tokens and {migrations} migration attempt(s): {reason}"
    )]
    MigrationFailed {
        /// The failure that ended the last worker's stream.
        cause: Box<DispatchError>,
        /// Why no other worker took the request over.
        reason: String,
        /// Tokens streamed before the failure.
        tokens: u32,
        /// Migrations the request had tried (each counts against the limit).
        migrations: u32,
    },
}

/// Failure classes; the HTTP and gRPC front ends map these to their codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400 / INVALID_ARGUMENT.
    InvalidRequest,
    /// 404 / NOT_FOUND.
    NotFound,
    /// 429 / RESOURCE_EXHAUSTED.
    Overloaded,
    /// 503 / UNAVAILABLE.
    Unavailable,
    /// 500 / INTERNAL.
    Internal,
    /// 504 / DEADLINE_EXCEEDED.
    DeadlineExceeded,
}

impl DispatchError {
    /// The failure class.
    pub fn kind(&self) -> ErrorKind {
        match self {
            DispatchError::InvalidRequest(_)
            | DispatchError::InvalidField { .. }
            | DispatchError::BadLogitRule(_)
            | DispatchError::BadFormat { .. }
            | DispatchError::PromptTooLong { .. }
            | DispatchError::ContextExceeded { .. } => ErrorKind::InvalidRequest,
            DispatchError::ModelNotFound(_) => ErrorKind::NotFound,
            DispatchError::RouterBusy(_) => ErrorKind::Overloaded,
            DispatchError::Internal(_) => ErrorKind::Internal,
            DispatchError::DeadlineExceeded => ErrorKind::DeadlineExceeded,
            DispatchError::NoDecodeWorkers
            | DispatchError::NoPrefillWorkers
            | DispatchError::Disconnected { .. }
            | DispatchError::Truncated { .. } => ErrorKind::Unavailable,
            DispatchError::MigrationFailed { cause, .. } => cause.kind(),
            DispatchError::Worker { status, .. } => match status.code() {
                Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidRequest,
                Code::ResourceExhausted => ErrorKind::Overloaded,
                // The worker ran out of the time the router gave it: the request's own.
                Code::DeadlineExceeded => ErrorKind::DeadlineExceeded,
                Code::Unavailable | Code::Cancelled | Code::Aborted => ErrorKind::Unavailable,
                _ => ErrorKind::Internal,
            },
        }
    }

    /// Short label for metrics and the request log (a fixed set).
    pub fn outcome(&self) -> &'static str {
        match self.kind() {
            ErrorKind::InvalidRequest => "error_invalid",
            ErrorKind::NotFound => "error_not_found",
            ErrorKind::Overloaded => "error_overloaded",
            ErrorKind::Unavailable => "error_unavailable",
            ErrorKind::Internal => "error_internal",
            ErrorKind::DeadlineExceeded => "error_deadline",
        }
    }

    /// The decode worker the error came from, if one did.
    pub(crate) fn worker(&self) -> Option<&str> {
        match self {
            DispatchError::Worker { worker, .. }
            | DispatchError::Disconnected { worker, .. }
            | DispatchError::Truncated { worker } => Some(worker),
            DispatchError::MigrationFailed { cause, .. } => cause.worker(),
            _ => None,
        }
    }

    /// Whether the error says the worker could not be reached or its connection broke (as
    /// opposed to an answer about the request): routing then passes the worker over.
    pub(crate) fn worker_unreachable(&self) -> bool {
        match self {
            DispatchError::Disconnected { .. } | DispatchError::Truncated { .. } => true,
            DispatchError::Worker { status, .. } => status.code() == Code::Unavailable,
            _ => false,
        }
    }

    /// Whether another decode worker might succeed where this one failed.
    pub(crate) fn retryable(&self) -> bool {
        match self {
            DispatchError::Worker { status, .. } => !matches!(
                status.code(),
                Code::InvalidArgument
                    // Another worker would get no more time than this one had.
                    | Code::DeadlineExceeded
                    | Code::OutOfRange
                    | Code::NotFound
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::FailedPrecondition
            ),
            DispatchError::Truncated { .. } | DispatchError::Disconnected { .. } => true,
            _ => false,
        }
    }

    /// The OpenAI error `code` field for this error, where OpenAI has one.
    pub fn openai_code(&self) -> Option<&'static str> {
        match self {
            DispatchError::PromptTooLong { .. } | DispatchError::ContextExceeded { .. } => {
                Some("context_length_exceeded")
            }
            DispatchError::ModelNotFound(_) => Some("model_not_found"),
            _ => None,
        }
    }
}

impl DispatchError {
    /// The error for a status that ended decode worker `worker`'s stream: a status the worker
    /// sent is its answer ([`DispatchError::Worker`]); one the local transport made (it carries
    /// the transport's error as its source) means the connection broke
    /// ([`DispatchError::Disconnected`]).
    pub fn from_worker_status(worker: String, status: tonic::Status) -> Self {
        if std::error::Error::source(&status).is_some() {
            DispatchError::Disconnected { worker, status }
        } else {
            DispatchError::Worker { worker, status }
        }
    }
}

impl From<DispatchError> for tonic::Status {
    fn from(e: DispatchError) -> Self {
        let code = match e.kind() {
            ErrorKind::InvalidRequest => Code::InvalidArgument,
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::Overloaded => Code::ResourceExhausted,
            ErrorKind::Unavailable => Code::Unavailable,
            ErrorKind::Internal => Code::Internal,
            ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
        };
        tonic::Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_unavailable_and_an_answer_keeps_its_code() {
        let broken =
            tonic::Status::from_error(Box::new(std::io::Error::other("keep-alive timed out")));
        let e = DispatchError::from_worker_status("decode-1".into(), broken);
        assert!(matches!(e, DispatchError::Disconnected { .. }), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(
            e.to_string()
                .contains("lost the connection to decode worker decode-1"),
            "{e}"
        );
        assert_eq!(tonic::Status::from(e).code(), Code::Unavailable);
        let answer = tonic::Status::internal("engine failed");
        let e = DispatchError::from_worker_status("decode-1".into(), answer);
        assert!(matches!(e, DispatchError::Worker { .. }), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::Internal);
    }

    fn worker(code: Code) -> DispatchError {
        DispatchError::Worker {
            worker: "d1".into(),
            status: tonic::Status::new(code, "x"),
        }
    }

    #[test]
    fn worker_codes_map_to_kinds() {
        assert_eq!(
            worker(Code::ResourceExhausted).kind(),
            ErrorKind::Overloaded
        );
        assert_eq!(
            worker(Code::InvalidArgument).kind(),
            ErrorKind::InvalidRequest
        );
        assert_eq!(worker(Code::Unavailable).kind(), ErrorKind::Unavailable);
        assert_eq!(worker(Code::DataLoss).kind(), ErrorKind::Internal);
        assert_eq!(
            worker(Code::DeadlineExceeded).kind(),
            ErrorKind::DeadlineExceeded
        );
        assert!(!worker(Code::DeadlineExceeded).retryable());
        assert!(worker(Code::Unavailable).retryable());
        assert!(worker(Code::ResourceExhausted).retryable());
        assert!(!worker(Code::InvalidArgument).retryable());
        assert!(!DispatchError::NoDecodeWorkers.retryable());
    }

    #[test]
    fn grpc_status_codes() {
        let s: tonic::Status = DispatchError::ModelNotFound("m".into()).into();
        assert_eq!(s.code(), Code::NotFound);
        let s: tonic::Status = DispatchError::PromptTooLong {
            tokens: 10,
            limit: 5,
        }
        .into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("10 tokens"));
        let s: tonic::Status = DispatchError::RouterBusy(3).into();
        assert_eq!(s.code(), Code::ResourceExhausted);
        let s: tonic::Status = DispatchError::NoDecodeWorkers.into();
        assert_eq!(s.code(), Code::Unavailable);
        let s: tonic::Status = worker(Code::ResourceExhausted).into();
        assert_eq!(s.code(), Code::ResourceExhausted);
    }
}

//! Engine errors as gRPC statuses: each failure gets the code a client can act on.

use dolphin_engine::EngineError;
use tonic::{Code, Status};

/// The gRPC code for an engine error.
pub fn engine_code(err: &EngineError) -> Code {
    match err {
        // The caller sent something the engine cannot serve: retrying will not help.
        EngineError::InvalidRequest(_) => Code::InvalidArgument,
        // Bounded queue full: back off or go to another worker.
        EngineError::QueueFull => Code::ResourceExhausted,
        // Shutting down: another worker will do.
        EngineError::Shutdown => Code::Unavailable,
        // Received KV failed its content check.
        EngineError::CorruptKv { .. } => Code::DataLoss,
        EngineError::Cancelled => Code::Cancelled,
        _ => Code::Internal,
    }
}

/// The gRPC status for an engine error, its message carrying the cause chain.
pub fn engine_status(err: &EngineError) -> Status {
    Status::new(engine_code(err), error_chain(err))
}

pub use dolphin_cluster::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_tell_callers_what_to_do() {
        assert_eq!(
            engine_code(&EngineError::InvalidRequest("empty prompt".into())),
            Code::InvalidArgument
        );
        assert_eq!(
            engine_code(&EngineError::QueueFull),
            Code::ResourceExhausted
        );
        assert_eq!(engine_code(&EngineError::Shutdown), Code::Unavailable);
        assert_eq!(engine_code(&EngineError::Cancelled), Code::Cancelled);
        assert_eq!(
            engine_code(&EngineError::UnknownSequence(3)),
            Code::Internal
        );
    }

    #[test]
    fn status_message_keeps_the_cause_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let err = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&err), "outer: inner");
    }
}

//! KV transfer failures as gRPC statuses for the decode worker that asked for the prefill.

use dolphin_kv_transfer::TransferError;
use dolphin_worker_common::error_chain;
use tonic::{Code, Status};

/// The gRPC code for a failed push to a decode worker.
pub fn transfer_code(err: &TransferError) -> Code {
    match err {
        // The decode worker cannot be reached or went away mid-transfer.
        TransferError::Connect { .. }
        | TransferError::Io { .. }
        | TransferError::Closed { .. }
        | TransferError::Aborted { .. } => Code::Unavailable,
        TransferError::Timeout { .. } => Code::DeadlineExceeded,
        // The decode worker no longer wants this transfer (it gave up, or announced it again).
        TransferError::Refused { .. } | TransferError::Superseded { .. } => Code::Aborted,
        TransferError::VersionMismatch { .. } => Code::FailedPrecondition,
        _ => Code::Internal,
    }
}

/// The gRPC status for a failed push, its message carrying the cause chain.
pub fn transfer_status(err: &TransferError) -> Status {
    Status::new(
        transfer_code(err),
        format!("KV push failed: {}", error_chain(err)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_receivers_are_unavailable_and_stalls_deadline_exceeded() {
        let refused = TransferError::Connect {
            target: "127.0.0.1:1".into(),
            source: std::sync::Arc::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            )),
        };
        assert_eq!(transfer_code(&refused), Code::Unavailable);
        let status = transfer_status(&refused);
        assert!(
            status.message().contains("127.0.0.1:1"),
            "{}",
            status.message()
        );
        let stalled = TransferError::Timeout {
            op: "write",
            after: std::time::Duration::from_secs(1),
        };
        assert_eq!(transfer_code(&stalled), Code::DeadlineExceeded);
        assert_eq!(
            transfer_code(&TransferError::Aborted { id: 1 }),
            Code::Unavailable
        );
        assert_eq!(
            transfer_code(&TransferError::TooManyBlocks { n: 1 }),
            Code::Internal
        );
    }
}

//! Every metric the KV transport records, named in one place.
//!
//! Labels: `side` (send, receive) and `cause` ([`TransferError::cause`]), both fixed sets.

use metrics::{Unit, describe_counter, describe_histogram};

use crate::error::TransferError;
use crate::sender::SendStats;

/// KV bytes pushed and acknowledged (sender).
pub const SENT_BYTES_TOTAL: &str = "dolphin_kv_sent_bytes_total";
/// KV blocks pushed and acknowledged (sender).
pub const SENT_BLOCKS_TOTAL: &str = "dolphin_kv_sent_blocks_total";
/// KV bytes received intact (receiver).
pub const RECEIVED_BYTES_TOTAL: &str = "dolphin_kv_received_bytes_total";
/// KV blocks received intact (receiver).
pub const RECEIVED_BLOCKS_TOTAL: &str = "dolphin_kv_received_blocks_total";
/// One transfer, from the send call to the receiver's ack (a streamed one includes the wait
/// for its blocks to be computed).
pub const TRANSFER_SECONDS: &str = "dolphin_kv_transfer_seconds";
/// Bytes of one transfer.
pub const TRANSFER_BYTES: &str = "dolphin_kv_transfer_bytes";
/// Transfers that failed, by `side` and `cause`.
pub const TRANSFER_FAILURES_TOTAL: &str = "dolphin_kv_transfer_failures_total";

/// Every name above (the dashboard test checks its queries against these).
pub const ALL: &[&str] = &[
    SENT_BYTES_TOTAL,
    SENT_BLOCKS_TOTAL,
    RECEIVED_BYTES_TOTAL,
    RECEIVED_BLOCKS_TOTAL,
    TRANSFER_SECONDS,
    TRANSFER_BYTES,
    TRANSFER_FAILURES_TOTAL,
];

/// Registers descriptions and units with the installed recorder; call once at start.
pub fn describe() {
    describe_counter!(
        SENT_BYTES_TOTAL,
        Unit::Bytes,
        "KV bytes sent and acknowledged."
    );
    describe_counter!(
        SENT_BLOCKS_TOTAL,
        Unit::Count,
        "KV blocks sent and acknowledged."
    );
    describe_counter!(
        RECEIVED_BYTES_TOTAL,
        Unit::Bytes,
        "KV bytes received intact."
    );
    describe_counter!(
        RECEIVED_BLOCKS_TOTAL,
        Unit::Count,
        "KV blocks received intact."
    );
    describe_histogram!(
        TRANSFER_SECONDS,
        Unit::Seconds,
        "One KV transfer, send call to acknowledgement."
    );
    describe_histogram!(TRANSFER_BYTES, Unit::Bytes, "Bytes of one KV transfer.");
    describe_counter!(
        TRANSFER_FAILURES_TOTAL,
        "KV transfers that failed, by side and cause."
    );
}

/// Records a sender's finished transfer.
pub(crate) fn record_send(result: &Result<SendStats, TransferError>) {
    match result {
        Ok(s) => {
            metrics::counter!(SENT_BYTES_TOTAL).increment(s.bytes);
            metrics::counter!(SENT_BLOCKS_TOTAL).increment(u64::from(s.blocks));
            metrics::histogram!(TRANSFER_SECONDS).record(s.elapsed.as_secs_f64());
            metrics::histogram!(TRANSFER_BYTES).record(s.bytes as f64);
        }
        Err(e) => failed("send", e),
    }
}

/// Counts a failed transfer on `side`.
pub(crate) fn failed(side: &'static str, e: &TransferError) {
    metrics::counter!(TRANSFER_FAILURES_TOTAL, "side" => side, "cause" => e.cause()).increment(1);
}

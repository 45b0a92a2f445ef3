//! Every metric the worker processes export, named in one place.
//!
//! Naming: `dolphin_<component>_<what>_<unit>`; counters end in `_total`, durations are seconds,
//! sizes bytes. Labels take values from fixed sets (roles, modes, outcomes, reasons), never
//! request ids or addresses, so series stay bounded.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Requests a worker finished, by `role` and `outcome` (see [`outcome`]).
pub const WORKER_REQUESTS_TOTAL: &str = "dolphin_worker_requests_total";
/// Requests running now.
pub const WORKER_INFLIGHT_REQUESTS: &str = "dolphin_worker_inflight_requests";
/// 1 while the worker drains, else 0.
pub const WORKER_DRAINING: &str = "dolphin_worker_draining";
/// Open `Worker.Subscribe` streams.
pub const WORKER_SUBSCRIBERS: &str = "dolphin_worker_subscribers";
/// Subscribe streams that fell behind the KV event feed and were re-sent a snapshot.
pub const WORKER_SUBSCRIBE_RESYNCS_TOTAL: &str = "dolphin_worker_subscribe_resyncs_total";

/// Decode requests started, by `mode` (`local` or `remote`).
pub const DECODE_REQUESTS_TOTAL: &str = "dolphin_decode_requests_total";
/// Remote prefills abandoned for local prefill, by `reason` (see [`fallback_reason`]).
pub const DECODE_FALLBACKS_TOTAL: &str = "dolphin_decode_fallbacks_total";
/// Requests sent remote that this worker prefilled itself because it already held the prompt
/// up to its last block.
pub const DECODE_HELD_PROMPTS_TOTAL: &str = "dolphin_decode_held_prompts_total";
/// Time from a decode request's arrival to its first token, by `mode`.
pub const DECODE_TTFT_SECONDS: &str = "dolphin_decode_ttft_seconds";
/// Remote path: time from the reservation to the prefill worker's answer with every KV block
/// imported (its prefill plus the transfer), for remote prefills that succeeded.
pub const DECODE_REMOTE_PREFILL_SECONDS: &str = "dolphin_decode_remote_prefill_seconds";
/// KV blocks imported from prefill workers.
pub const DECODE_KV_BLOCKS_IMPORTED_TOTAL: &str = "dolphin_decode_kv_blocks_imported_total";
/// Tokens streamed to clients.
pub const DECODE_OUTPUT_TOKENS_TOTAL: &str = "dolphin_decode_output_tokens_total";

/// Prefill worker: time spent prefilling a prompt (queue excluded).
pub const PREFILL_SECONDS: &str = "dolphin_prefill_seconds";
/// Prefill worker: time from the first token to the decode worker's ack of the KV (the rest of
/// the push overlaps the prefill).
pub const PREFILL_KV_SEND_SECONDS: &str = "dolphin_prefill_kv_send_seconds";
/// Prefill worker: KV bytes pushed to decode workers.
pub const PREFILL_KV_BYTES_SENT_TOTAL: &str = "dolphin_prefill_kv_bytes_sent_total";
/// Prefill worker: prompt tokens found in its own prefix cache.
pub const PREFILL_CACHED_TOKENS_TOTAL: &str = "dolphin_prefill_cached_tokens_total";
/// Prefill worker: requests refused because the decode worker's build or KV layout differs
/// from its own, by `reason` (`version`, `model`, `block_size`, `kv_layout`).
pub const PREFILL_INCOMPATIBLE_TOTAL: &str = "dolphin_prefill_incompatible_total";

/// Values of the `outcome` label.
pub mod outcome {
    /// Finished normally.
    pub const OK: &str = "ok";
    /// Refused before any work (bad input, draining, queue full).
    pub const REJECTED: &str = "rejected";
    /// Failed while running.
    pub const ERROR: &str = "error";
    /// The client went away, or the drain grace period ran out.
    pub const CANCELLED: &str = "cancelled";
}

/// Values of the `reason` label of [`DECODE_FALLBACKS_TOTAL`].
pub mod fallback_reason {
    /// The prefill worker answered with an error (or could not be reached).
    pub const PREFILL_ERROR: &str = "prefill_error";
    /// The prefill worker did not finish within the request's timeout.
    pub const TIMEOUT: &str = "timeout";
    /// The KV transfer failed (connection, checksum, missing blocks).
    pub const TRANSFER_ERROR: &str = "transfer_error";
    /// The engine refused a received block (corrupt content).
    pub const IMPORT_ERROR: &str = "import_error";
}

/// Every metric name above (the dashboard test checks its queries against these).
pub const ALL: &[&str] = &[
    WORKER_REQUESTS_TOTAL,
    WORKER_INFLIGHT_REQUESTS,
    WORKER_DRAINING,
    WORKER_SUBSCRIBERS,
    WORKER_SUBSCRIBE_RESYNCS_TOTAL,
    DECODE_REQUESTS_TOTAL,
    DECODE_FALLBACKS_TOTAL,
    DECODE_HELD_PROMPTS_TOTAL,
    DECODE_TTFT_SECONDS,
    DECODE_REMOTE_PREFILL_SECONDS,
    DECODE_KV_BLOCKS_IMPORTED_TOTAL,
    DECODE_OUTPUT_TOKENS_TOTAL,
    PREFILL_SECONDS,
    PREFILL_KV_SEND_SECONDS,
    PREFILL_KV_BYTES_SENT_TOTAL,
    PREFILL_CACHED_TOKENS_TOTAL,
    PREFILL_INCOMPATIBLE_TOTAL,
];

/// Registers descriptions and units with the installed recorder; call once at start.
pub fn describe() {
    describe_counter!(
        WORKER_REQUESTS_TOTAL,
        "Requests finished, by role and outcome."
    );
    describe_gauge!(WORKER_INFLIGHT_REQUESTS, "Requests running now.");
    describe_gauge!(WORKER_DRAINING, "1 while the worker drains.");
    describe_gauge!(WORKER_SUBSCRIBERS, "Open Worker.Subscribe streams.");
    describe_counter!(
        WORKER_SUBSCRIBE_RESYNCS_TOTAL,
        "Subscribe streams that fell behind and were re-sent a snapshot."
    );
    describe_counter!(DECODE_REQUESTS_TOTAL, "Decode requests started, by mode.");
    describe_counter!(
        DECODE_FALLBACKS_TOTAL,
        "Remote prefills abandoned for local prefill, by reason."
    );
    describe_counter!(
        DECODE_HELD_PROMPTS_TOTAL,
        "Requests sent remote that were prefilled locally because the prompt was held here."
    );
    describe_histogram!(
        DECODE_TTFT_SECONDS,
        Unit::Seconds,
        "Arrival to first token on the decode worker, by mode."
    );
    describe_histogram!(
        DECODE_REMOTE_PREFILL_SECONDS,
        Unit::Seconds,
        "Reservation to remote prefill answered with every KV block imported."
    );
    describe_counter!(DECODE_KV_BLOCKS_IMPORTED_TOTAL, "KV blocks imported.");
    describe_counter!(DECODE_OUTPUT_TOKENS_TOTAL, "Tokens streamed to clients.");
    describe_histogram!(PREFILL_SECONDS, Unit::Seconds, "Prefill compute time.");
    describe_histogram!(
        PREFILL_KV_SEND_SECONDS,
        Unit::Seconds,
        "KV push time after the first token (the rest overlaps the prefill)."
    );
    describe_counter!(
        PREFILL_KV_BYTES_SENT_TOTAL,
        Unit::Bytes,
        "KV bytes pushed to decode workers."
    );
    describe_counter!(
        PREFILL_INCOMPATIBLE_TOTAL,
        "Prefill requests refused for a decode worker of another build or KV layout, by reason."
    );
    describe_counter!(
        PREFILL_CACHED_TOKENS_TOTAL,
        "Prompt tokens found in the prefill worker's cache."
    );
}

//! Every metric the router records, named in one place and described once at start.
//!
//! Naming: `dolphin_router_` prefix, counters end in `_total`, durations are histograms in
//! `_seconds`. Labels take values from fixed sets only (api, outcome, mode, role, kind).

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Requests finished, by `api` (http, grpc) and `outcome` ("ok", "cancelled", "error_worker",
/// or an error class such as "error_overloaded").
pub const REQUESTS_TOTAL: &str = "dolphin_router_requests_total";
/// Requests being served now.
pub const INFLIGHT_REQUESTS: &str = "dolphin_router_inflight_requests";
/// Routing decisions, by `mode` (local, remote).
pub const DECISIONS_TOTAL: &str = "dolphin_router_decisions_total";
/// Time to first token seen by the router, by `mode`.
pub const TTFT_SECONDS: &str = "dolphin_router_ttft_seconds";
/// Mean time per output token after the first, by `mode`.
pub const TPOT_SECONDS: &str = "dolphin_router_tpot_seconds";
/// End-to-end request time, by `mode`.
pub const E2E_SECONDS: &str = "dolphin_router_e2e_seconds";
/// Router CPU time of a routing decision (hashing, index lookup, selection, policy).
pub const ROUTE_SECONDS: &str = "dolphin_router_route_seconds";
/// Decode calls that failed before the first token and were retried on another worker.
pub const RETRIES_TOTAL: &str = "dolphin_router_retries_total";
/// Prompt tokens admitted.
pub const PROMPT_TOKENS_TOTAL: &str = "dolphin_router_prompt_tokens_total";
/// Completion tokens streamed to clients.
pub const COMPLETION_TOKENS_TOTAL: &str = "dolphin_router_completion_tokens_total";
/// Live workers, by `role`.
pub const WORKERS: &str = "dolphin_router_workers";
/// Workers whose event stream is down (their index entries may be stale), by `role`.
pub const STALE_EVENT_STREAMS: &str = "dolphin_router_stale_event_streams";
/// Event stream disconnects, by `role`.
pub const EVENT_STREAM_DISCONNECTS_TOTAL: &str = "dolphin_router_event_stream_disconnects_total";
/// Worker events applied, by `kind` (stored, removed, cleared, load).
pub const WORKER_EVENTS_TOTAL: &str = "dolphin_router_worker_events_total";
/// Sequence gaps seen on worker event streams (events lost; the stream is restarted).
pub const EVENT_GAPS_TOTAL: &str = "dolphin_router_event_gaps_total";
/// Distinct blocks in a pool's prefix index, by `role`.
pub const INDEX_BLOCKS: &str = "dolphin_router_index_blocks";
/// Workers refused at registration (wrong model or block size, pool full), by `role`.
pub const WORKERS_REJECTED_TOTAL: &str = "dolphin_router_workers_rejected_total";
/// Request-log records dropped because the writer fell behind.
pub const REQUEST_LOG_DROPPED_TOTAL: &str = "dolphin_router_request_log_dropped_total";

/// Describes every metric to the installed recorder. Call once at start.
pub fn describe() {
    describe_counter!(REQUESTS_TOTAL, "Requests finished, by api and outcome.");
    describe_gauge!(INFLIGHT_REQUESTS, "Requests being served now.");
    describe_counter!(DECISIONS_TOTAL, "Routing decisions, by mode.");
    describe_histogram!(
        TTFT_SECONDS,
        Unit::Seconds,
        "Time to first token seen by the router."
    );
    describe_histogram!(
        TPOT_SECONDS,
        Unit::Seconds,
        "Mean time per output token after the first."
    );
    describe_histogram!(E2E_SECONDS, Unit::Seconds, "End-to-end request time.");
    describe_histogram!(
        ROUTE_SECONDS,
        Unit::Seconds,
        "Router time of one routing decision."
    );
    describe_counter!(
        RETRIES_TOTAL,
        "Decode calls retried on another worker before the first token."
    );
    describe_counter!(PROMPT_TOKENS_TOTAL, Unit::Count, "Prompt tokens admitted.");
    describe_counter!(
        COMPLETION_TOKENS_TOTAL,
        Unit::Count,
        "Completion tokens streamed to clients."
    );
    describe_gauge!(WORKERS, "Live workers, by role.");
    describe_gauge!(
        STALE_EVENT_STREAMS,
        "Workers whose KV event stream is down, by role."
    );
    describe_counter!(
        EVENT_STREAM_DISCONNECTS_TOTAL,
        "KV event stream disconnects, by role."
    );
    describe_counter!(WORKER_EVENTS_TOTAL, "Worker events applied, by kind.");
    describe_counter!(EVENT_GAPS_TOTAL, "Sequence gaps on worker event streams.");
    describe_gauge!(
        INDEX_BLOCKS,
        "Distinct blocks in a pool's prefix index, by role."
    );
    describe_counter!(
        WORKERS_REJECTED_TOTAL,
        "Workers refused at registration, by role."
    );
    describe_counter!(
        REQUEST_LOG_DROPPED_TOTAL,
        "Request-log records dropped (writer behind)."
    );
}

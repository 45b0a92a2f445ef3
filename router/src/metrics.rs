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
/// Finished requests by the router's decision (`mode`: local, remote) and the prefill `path`
/// the decode worker really took (local, remote, local_held, local_fallback).
pub const PREFILL_PATHS_TOTAL: &str = "dolphin_router_prefill_paths_total";
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
/// Requests moved to another decode worker after theirs failed mid-stream, by `outcome` (ok,
/// failed).
pub const MIGRATIONS_TOTAL: &str = "dolphin_router_migrations_total";
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
/// Prefill workers passed over as partners of a request's decode worker because their build,
/// model, block size or KV layout differs, by `reason` (`version`, `model`, `block_size`,
/// `kv_layout`): one per refused candidate per request.
pub const PAIRS_REFUSED_TOTAL: &str = "dolphin_router_pairs_refused_total";
/// Request-log records dropped because the writer fell behind.
pub const REQUEST_LOG_DROPPED_TOTAL: &str = "dolphin_router_request_log_dropped_total";
/// Responses API responses asked to be kept, by `outcome` (kept, failed: the store refused or
/// could not be reached, and the answer said `store: false`).
pub const RESPONSES_STORED_TOTAL: &str = "dolphin_router_responses_stored_total";

/// Decisions of the `dolphin` policy read from a table, by `cluster` ("0".."63") and
/// `decision` (local, remote).
pub const DOLPHIN_DECISIONS_TOTAL: &str = "dolphin_router_dolphin_decisions_total";
/// Decisions of the `dolphin` policy made by its fallback because the live split has no table,
/// by `fallback` (threshold, always-local, always-remote).
pub const DOLPHIN_FALLBACK_TOTAL: &str = "dolphin_router_dolphin_fallback_decisions_total";
/// Requests of the `dolphin` policy routed by its fallback because the table's bit was not
/// trusted for them, by `cluster` and `reason` (out_of_range: beyond the cluster's training
/// range; thin_evidence: too few training requests or too small a margin behind the bit).
pub const DOLPHIN_DISTRUSTED_TOTAL: &str = "dolphin_router_dolphin_distrusted_total";
/// Requests of the `dolphin` policy whose bit said remote and that the table's load rule sent
/// local because the chosen prefill worker was busy, by `cluster`.
pub const DOLPHIN_LOAD_RULE_TOTAL: &str = "dolphin_router_dolphin_load_rule_total";
/// Requests the online learner sent by the path their cluster's bit does not give, by
/// `cluster` and `decision` (the path explored).
pub const ONLINE_EXPLORED_TOTAL: &str = "dolphin_router_online_explored_total";
/// Bits the online learner flipped, by `split`, `cluster` and `to` (the new path).
pub const ONLINE_FLIPS_TOTAL: &str = "dolphin_router_online_flips_total";
/// Finished requests the online learner credited, by `decision` and `met` (true/false);
/// `decision="dropped"` counts outcomes dropped because the learner's inbox was full.
pub const ONLINE_OUTCOMES_TOTAL: &str = "dolphin_router_online_outcomes_total";
/// Tables the online learner published (flips, and seeds of a split that had none), by
/// `outcome` (ok, error).
pub const ONLINE_PUBLISHED_TOTAL: &str = "dolphin_router_online_published_total";
/// 1 when the live split has a routing table loaded, else 0.
pub const TABLE_ACTIVE: &str = "dolphin_router_table_active";
/// Swaps of the loaded routing tables.
pub const TABLE_SWAPS_TOTAL: &str = "dolphin_router_table_swaps_total";
/// Tables or classifiers refused as invalid, by `kind` (table, classifier).
pub const TABLES_REJECTED_TOTAL: &str = "dolphin_router_tables_rejected_total";
/// Cache lookups answered by the approximate index because the worker's event stream is stale,
/// by `role`.
pub const APPROX_INDEX_LOOKUPS_TOTAL: &str = "dolphin_router_approx_index_lookups_total";

/// Cluster ids as metric labels: a fixed set (tables have at most 64 clusters).
pub const CLUSTER_LABELS: [&str; 64] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32",
    "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46", "47", "48",
    "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60", "61", "62", "63",
];

/// The label of a cluster id ("none" without one or outside the table range).
pub fn cluster_label(cluster: Option<u32>) -> &'static str {
    cluster
        .and_then(|c| CLUSTER_LABELS.get(c as usize).copied())
        .unwrap_or("none")
}

/// Every metric name above (the dashboard test checks its queries against these).
pub const ALL: &[&str] = &[
    REQUESTS_TOTAL,
    INFLIGHT_REQUESTS,
    DECISIONS_TOTAL,
    PREFILL_PATHS_TOTAL,
    TTFT_SECONDS,
    TPOT_SECONDS,
    E2E_SECONDS,
    ROUTE_SECONDS,
    RETRIES_TOTAL,
    MIGRATIONS_TOTAL,
    PROMPT_TOKENS_TOTAL,
    COMPLETION_TOKENS_TOTAL,
    WORKERS,
    STALE_EVENT_STREAMS,
    EVENT_STREAM_DISCONNECTS_TOTAL,
    WORKER_EVENTS_TOTAL,
    EVENT_GAPS_TOTAL,
    INDEX_BLOCKS,
    WORKERS_REJECTED_TOTAL,
    PAIRS_REFUSED_TOTAL,
    REQUEST_LOG_DROPPED_TOTAL,
    RESPONSES_STORED_TOTAL,
    DOLPHIN_DECISIONS_TOTAL,
    DOLPHIN_DISTRUSTED_TOTAL,
    DOLPHIN_LOAD_RULE_TOTAL,
    DOLPHIN_FALLBACK_TOTAL,
    ONLINE_EXPLORED_TOTAL,
    ONLINE_FLIPS_TOTAL,
    ONLINE_OUTCOMES_TOTAL,
    ONLINE_PUBLISHED_TOTAL,
    TABLE_ACTIVE,
    TABLE_SWAPS_TOTAL,
    TABLES_REJECTED_TOTAL,
    APPROX_INDEX_LOOKUPS_TOTAL,
];

/// Describes every metric to the installed recorder. Call once at start.
pub fn describe() {
    describe_counter!(
        DOLPHIN_DECISIONS_TOTAL,
        "Dolphin table decisions, by cluster and decision."
    );
    describe_counter!(
        DOLPHIN_LOAD_RULE_TOTAL,
        "Dolphin table decisions turned local by the table's load rule (busy prefill worker)."
    );
    describe_counter!(
        DOLPHIN_FALLBACK_TOTAL,
        "Dolphin decisions made by the fallback policy (no table for the live split)."
    );
    describe_counter!(
        DOLPHIN_DISTRUSTED_TOTAL,
        "Dolphin decisions made by the fallback policy because the table's bit was not trusted."
    );
    describe_counter!(
        ONLINE_EXPLORED_TOTAL,
        "Requests the online learner sent by the other path than their cluster's bit."
    );
    describe_counter!(ONLINE_FLIPS_TOTAL, "Bits the online learner flipped.");
    describe_counter!(
        ONLINE_OUTCOMES_TOTAL,
        "Finished requests the online learner credited, by path and whether they met the SLO."
    );
    describe_counter!(
        ONLINE_PUBLISHED_TOTAL,
        "Routing tables the online learner published to the store."
    );
    describe_gauge!(
        TABLE_ACTIVE,
        "1 when the live split has a routing table loaded."
    );
    describe_counter!(TABLE_SWAPS_TOTAL, "Swaps of the loaded routing tables.");
    describe_counter!(
        TABLES_REJECTED_TOTAL,
        "Routing tables or classifiers refused as invalid, by kind."
    );
    describe_counter!(
        APPROX_INDEX_LOOKUPS_TOTAL,
        "Cache lookups answered by the approximate index (stale event stream), by role."
    );
    describe_counter!(REQUESTS_TOTAL, "Requests finished, by api and outcome.");
    describe_gauge!(INFLIGHT_REQUESTS, "Requests being served now.");
    describe_counter!(DECISIONS_TOTAL, "Routing decisions, by mode.");
    describe_counter!(
        PREFILL_PATHS_TOTAL,
        "Finished requests by routing decision (mode) and the prefill path really taken."
    );
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
    describe_counter!(
        MIGRATIONS_TOTAL,
        "Requests moved to another decode worker after theirs failed mid-stream."
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
        PAIRS_REFUSED_TOTAL,
        "Prefill workers refused as partners of a decode worker (other build or KV layout), by reason."
    );
    describe_counter!(
        REQUEST_LOG_DROPPED_TOTAL,
        "Request-log records dropped (writer behind)."
    );
    describe_counter!(
        RESPONSES_STORED_TOTAL,
        "Responses API responses asked to be kept, by outcome (kept, failed)."
    );
}

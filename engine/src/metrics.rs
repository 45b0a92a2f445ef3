//! Every metric the engine records, named in one place.
//!
//! Recorded into whichever `metrics` recorder the process installed (the workers' Prometheus
//! one; a lookup and an atomic add when none is). Gauges of the engine's state (running,
//! waiting, KV blocks) are set by the worker from the same load snapshot it reports to the
//! router, so both views agree; their names live here too. Labels: none, or `kind` from a fixed
//! set. The scheduler reserves every admitted request's blocks up front, so it never preempts:
//! there is no preemption counter to export.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Wall time of one model step (the forward pass; the sim's modelled step time included).
pub const STEP_SECONDS: &str = "dolphin_engine_step_seconds";
/// Sequences in one step's batch.
pub const BATCH_SIZE: &str = "dolphin_engine_batch_size";
/// Tokens computed in one step (prefill chunks plus one per decoding sequence).
pub const BATCH_TOKENS: &str = "dolphin_engine_batch_tokens";
/// Time from a request's arrival at the engine to its admission (its KV blocks reserved).
pub const QUEUE_SECONDS: &str = "dolphin_engine_queue_seconds";
/// Prompt tokens looked up in the prefix cache at admission.
pub const PREFIX_CACHE_QUERIED_TOKENS_TOTAL: &str =
    "dolphin_engine_prefix_cache_queried_tokens_total";
/// Prompt tokens found in the prefix cache at admission (hit rate: this over the queried).
pub const PREFIX_CACHE_HIT_TOKENS_TOTAL: &str = "dolphin_engine_prefix_cache_hit_tokens_total";
/// Requests admitted (running, or holding a reservation for remote KV).
pub const RUNNING_REQUESTS: &str = "dolphin_engine_running_requests";
/// Requests queued for admission.
pub const WAITING_REQUESTS: &str = "dolphin_engine_waiting_requests";
/// KV blocks a new request can still get (free or evictable, minus reservations).
pub const KV_BLOCKS_FREE: &str = "dolphin_engine_kv_blocks_free";
/// KV blocks in use (the pool's blocks minus the free ones).
pub const KV_BLOCKS_USED: &str = "dolphin_engine_kv_blocks_used";
/// Steps the backend failed, failing the requests in them.
pub const STEP_FAILURES_TOTAL: &str = "dolphin_engine_step_failures_total";
/// KV blocks a sequence computed while another computed the same prompt, given up for the
/// cached copy (the prompt's work done twice: concurrent identical prefixes).
pub const KV_BLOCKS_DEDUPLICATED_TOTAL: &str = "dolphin_engine_kv_blocks_deduplicated_total";

/// Every name above (the dashboard test checks its queries against these).
pub const ALL: &[&str] = &[
    STEP_SECONDS,
    BATCH_SIZE,
    BATCH_TOKENS,
    QUEUE_SECONDS,
    PREFIX_CACHE_QUERIED_TOKENS_TOTAL,
    PREFIX_CACHE_HIT_TOKENS_TOTAL,
    RUNNING_REQUESTS,
    WAITING_REQUESTS,
    KV_BLOCKS_FREE,
    KV_BLOCKS_USED,
    STEP_FAILURES_TOTAL,
    KV_BLOCKS_DEDUPLICATED_TOTAL,
];

/// Registers descriptions and units with the installed recorder; call once at start.
pub fn describe() {
    describe_histogram!(STEP_SECONDS, Unit::Seconds, "Wall time of one model step.");
    describe_histogram!(BATCH_SIZE, Unit::Count, "Sequences in one step's batch.");
    describe_histogram!(BATCH_TOKENS, Unit::Count, "Tokens computed in one step.");
    describe_histogram!(
        QUEUE_SECONDS,
        Unit::Seconds,
        "Arrival at the engine to admission."
    );
    describe_counter!(
        PREFIX_CACHE_QUERIED_TOKENS_TOTAL,
        Unit::Count,
        "Prompt tokens looked up in the prefix cache."
    );
    describe_counter!(
        PREFIX_CACHE_HIT_TOKENS_TOTAL,
        Unit::Count,
        "Prompt tokens found in the prefix cache."
    );
    describe_gauge!(RUNNING_REQUESTS, "Requests admitted.");
    describe_gauge!(WAITING_REQUESTS, "Requests queued for admission.");
    describe_gauge!(KV_BLOCKS_FREE, "KV blocks a new request can still get.");
    describe_gauge!(KV_BLOCKS_USED, "KV blocks in use.");
    describe_counter!(STEP_FAILURES_TOTAL, "Backend steps that failed.");
    describe_counter!(
        KV_BLOCKS_DEDUPLICATED_TOTAL,
        Unit::Count,
        "KV blocks computed twice by concurrent identical prompts, given up for the cached copy."
    );
}

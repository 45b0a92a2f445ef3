//! Metric names of model groups, in one place.

/// Counter: handoffs away from a subserver (label `subserver`).
pub const HANDOFFS_TOTAL: &str = "dolphin_handoffs_total";
/// Histogram: time from a handoff to the peer's first token, seconds (label `subserver`: the
/// peer).
pub const HANDOFF_RESUME_SECONDS: &str = "dolphin_handoff_resume_seconds";
/// Counter: accepted tokens a subserver wrote (label `subserver`).
pub const SUBSERVER_TOKENS_TOTAL: &str = "dolphin_subserver_tokens_total";
/// Gauge: sequences of a subserver paused for a peer (label `subserver`).
pub const SUBSERVER_PENDING: &str = "dolphin_subserver_pending";
/// Gauge: mean batch size of a subserver's recent steps (label `subserver`).
pub const SUBSERVER_BATCH_SIZE: &str = "dolphin_subserver_batch_size";
/// Gauge: mean step time of a subserver's recent steps, seconds (label `subserver`).
pub const SUBSERVER_STEP_SECONDS: &str = "dolphin_subserver_step_seconds";
/// Gauge: a subserver's delayed-batching batch size B (label `subserver`).
pub const SUBSERVER_BATCH_WAIT: &str = "dolphin_subserver_batch_wait";

/// Every metric name above (the dashboard test checks its queries against these).
pub const ALL: &[&str] = &[
    HANDOFFS_TOTAL,
    HANDOFF_RESUME_SECONDS,
    SUBSERVER_TOKENS_TOTAL,
    SUBSERVER_PENDING,
    SUBSERVER_BATCH_SIZE,
    SUBSERVER_STEP_SECONDS,
    SUBSERVER_BATCH_WAIT,
];

//! Test helpers for crates that summarize outcomes (feature `test-util`): one outcome made to
//! order, instead of a struct literal in every test module.

use crate::{RequestKind, RequestOutcome};

/// A completed-or-failed HumanEval request, not yet judged against an SLO: 100 prompt tokens,
/// 11 output tokens, TTFT half of `e2e_ms`, TPOT a twentieth; remote exactly when it is in
/// cluster 1. Override fields with struct update syntax, then `judge`.
pub fn outcome(index: u32, cluster: Option<u32>, e2e_ms: f64, ok: bool) -> RequestOutcome {
    RequestOutcome {
        index,
        kind: RequestKind::Humaneval,
        sent_ms: f64::from(index) * 100.0,
        prompt_tokens: 100,
        output_tokens: 11,
        ttft_ms: e2e_ms / 2.0,
        tpot_ms: e2e_ms / 20.0,
        e2e_ms,
        features: [100, 100, 100, 11],
        cluster,
        remote: cluster == Some(1),
        fell_back: false,
        held: false,
        ok,
        met: false,
        met_each: false,
    }
}

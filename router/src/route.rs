//! The routing decision as one pure, synchronous function of what the router knows once it has
//! chosen a worker of each pool: the prompt's length, what each chosen worker caches of it, the
//! chosen workers' load (the prefill worker's queue and backlog, the decode worker's KV usage),
//! the classifier's output length, the policy and (under the `dolphin` policy) the table of the
//! live split.
//!
//! The dispatcher calls [`route`] for every request (`Dispatcher::route`), and the simulator
//! (`dolphin-sim`) calls it for every simulated arrival, so the two decide alike by
//! construction. Choosing the workers is shared the same way: both score candidates with
//! [`crate::selection::select`].

use std::sync::Arc;

use crate::dolphin::CompiledTable;
use crate::dolphin::trust::TrustConfig;
use crate::policy::{DecidedBy, Decision, DolphinConfig, Features, Policy, PoolState};

/// The chosen prefill worker, as the decision sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillChoice {
    /// Prompt blocks it already caches.
    pub cached_blocks: u32,
    /// Requests waiting in its queue.
    pub queue: u32,
    /// Prompt tokens it has queued or admitted and not yet prefilled (its latest report).
    pub pending_tokens: u64,
    /// The most tokens one of its steps computes (0: not reported).
    pub max_batched_tokens: u32,
}

/// Everything the decision depends on besides the policy and the table.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouteInput {
    /// Prompt tokens.
    pub isl: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Prompt blocks the chosen decode worker already caches.
    pub decode_cached_blocks: u32,
    /// The chosen prefill worker; `None` when no prefill worker can take the request.
    pub prefill: Option<PrefillChoice>,
    /// The output length the classifier expects (tokens).
    pub output_len_hint: u32,
    /// Share of the chosen decode worker's KV pool in use (`None`: not reported).
    pub decode_kv_usage: Option<f64>,
}

impl RouteInput {
    /// The four features of DESIGN.md section 2: the prompt length, what is left of it after
    /// each chosen worker's cached prefix (the whole prompt when there is no prefill worker),
    /// and the expected output length.
    pub fn features(&self) -> Features {
        let uncached = |blocks: u32| {
            self.isl
                .saturating_sub(blocks.saturating_mul(self.block_size))
        };
        Features {
            isl: self.isl,
            eff_isl_prefill: self.prefill.map_or(self.isl, |p| uncached(p.cached_blocks)),
            eff_isl_decode: uncached(self.decode_cached_blocks),
            output_len_hint: self.output_len_hint,
        }
    }

    /// The chosen workers' load as the policies see it.
    pub fn pool_state(&self) -> PoolState {
        let p = self.prefill.unwrap_or_default();
        PoolState {
            available: self.prefill.is_some(),
            queue: p.queue,
            pending_tokens: p.pending_tokens,
            max_batched_tokens: p.max_batched_tokens,
            decode_kv_usage: self.decode_kv_usage,
        }
    }
}

/// A routing table as the decision uses it.
#[derive(Clone, Copy, Debug)]
pub struct TableRef<'a> {
    /// The compiled table.
    pub table: &'a CompiledTable,
    /// Its version, when it came from a store (the simulator's tables have none).
    pub version: Option<&'a Arc<str>>,
}

/// The decision for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// The four features it was made on.
    pub features: Features,
    /// Local or remote.
    pub decision: Decision,
    /// What decided.
    pub decided_by: DecidedBy,
    /// The request's cluster in the table, whenever a table was given (also under another
    /// policy: the simulator reports baselines per cluster of the table).
    pub cluster: Option<u32>,
    /// The version of the table that decided (`None` unless [`DecidedBy::Table`]).
    pub table_version: Option<Arc<str>>,
}

/// Why no decision can be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Remote prefill was forced, but no prefill worker can take the request.
    #[error("remote prefill was asked for, but no prefill worker is available")]
    NoPrefillWorker,
}

/// Decides the request's path.
///
/// - `force` (a caller's explicit choice) wins; forcing remote with no prefill worker fails.
/// - With no prefill worker the decision is local (the features and cluster are still reported).
/// - Under [`Policy::Dolphin`], `table` (the live split's) decides, and its load rule turns a
///   remote bit local while the chosen prefill worker is busy ([`DecidedBy::TableLoad`]);
///   without a table, the policy's
///   fallback does ([`DecidedBy::Fallback`]), and so it does for a request whose cluster's bit
///   the policy's [`TrustConfig`] distrusts ([`DecidedBy::Distrusted`]).
/// - Any other policy decides by its rule; `table`, if given, only names the cluster.
pub fn route(
    input: &RouteInput,
    policy: &Policy,
    table: Option<TableRef<'_>>,
    force: Option<Decision>,
) -> Result<Route, RouteError> {
    decide(input.features(), input.pool_state(), policy, table, force)
}

/// [`route`] on features already computed.
pub fn decide(
    features: Features,
    pools: PoolState,
    policy: &Policy,
    table: Option<TableRef<'_>>,
    force: Option<Decision>,
) -> Result<Route, RouteError> {
    let trust = match policy {
        Policy::Dolphin(cfg) => cfg.trust,
        _ => TrustConfig {
            enabled: false,
            ..TrustConfig::default()
        },
    };
    let looked_up = table.map(|t| (t, t.table.lookup_checked(&features, &trust)));
    let cluster = looked_up.and_then(|(_, (c, ..))| u32::try_from(c).ok());
    let mut table_version = None;
    let (decision, decided_by) = match (force, policy) {
        (Some(Decision::Remote), _) if !pools.available => {
            return Err(RouteError::NoPrefillWorker);
        }
        (Some(d), _) => (d, DecidedBy::Forced),
        (None, Policy::Dolphin(cfg)) => match looked_up {
            Some((_, (_, _, Some(why)))) => {
                let (decision, _) = fallback(cfg, &features, pools);
                (decision, DecidedBy::Distrusted(cfg.fallback, why))
            }
            Some((t, (_, bit, None))) => {
                table_version = t.version.cloned();
                let busy = t.table.load_rule().is_some_and(|rule| {
                    bit == Decision::Remote && pools.prefill_busy(rule.prefill_busy_threshold)
                });
                match (pools.available, busy) {
                    (true, false) => (bit, DecidedBy::Table),
                    (true, true) => (Decision::Local, DecidedBy::TableLoad),
                    (false, _) => (Decision::Local, DecidedBy::Table),
                }
            }
            None => fallback(cfg, &features, pools),
        },
        (None, p) => (p.decide(&features, pools), DecidedBy::Policy(p.kind())),
    };
    Ok(Route {
        features,
        decision,
        decided_by,
        cluster,
        table_version,
    })
}

fn fallback(cfg: &DolphinConfig, f: &Features, pools: PoolState) -> (Decision, DecidedBy) {
    (
        cfg.fallback_policy().decide(f, pools),
        DecidedBy::Fallback(cfg.fallback),
    )
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod tests;

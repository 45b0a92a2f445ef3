//! Prefill policies: local or remote prefill, per request.
//!
//! A policy sees the request's [`Features`] (the four numbers of DESIGN.md section 1) and the state
//! of the prefill worker chosen for it, and answers [`Decision::Local`] (the decode worker prefills)
//! or [`Decision::Remote`] (a prefill worker computes the KV and ships it).

use serde::{Deserialize, Serialize};

use crate::dolphin::online::OnlineConfig;
use crate::dolphin::trust::{Distrust, TrustConfig};

/// What the router knows about a request when it decides its path.
///
/// A learned `dolphin` policy will cluster exactly these numbers, so they are computed for every
/// request whatever the active policy is, and written to the request log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// Prompt length in tokens.
    pub isl: u32,
    /// Prompt tokens not cached on the chosen prefill worker (`isl` when there is none).
    pub eff_isl_prefill: u32,
    /// Prompt tokens not cached on the chosen decode worker.
    pub eff_isl_decode: u32,
    /// Expected output length in tokens: the representative length of the output class the
    /// classifier predicts (see `dolphin::classifier`), at most the request's `max_tokens`.
    pub output_len_hint: u32,
}

/// The chosen path of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// The decode worker prefills the prompt itself.
    Local,
    /// A prefill worker computes the KV and pushes it to the decode worker.
    Remote,
}

impl Decision {
    /// "local" / "remote", for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Local => "local",
            Decision::Remote => "remote",
        }
    }
}

/// The prefill path a request really took on its decode worker. It differs from the router's
/// [`Decision`] when the decode worker already held a remote request's prompt up to its last
/// block (`LocalHeld`) or the remote prefill failed (`LocalFallback`); learning and metrics
/// credit this path, not the decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillPath {
    /// Decided local; the decode worker prefilled.
    Local,
    /// Decided remote; a prefill worker computed the KV and the decode worker imported it.
    Remote,
    /// Decided remote; the decode worker held the prompt up to its last block and prefilled it.
    LocalHeld,
    /// Decided remote; the remote prefill failed and the decode worker prefilled.
    LocalFallback,
}

impl PrefillPath {
    /// "local", "remote", "local_held", "local_fallback": for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillPath::Local => "local",
            PrefillPath::Remote => "remote",
            PrefillPath::LocalHeld => "local_held",
            PrefillPath::LocalFallback => "local_fallback",
        }
    }

    /// The path taken when the decode worker followed `decision` (no hold, no failure).
    pub fn of(decision: Decision) -> Self {
        match decision {
            Decision::Local => PrefillPath::Local,
            Decision::Remote => PrefillPath::Remote,
        }
    }
}

/// The chosen workers' load as the policy sees it (their latest load reports).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolState {
    /// Whether a prefill worker was chosen at all (none live: every request is local).
    pub available: bool,
    /// Requests waiting in the chosen prefill worker's queue.
    pub queue: u32,
    /// Prompt tokens the chosen prefill worker has queued or admitted and not yet prefilled.
    pub pending_tokens: u64,
    /// The most tokens one of its steps computes (0: not reported).
    pub max_batched_tokens: u32,
    /// Share of the chosen decode worker's KV pool in use (`None`: not reported).
    pub decode_kv_usage: Option<f64>,
}

impl PoolState {
    /// A chosen prefill worker with nothing queued; nothing else reported.
    pub const IDLE: PoolState = PoolState {
        available: true,
        queue: 0,
        pending_tokens: 0,
        max_batched_tokens: 0,
        decode_kv_usage: None,
    };

    /// Whether the prefill worker's backlog exceeds `threshold` steps of work (Dynamo's
    /// `prefill_load` signal: active prefill tokens above `threshold x max_batched_tokens`).
    /// Never busy when its step size is not reported.
    pub fn prefill_busy(&self, threshold: f64) -> bool {
        self.max_batched_tokens > 0
            && self.pending_tokens as f64 > threshold * f64::from(self.max_batched_tokens)
    }
}

/// Which threshold rule to apply: Dynamo's conditional-disaggregation policies, its older rule,
/// or llm-d's prefix decider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ThresholdVariant {
    /// Dynamo 1.6 `isl_bounding`: local iff `eff_isl < max_local_prefill && eff_isl / isl <
    /// max_local_ratio` (or the prefill queue is at `max_prefill_queue` with
    /// `skip_overloaded_prefill`).
    Dynamo16,
    /// Older Dynamo: remote iff `eff_isl > legacy_min_remote && prefill_queue < max_prefill_queue`.
    DynamoLegacy,
    /// Dynamo `prefill_load`: local iff the chosen prefill worker is busy (pending prefill
    /// tokens above `prefill_busy_threshold x` its `max_batched_tokens`).
    PrefillLoad,
    /// Dynamo `isl_or_load`: local iff the `dynamo16` condition or the `prefill-load` one holds.
    IslOrLoad,
    /// llm-d's prefix decider: remote iff the prompt minus the chosen decode worker's cached
    /// prefix is at least `non_cached_tokens`.
    LlmD,
}

/// Parameters of the threshold policy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ThresholdConfig {
    /// Which rule.
    pub variant: ThresholdVariant,
    /// Dynamo 1.6: prefill locally only below this many uncached tokens.
    pub max_local_prefill: u32,
    /// Dynamo 1.6: ... and only when less than this share of the prompt is uncached.
    pub max_local_ratio: f64,
    /// Legacy: prefill remotely only above this many uncached tokens.
    pub legacy_min_remote: u32,
    /// A prefill worker with this many queued requests counts as overloaded.
    pub max_prefill_queue: u32,
    /// Dynamo 1.6: prefill locally when the chosen prefill worker is overloaded.
    pub skip_overloaded_prefill: bool,
    /// `prefill-load`, `isl-or-load`: a prefill worker with more than this many steps of
    /// prefill work pending is busy.
    pub prefill_busy_threshold: f64,
    /// Every rule: never prefill locally when more than this share of the chosen decode
    /// worker's KV pool is in use (Dynamo's decode-busy guard); `None`: no guard.
    pub decode_busy_threshold: Option<f64>,
    /// `llm-d`: prefill remotely from this many tokens not cached on the decode worker.
    pub non_cached_tokens: u32,
}

impl Default for ThresholdConfig {
    fn default() -> Self {
        Self {
            variant: ThresholdVariant::Dynamo16,
            max_local_prefill: 2048,
            max_local_ratio: 0.7,
            legacy_min_remote: 1000,
            max_prefill_queue: 2,
            skip_overloaded_prefill: false,
            prefill_busy_threshold: 1.0,
            decode_busy_threshold: None,
            non_cached_tokens: 2048,
        }
    }
}

impl ThresholdConfig {
    /// Checks the parameters' ranges.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.max_local_ratio.is_finite()
            && self.max_local_ratio > 0.0
            && self.max_local_ratio <= 1.0)
        {
            return Err(PolicyError::Invalid(format!(
                "max_local_ratio must be in (0, 1], got {}",
                self.max_local_ratio
            )));
        }
        if !(self.prefill_busy_threshold.is_finite() && self.prefill_busy_threshold >= 0.0) {
            return Err(PolicyError::Invalid(format!(
                "prefill_busy_threshold must be a finite number >= 0, got {}",
                self.prefill_busy_threshold
            )));
        }
        if let Some(t) = self.decode_busy_threshold
            && !(t.is_finite() && (0.0..=1.0).contains(&t))
        {
            return Err(PolicyError::Invalid(format!(
                "decode_busy_threshold must be in [0, 1], got {t}"
            )));
        }
        Ok(())
    }
}

/// The policy names the router knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Always prefill on the decode worker.
    AlwaysLocal,
    /// Always prefill on a prefill worker (when one exists).
    AlwaysRemote,
    /// Dynamo's threshold rules.
    Threshold,
    /// DolphinRouting: the learned table of the live split (fallback policy without one).
    Dolphin,
}

/// The policy deciding when the `dolphin` policy has no table for the live split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FallbackKind {
    /// Always local.
    AlwaysLocal,
    /// Always remote.
    AlwaysRemote,
    /// Dynamo's threshold rules (parameters in [`DolphinConfig::threshold`]).
    Threshold,
}

impl FallbackKind {
    /// The fallback's policy name ("always-local", "always-remote", "threshold").
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackKind::AlwaysLocal => "always-local",
            FallbackKind::AlwaysRemote => "always-remote",
            FallbackKind::Threshold => "threshold",
        }
    }
}

/// Who decided a request's path: a client's force, a plain policy, the `dolphin` policy's
/// table, or its fallback while the live split has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// The client forced the path.
    Forced,
    /// The active policy (never `dolphin`: that is `Table` or `Fallback`).
    Policy(PolicyKind),
    /// The `dolphin` policy's routing table.
    Table,
    /// The `dolphin` policy's routing table said remote, and its load rule made the request
    /// local: the chosen prefill worker was busy.
    TableLoad,
    /// The `dolphin` policy's fallback: the live split has no table.
    Fallback(FallbackKind),
    /// The `dolphin` policy's fallback: the table's bit was not trusted for this request (its
    /// cluster's evidence is thin, or the request lies beyond the cluster's training range).
    Distrusted(FallbackKind, Distrust),
    /// The `dolphin` policy's online learner sent the request by the path its cluster's bit
    /// does not give, to measure it (see `dolphin::online`).
    Explored,
}

impl DecidedBy {
    /// The label clients and logs see (`RoutingInfo.policy`, `x-dolphin-policy`, the request
    /// log): "forced", a policy's name, "dolphin", "dolphin-fallback/<policy>" or
    /// "dolphin-distrusted/<policy>".
    pub fn label(self) -> &'static str {
        match self {
            DecidedBy::Forced => "forced",
            DecidedBy::Policy(PolicyKind::AlwaysLocal) => "always-local",
            DecidedBy::Policy(PolicyKind::AlwaysRemote) => "always-remote",
            DecidedBy::Policy(PolicyKind::Threshold) => "threshold",
            DecidedBy::Policy(PolicyKind::Dolphin) | DecidedBy::Table => "dolphin",
            DecidedBy::TableLoad => "dolphin-load",
            DecidedBy::Fallback(FallbackKind::AlwaysLocal) => "dolphin-fallback/always-local",
            DecidedBy::Fallback(FallbackKind::AlwaysRemote) => "dolphin-fallback/always-remote",
            DecidedBy::Fallback(FallbackKind::Threshold) => "dolphin-fallback/threshold",
            DecidedBy::Distrusted(FallbackKind::AlwaysLocal, _) => {
                "dolphin-distrusted/always-local"
            }
            DecidedBy::Distrusted(FallbackKind::AlwaysRemote, _) => {
                "dolphin-distrusted/always-remote"
            }
            DecidedBy::Distrusted(FallbackKind::Threshold, _) => "dolphin-distrusted/threshold",
            DecidedBy::Explored => "dolphin-explore",
        }
    }
}

/// Parameters of the `dolphin` policy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DolphinConfig {
    /// Which policy decides while the live split has no table (default: the Dynamo 1.6 rule).
    pub fallback: FallbackKind,
    /// Parameters of a threshold fallback.
    pub threshold: ThresholdConfig,
    /// When a table's bit is trusted; the others go to the fallback.
    pub trust: TrustConfig,
    /// Learning from live traffic (off by default).
    pub online: OnlineConfig,
}

impl Default for DolphinConfig {
    fn default() -> Self {
        Self {
            fallback: FallbackKind::Threshold,
            threshold: ThresholdConfig::default(),
            trust: TrustConfig::default(),
            online: OnlineConfig::default(),
        }
    }
}

impl DolphinConfig {
    /// The fallback as a policy.
    pub fn fallback_policy(&self) -> Policy {
        match self.fallback {
            FallbackKind::AlwaysLocal => Policy::AlwaysLocal,
            FallbackKind::AlwaysRemote => Policy::AlwaysRemote,
            FallbackKind::Threshold => Policy::Threshold(self.threshold),
        }
    }
}

/// A prefill policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// Always local.
    AlwaysLocal,
    /// Always remote when a prefill worker is available.
    AlwaysRemote,
    /// Dynamo's rules.
    Threshold(ThresholdConfig),
    /// DolphinRouting. The table lives in the dispatcher (`dolphin::DolphinRouting`);
    /// [`Policy::decide`] alone, without a table, applies the fallback.
    Dolphin(DolphinConfig),
}

/// A policy that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Unknown policy name.
    #[error("unknown policy {0:?} (known: always-local, always-remote, threshold, dolphin)")]
    UnknownPolicy(String),
    /// Parameters that do not parse.
    #[error("bad policy parameters: {0}")]
    Params(#[source] serde_json::Error),
    /// Parameters out of range.
    #[error("bad policy parameters: {0}")]
    Invalid(String),
}

impl Policy {
    /// The policy's name as configured ("always-local", "always-remote", "threshold",
    /// "dolphin").
    pub fn name(&self) -> &'static str {
        match self {
            Policy::AlwaysLocal => "always-local",
            Policy::AlwaysRemote => "always-remote",
            Policy::Threshold(_) => "threshold",
            Policy::Dolphin(_) => "dolphin",
        }
    }

    /// The policy's kind.
    pub fn kind(&self) -> PolicyKind {
        match self {
            Policy::AlwaysLocal => PolicyKind::AlwaysLocal,
            Policy::AlwaysRemote => PolicyKind::AlwaysRemote,
            Policy::Threshold(_) => PolicyKind::Threshold,
            Policy::Dolphin(_) => PolicyKind::Dolphin,
        }
    }

    /// Decides the path of a request. With no prefill worker available it is always local.
    pub fn decide(&self, f: &Features, pools: PoolState) -> Decision {
        if !pools.available {
            return Decision::Local;
        }
        match self {
            Policy::AlwaysLocal => Decision::Local,
            Policy::AlwaysRemote => Decision::Remote,
            Policy::Threshold(cfg) => threshold(cfg, f, pools),
            Policy::Dolphin(cfg) => cfg.fallback_policy().decide(f, pools),
        }
    }

    /// Parameters as a JSON object (`{}` for the parameterless policies).
    pub fn params_json(&self) -> String {
        match self {
            Policy::Threshold(cfg) => serde_json::to_string(cfg).unwrap_or_else(|_| "{}".into()),
            Policy::Dolphin(cfg) => serde_json::to_string(cfg).unwrap_or_else(|_| "{}".into()),
            _ => "{}".into(),
        }
    }

    /// Builds a policy from a name and its JSON parameters (empty means defaults).
    pub fn from_parts(name: &str, params_json: &str) -> Result<Policy, PolicyError> {
        let params = if params_json.trim().is_empty() {
            "{}"
        } else {
            params_json
        };
        match name {
            "always-local" => Ok(Policy::AlwaysLocal),
            "always-remote" => Ok(Policy::AlwaysRemote),
            "threshold" => {
                let cfg: ThresholdConfig =
                    serde_json::from_str(params).map_err(PolicyError::Params)?;
                cfg.validate()?;
                Ok(Policy::Threshold(cfg))
            }
            "dolphin" => {
                let cfg: DolphinConfig =
                    serde_json::from_str(params).map_err(PolicyError::Params)?;
                cfg.threshold.validate()?;
                cfg.trust.validate().map_err(PolicyError::Invalid)?;
                cfg.online.validate().map_err(PolicyError::Invalid)?;
                Ok(Policy::Dolphin(cfg))
            }
            other => Err(PolicyError::UnknownPolicy(other.to_string())),
        }
    }
}

fn threshold(cfg: &ThresholdConfig, f: &Features, pools: PoolState) -> Decision {
    let eff = f.eff_isl_decode;
    let overloaded = pools.queue >= cfg.max_prefill_queue;
    // isl is never 0 for an admitted request; treat 0 as "nothing to prefill".
    let ratio = if f.isl == 0 {
        0.0
    } else {
        f64::from(eff) / f64::from(f.isl)
    };
    let isl_bounded = eff < cfg.max_local_prefill && ratio < cfg.max_local_ratio;
    let busy = || pools.prefill_busy(cfg.prefill_busy_threshold);
    let local = match cfg.variant {
        ThresholdVariant::Dynamo16 => (cfg.skip_overloaded_prefill && overloaded) || isl_bounded,
        ThresholdVariant::DynamoLegacy => eff <= cfg.legacy_min_remote || overloaded,
        ThresholdVariant::PrefillLoad => busy(),
        ThresholdVariant::IslOrLoad => isl_bounded || busy(),
        ThresholdVariant::LlmD => eff < cfg.non_cached_tokens,
    };
    let decode_busy = cfg
        .decode_busy_threshold
        .zip(pools.decode_kv_usage)
        .is_some_and(|(limit, usage)| usage > limit);
    if local && !decode_busy {
        Decision::Local
    } else {
        Decision::Remote
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feats(isl: u32, eff: u32) -> Features {
        Features {
            isl,
            eff_isl_prefill: isl,
            eff_isl_decode: eff,
            output_len_hint: 16,
        }
    }

    const IDLE: PoolState = PoolState::IDLE;
    const BUSY: PoolState = PoolState {
        queue: 5,
        ..PoolState::IDLE
    };
    const NONE: PoolState = PoolState {
        available: false,
        ..PoolState::IDLE
    };

    #[test]
    fn no_prefill_worker_means_local_for_every_policy() {
        for p in [
            Policy::AlwaysRemote,
            Policy::AlwaysLocal,
            Policy::Threshold(ThresholdConfig::default()),
            Policy::Dolphin(DolphinConfig::default()),
        ] {
            assert_eq!(p.decide(&feats(10_000, 10_000), NONE), Decision::Local);
        }
    }

    #[test]
    fn dynamo16_rule() {
        let p = Policy::Threshold(ThresholdConfig::default());
        // Mostly cached and short uncached part: local.
        assert_eq!(p.decide(&feats(8000, 1000), IDLE), Decision::Local);
        // Nothing cached: ratio 1.0 -> remote even when short.
        assert_eq!(p.decide(&feats(100, 100), IDLE), Decision::Remote);
        // Uncached part too long: remote.
        assert_eq!(p.decide(&feats(100_000, 2048), IDLE), Decision::Remote);
        assert_eq!(p.decide(&feats(100_000, 2047), IDLE), Decision::Local);
        // Ratio exactly at the limit: remote (strict inequality).
        assert_eq!(p.decide(&feats(1000, 700), IDLE), Decision::Remote);
        assert_eq!(p.decide(&feats(1000, 699), IDLE), Decision::Local);
    }

    #[test]
    fn dynamo16_skips_overloaded_prefill_only_when_enabled() {
        let off = Policy::Threshold(ThresholdConfig::default());
        let on = Policy::Threshold(ThresholdConfig {
            skip_overloaded_prefill: true,
            ..Default::default()
        });
        assert_eq!(off.decide(&feats(9000, 9000), BUSY), Decision::Remote);
        assert_eq!(on.decide(&feats(9000, 9000), BUSY), Decision::Local);
        assert_eq!(on.decide(&feats(9000, 9000), IDLE), Decision::Remote);
        let at_limit = PoolState {
            queue: 2,
            ..PoolState::IDLE
        };
        assert_eq!(on.decide(&feats(9000, 9000), at_limit), Decision::Local);
    }

    #[test]
    fn legacy_rule() {
        let p = Policy::Threshold(ThresholdConfig {
            variant: ThresholdVariant::DynamoLegacy,
            ..Default::default()
        });
        assert_eq!(p.decide(&feats(5000, 1001), IDLE), Decision::Remote);
        assert_eq!(p.decide(&feats(5000, 1000), IDLE), Decision::Local);
        assert_eq!(p.decide(&feats(5000, 5000), BUSY), Decision::Local);
        let one = PoolState {
            queue: 1,
            ..PoolState::IDLE
        };
        assert_eq!(p.decide(&feats(5000, 5000), one), Decision::Remote);
    }

    fn rule(variant: ThresholdVariant) -> ThresholdConfig {
        ThresholdConfig {
            variant,
            ..Default::default()
        }
    }

    #[test]
    fn dynamo_load_rules_and_the_decode_guard() {
        let backlog = |pending_tokens| PoolState {
            pending_tokens,
            max_batched_tokens: 8192,
            ..IDLE
        };
        let (busy, calm) = (backlog(8193), backlog(8192));
        let unreported = PoolState {
            pending_tokens: 1 << 30,
            ..IDLE
        };
        let load = Policy::Threshold(rule(ThresholdVariant::PrefillLoad));
        assert_eq!(load.decide(&feats(9000, 9000), busy), Decision::Local);
        assert_eq!(load.decide(&feats(9000, 9000), calm), Decision::Remote);
        assert_eq!(
            load.decide(&feats(8000, 10), calm),
            Decision::Remote,
            "ISL ignored"
        );
        assert_eq!(
            load.decide(&feats(9000, 9000), unreported),
            Decision::Remote
        );
        let either = Policy::Threshold(rule(ThresholdVariant::IslOrLoad));
        assert_eq!(either.decide(&feats(8000, 1000), calm), Decision::Local);
        assert_eq!(either.decide(&feats(9000, 9000), busy), Decision::Local);
        assert_eq!(either.decide(&feats(9000, 9000), calm), Decision::Remote);
        let guarded = Policy::Threshold(ThresholdConfig {
            decode_busy_threshold: Some(0.8),
            ..rule(ThresholdVariant::IslOrLoad)
        });
        let usage = |u| PoolState {
            decode_kv_usage: u,
            ..busy
        };
        assert_eq!(
            guarded.decide(&feats(8000, 1000), usage(Some(0.81))),
            Decision::Remote
        );
        assert_eq!(
            guarded.decide(&feats(8000, 1000), usage(Some(0.8))),
            Decision::Local
        );
        assert_eq!(
            guarded.decide(&feats(8000, 1000), usage(None)),
            Decision::Local
        );
        // Room on the decode worker lets the load arm stand; the guard never makes a remote
        // decision local.
        assert_eq!(
            guarded.decide(&feats(9000, 9000), usage(Some(0.0))),
            Decision::Local
        );
        assert_eq!(
            guarded.decide(
                &feats(9000, 9000),
                PoolState {
                    decode_kv_usage: Some(0.0),
                    ..calm
                }
            ),
            Decision::Remote
        );
    }

    #[test]
    fn llm_d_prefix_decider() {
        let p = Policy::Threshold(rule(ThresholdVariant::LlmD));
        assert_eq!(p.decide(&feats(9000, 2047), IDLE), Decision::Local);
        assert_eq!(p.decide(&feats(9000, 2048), IDLE), Decision::Remote);
        // No ratio condition: a short uncached prompt stays local.
        assert_eq!(p.decide(&feats(100, 100), IDLE), Decision::Local);
    }

    #[test]
    fn load_thresholds_out_of_range_are_refused() {
        for cfg in [
            ThresholdConfig {
                prefill_busy_threshold: -1.0,
                ..Default::default()
            },
            ThresholdConfig {
                prefill_busy_threshold: f64::NAN,
                ..Default::default()
            },
            ThresholdConfig {
                decode_busy_threshold: Some(1.5),
                ..Default::default()
            },
        ] {
            assert!(cfg.validate().is_err(), "{cfg:?}");
        }
        assert!(ThresholdConfig::default().validate().is_ok());
    }

    #[test]
    fn dolphin_without_a_table_applies_its_fallback() {
        let d = Policy::Dolphin(DolphinConfig::default());
        let t = Policy::Threshold(ThresholdConfig::default());
        for (isl, eff) in [(8000, 1000), (100, 100), (100_000, 2048)] {
            assert_eq!(
                d.decide(&feats(isl, eff), IDLE),
                t.decide(&feats(isl, eff), IDLE)
            );
        }
        let local = Policy::Dolphin(DolphinConfig {
            fallback: FallbackKind::AlwaysLocal,
            ..Default::default()
        });
        assert_eq!(local.decide(&feats(100, 100), IDLE), Decision::Local);
    }

    #[test]
    fn fixed_policies() {
        assert_eq!(
            Policy::AlwaysLocal.decide(&feats(9000, 9000), IDLE),
            Decision::Local
        );
        assert_eq!(
            Policy::AlwaysRemote.decide(&feats(1, 0), IDLE),
            Decision::Remote
        );
    }

    #[test]
    fn parts_roundtrip_and_errors() {
        let p = Policy::Threshold(ThresholdConfig {
            max_local_prefill: 512,
            ..Default::default()
        });
        let back = Policy::from_parts(p.name(), &p.params_json()).expect("roundtrip");
        assert_eq!(back, p);
        assert_eq!(
            Policy::from_parts("always-local", "").expect("ok"),
            Policy::AlwaysLocal
        );
        let partial =
            Policy::from_parts("threshold", r#"{"variant":"dynamo-legacy"}"#).expect("partial");
        assert!(
            matches!(partial, Policy::Threshold(c) if c.variant == ThresholdVariant::DynamoLegacy && c.max_local_prefill == 2048)
        );
        assert!(matches!(
            Policy::from_parts("sometimes", ""),
            Err(PolicyError::UnknownPolicy(_))
        ));
        let d = Policy::from_parts("dolphin", r#"{"fallback":"always-local"}"#).expect("dolphin");
        assert_eq!(
            d,
            Policy::Dolphin(DolphinConfig {
                fallback: FallbackKind::AlwaysLocal,
                ..Default::default()
            })
        );
        assert_eq!(
            Policy::from_parts(d.name(), &d.params_json()).expect("rt"),
            d
        );
        assert!(matches!(
            Policy::from_parts("dolphin", r#"{"threshold":{"max_local_ratio":2}}"#),
            Err(PolicyError::Invalid(_))
        ));
        assert!(matches!(
            Policy::from_parts("threshold", r#"{"bogus":1}"#),
            Err(PolicyError::Params(_))
        ));
        assert!(matches!(
            Policy::from_parts("threshold", r#"{"max_local_ratio":1.5}"#),
            Err(PolicyError::Invalid(_))
        ));
    }
}

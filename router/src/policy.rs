//! Prefill policies: local or remote prefill, per request.
//!
//! A policy sees the request's [`Features`] (the four numbers of DESIGN.md section 1) and the state
//! of the prefill worker chosen for it, and answers [`Decision::Local`] (the decode worker prefills)
//! or [`Decision::Remote`] (a prefill worker computes the KV and ships it).

use serde::{Deserialize, Serialize};

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

/// State of the prefill pool as the policy sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillState {
    /// Whether a prefill worker was chosen at all (none live: every request is local).
    pub available: bool,
    /// Requests waiting in the chosen prefill worker's queue.
    pub queue: u32,
}

/// Which of Dynamo's two threshold rules to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ThresholdVariant {
    /// Dynamo 1.6: remote unless `eff_isl < max_local_prefill && eff_isl / isl < max_local_ratio`.
    Dynamo16,
    /// Older Dynamo: remote iff `eff_isl > legacy_min_remote && prefill_queue < max_prefill_queue`.
    DynamoLegacy,
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
    /// The `dolphin` policy's fallback: the live split has no table.
    Fallback(FallbackKind),
}

impl DecidedBy {
    /// The label clients and logs see (`RoutingInfo.policy`, `x-dolphin-policy`, the request
    /// log): "forced", a policy's name, "dolphin", or "dolphin-fallback/<policy>".
    pub fn label(self) -> &'static str {
        match self {
            DecidedBy::Forced => "forced",
            DecidedBy::Policy(PolicyKind::AlwaysLocal) => "always-local",
            DecidedBy::Policy(PolicyKind::AlwaysRemote) => "always-remote",
            DecidedBy::Policy(PolicyKind::Threshold) => "threshold",
            DecidedBy::Policy(PolicyKind::Dolphin) | DecidedBy::Table => "dolphin",
            DecidedBy::Fallback(FallbackKind::AlwaysLocal) => "dolphin-fallback/always-local",
            DecidedBy::Fallback(FallbackKind::AlwaysRemote) => "dolphin-fallback/always-remote",
            DecidedBy::Fallback(FallbackKind::Threshold) => "dolphin-fallback/threshold",
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
}

impl Default for DolphinConfig {
    fn default() -> Self {
        Self {
            fallback: FallbackKind::Threshold,
            threshold: ThresholdConfig::default(),
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
    pub fn decide(&self, f: &Features, prefill: PrefillState) -> Decision {
        if !prefill.available {
            return Decision::Local;
        }
        match self {
            Policy::AlwaysLocal => Decision::Local,
            Policy::AlwaysRemote => Decision::Remote,
            Policy::Threshold(cfg) => threshold(cfg, f, prefill),
            Policy::Dolphin(cfg) => cfg.fallback_policy().decide(f, prefill),
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
                Ok(Policy::Dolphin(cfg))
            }
            other => Err(PolicyError::UnknownPolicy(other.to_string())),
        }
    }
}

fn threshold(cfg: &ThresholdConfig, f: &Features, prefill: PrefillState) -> Decision {
    let eff = f.eff_isl_decode;
    let overloaded = prefill.queue >= cfg.max_prefill_queue;
    match cfg.variant {
        ThresholdVariant::Dynamo16 => {
            if cfg.skip_overloaded_prefill && overloaded {
                return Decision::Local;
            }
            // isl is never 0 for an admitted request; treat 0 as "nothing to prefill".
            let ratio = if f.isl == 0 {
                0.0
            } else {
                f64::from(eff) / f64::from(f.isl)
            };
            if eff < cfg.max_local_prefill && ratio < cfg.max_local_ratio {
                Decision::Local
            } else {
                Decision::Remote
            }
        }
        ThresholdVariant::DynamoLegacy => {
            if eff > cfg.legacy_min_remote && !overloaded {
                Decision::Remote
            } else {
                Decision::Local
            }
        }
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

    const IDLE: PrefillState = PrefillState {
        available: true,
        queue: 0,
    };
    const BUSY: PrefillState = PrefillState {
        available: true,
        queue: 5,
    };
    const NONE: PrefillState = PrefillState {
        available: false,
        queue: 0,
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
        let at_limit = PrefillState {
            available: true,
            queue: 2,
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
        let one = PrefillState {
            available: true,
            queue: 1,
        };
        assert_eq!(p.decide(&feats(5000, 5000), one), Decision::Remote);
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

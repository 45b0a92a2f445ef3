//! Algorithm specs: the text form (`entropy`, `entropy:threshold=2.5,span=8`) that names a
//! handoff algorithm and its parameters on command lines, in configs and in reports, and that
//! builds a fresh per-request [`HandoffAlgorithm`].

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::algorithm::HandoffAlgorithm;
use crate::algorithms::{
    AlwaysLarge, AlwaysSmall, ConfidenceGate, EnsembleGate, EntropyGate, RandomHandoff, Signal,
    UncertaintyMomentum,
};

/// Default hand-off probability after a small-model step of the `random` control.
const RANDOM_TO_LARGE: f64 = 0.1;
/// Default hand-back probability after a large-model step of the `random` control.
const RANDOM_TO_SMALL: f64 = 0.75;

/// A handoff algorithm by name with numeric parameters, e.g. `entropy:threshold=2.5,span=8`.
///
/// The text form is the name, then optionally `:` and comma-separated `key=value` pairs; values
/// are numbers, except that momentum's `signal` may also be written by name (`entropy`, `prob`,
/// `margin`; stored as its code 0, 1, 2). Parsing ignores case, accepts `_` for `-` in names
/// and `-` for `_` in keys, resolves aliases to the canonical name ([`AlgorithmSpec::names`])
/// and checks the parameters like [`AlgorithmSpec::build`] does. Missing parameters take the
/// algorithm's defaults, chosen for SmolLM2-135M-like models (entropy in nats over a 49k
/// vocabulary):
///
/// | name (alias) | parameters (default) |
/// |---|---|
/// | `entropy` (`r-stitch`) | `threshold` (2.0), `span` (4), `back_entropy` (1.0) |
/// | `confidence` (`co-llm`) | `threshold` (0.5), `span` (4) |
/// | `momentum` (`r2r`) | `level` (1.5), `hysteresis` (0.3), `decay` (0.5), `signal` (entropy; level 0.5 and hysteresis 0.1 for prob and margin) |
/// | `ensemble` | `entropy` (2.0), `prob` (0.5), `span` (4) |
/// | `always-small`, `always-large` | none |
/// | `random` | `to_large` (0.1), `to_small` (0.75); or `share` and `span` (mean large span, default `1 / to_small`) for [`RandomHandoff::for_share`] |
///
/// [`Display`](fmt::Display) writes the text form back, parameters in key order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlgorithmSpec {
    /// The algorithm's name (canonical once parsed; an alias also builds).
    pub name: String,
    /// Parameters by key; missing ones take the algorithm's defaults.
    pub params: BTreeMap<String, f64>,
}

/// Why an algorithm spec does not parse or build.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The spec names no algorithm.
    #[error("empty handoff algorithm spec; accepted algorithms: {accepted}")]
    Empty {
        /// The accepted algorithm names.
        accepted: String,
    },
    /// The name is not a known algorithm.
    #[error("unknown handoff algorithm `{name}`; accepted: {accepted}")]
    UnknownAlgorithm {
        /// The name given.
        name: String,
        /// The accepted algorithm names.
        accepted: String,
    },
    /// A parameter is not written `key=value`.
    #[error("malformed parameter `{item}` of `{algorithm}`: expected key=value")]
    Malformed {
        /// The algorithm.
        algorithm: String,
        /// The text that is not `key=value`.
        item: String,
    },
    /// The algorithm has no such parameter.
    #[error("`{algorithm}` has no parameter `{key}`; accepted: {accepted}")]
    UnknownParam {
        /// The algorithm.
        algorithm: String,
        /// The key given.
        key: String,
        /// The algorithm's parameters.
        accepted: String,
    },
    /// A parameter's value cannot be read.
    #[error("parameter `{key}` of `{algorithm}`: cannot read `{value}`, expected {expected}")]
    BadValue {
        /// The algorithm.
        algorithm: String,
        /// The parameter.
        key: String,
        /// The text given.
        value: String,
        /// What the parameter accepts.
        expected: &'static str,
    },
    /// A parameter is given twice.
    #[error("parameter `{key}` of `{algorithm}` is given twice")]
    Duplicate {
        /// The algorithm.
        algorithm: String,
        /// The parameter.
        key: String,
    },
    /// A parameter's value is outside what it accepts.
    #[error("parameter `{key}` of `{algorithm}` is {value}, expected {expected}")]
    OutOfRange {
        /// The algorithm.
        algorithm: String,
        /// The parameter.
        key: String,
        /// The value given.
        value: f64,
        /// What the parameter accepts.
        expected: &'static str,
    },
    /// Two parameters that set the same thing are both given.
    #[error("parameters `{first}` and `{second}` of `{algorithm}` conflict: give one of them")]
    Conflict {
        /// The algorithm.
        algorithm: String,
        /// One parameter.
        first: &'static str,
        /// The other.
        second: &'static str,
    },
    /// The parameters are each in range but do not make a working algorithm together.
    #[error("invalid `{algorithm}` parameters: {reason}")]
    Invalid {
        /// The algorithm.
        algorithm: String,
        /// What is wrong.
        reason: String,
    },
}

/// The algorithms, in [`Def`] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Entropy,
    Confidence,
    Momentum,
    Ensemble,
    AlwaysSmall,
    AlwaysLarge,
    Random,
}

/// What a parameter accepts.
#[derive(Clone, Copy, Debug)]
enum Accepts {
    NonNegative,
    Probability,
    Count,
    Decay,
    Signal,
    MeanSpan,
}

impl Accepts {
    fn accepts(self, v: f64) -> bool {
        match self {
            Accepts::NonNegative => v.is_finite() && v >= 0.0,
            Accepts::Probability => (0.0..=1.0).contains(&v),
            Accepts::Count => (1.0..=f64::from(u32::MAX)).contains(&v) && v.fract() == 0.0,
            Accepts::Decay => (0.0..1.0).contains(&v),
            Accepts::Signal => Signal::from_code(v).is_some(),
            Accepts::MeanSpan => v.is_finite() && v >= 1.0,
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Accepts::NonNegative => "a finite number >= 0",
            Accepts::Probability => "a probability in [0, 1]",
            Accepts::Count => "a whole number >= 1",
            Accepts::Decay => "a number in [0, 1)",
            Accepts::Signal => "a signal: entropy (0), prob (1) or margin (2)",
            Accepts::MeanSpan => "a finite number >= 1",
        }
    }
}

/// One algorithm's names and parameters.
#[derive(Debug)]
struct Def {
    kind: Kind,
    name: &'static str,
    alias: Option<&'static str>,
    params: &'static [(&'static str, Accepts)],
    /// The parameter a request's single "threshold" value overrides.
    threshold: Option<&'static str>,
    /// Pairs of parameters that set the same thing (setting one drops the other).
    conflicts: &'static [(&'static str, &'static str)],
}

impl Def {
    fn param(&self, key: &str) -> Option<Accepts> {
        self.params.iter().find(|(k, _)| *k == key).map(|&(_, a)| a)
    }

    fn accepted_params(&self) -> String {
        if self.params.is_empty() {
            "none".to_owned()
        } else {
            self.params
                .iter()
                .map(|(k, _)| *k)
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

static DEFS: [Def; 7] = [
    Def {
        kind: Kind::Entropy,
        name: "entropy",
        alias: Some("r-stitch"),
        params: &[
            ("threshold", Accepts::NonNegative),
            ("span", Accepts::Count),
            ("back_entropy", Accepts::NonNegative),
        ],
        threshold: Some("threshold"),
        conflicts: &[],
    },
    Def {
        kind: Kind::Confidence,
        name: "confidence",
        alias: Some("co-llm"),
        params: &[
            ("threshold", Accepts::Probability),
            ("span", Accepts::Count),
        ],
        threshold: Some("threshold"),
        conflicts: &[],
    },
    Def {
        kind: Kind::Momentum,
        name: "momentum",
        alias: Some("r2r"),
        params: &[
            ("level", Accepts::NonNegative),
            ("hysteresis", Accepts::NonNegative),
            ("decay", Accepts::Decay),
            ("signal", Accepts::Signal),
        ],
        threshold: Some("level"),
        conflicts: &[],
    },
    Def {
        kind: Kind::Ensemble,
        name: "ensemble",
        alias: None,
        params: &[
            ("entropy", Accepts::NonNegative),
            ("prob", Accepts::Probability),
            ("span", Accepts::Count),
        ],
        threshold: Some("entropy"),
        conflicts: &[],
    },
    Def {
        kind: Kind::AlwaysSmall,
        name: "always-small",
        alias: None,
        params: &[],
        threshold: None,
        conflicts: &[],
    },
    Def {
        kind: Kind::AlwaysLarge,
        name: "always-large",
        alias: None,
        params: &[],
        threshold: None,
        conflicts: &[],
    },
    Def {
        kind: Kind::Random,
        name: "random",
        alias: None,
        params: &[
            ("to_large", Accepts::Probability),
            ("to_small", Accepts::Probability),
            ("share", Accepts::Probability),
            ("span", Accepts::MeanSpan),
        ],
        threshold: Some("to_large"),
        conflicts: &[("share", "to_large"), ("span", "to_small")],
    },
];

static NAMES: [&str; 7] = [
    "entropy",
    "confidence",
    "momentum",
    "ensemble",
    "always-small",
    "always-large",
    "random",
];

/// A name as parsed: trimmed, lower case, `_` read as `-`.
fn normalize_name(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

/// A key as parsed: trimmed, lower case, `-` read as `_`.
fn normalize_key(key: &str) -> String {
    key.trim().to_ascii_lowercase().replace('-', "_")
}

/// The definition of an algorithm by name or alias (normalized).
fn lookup(name: &str) -> Option<&'static Def> {
    let name = normalize_name(name);
    DEFS.iter()
        .find(|d| d.name == name || d.alias == Some(name.as_str()))
}

/// The accepted names, aliases in parentheses, for error messages.
fn accepted_names() -> String {
    DEFS.iter()
        .map(|d| match d.alias {
            Some(alias) => format!("{} (alias {alias})", d.name),
            None => d.name.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_algorithm(name: &str) -> SpecError {
    SpecError::UnknownAlgorithm {
        name: name.to_owned(),
        accepted: accepted_names(),
    }
}

/// The parameter a request's single "threshold" value overrides for algorithm `name` (canonical
/// or alias): `threshold` for `entropy` and `confidence`, `level` for `momentum`, `entropy` for
/// `ensemble`, `to_large` for `random`; `None` for the fixed references and unknown names.
pub fn threshold_key(name: &str) -> Option<&'static str> {
    lookup(name).and_then(|d| d.threshold)
}

impl AlgorithmSpec {
    /// A spec for algorithm `name` with no parameters (unchecked: [`AlgorithmSpec::build`]
    /// checks).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            params: BTreeMap::new(),
        }
    }

    /// The canonical algorithm names (each also parses; see [`AlgorithmSpec`] for aliases).
    pub fn names() -> &'static [&'static str] {
        &NAMES
    }

    /// Sets parameter `key` (`-` read as `_`) to `value`, replacing any earlier value. Where two
    /// parameters set the same thing (`random`'s `share` and `to_large`, `span` and `to_small`),
    /// the other one is dropped, so that an override wins. Unchecked: [`AlgorithmSpec::build`]
    /// checks.
    pub fn with_param(mut self, key: &str, value: f64) -> Self {
        let key = normalize_key(key);
        if let Some(def) = lookup(&self.name) {
            for &(a, b) in def.conflicts {
                if key == a {
                    self.params.remove(b);
                } else if key == b {
                    self.params.remove(a);
                }
            }
        }
        self.params.insert(key, value);
        self
    }

    /// Sets the parameter a request's single "threshold" value overrides
    /// ([`threshold_key`]); unchanged for algorithms without one.
    pub fn with_threshold(self, value: f64) -> Self {
        match threshold_key(&self.name) {
            Some(key) => self.with_param(key, value),
            None => self,
        }
    }

    /// Checks the spec as [`AlgorithmSpec::build`] does, building nothing.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.build(0).map(drop)
    }

    /// Builds a fresh algorithm for one request, missing parameters taking their defaults;
    /// `seed` seeds the `random` control (the others ignore it). Fails on an unknown name, an
    /// unknown, out-of-range or conflicting parameter, or a momentum whose `hysteresis` is not
    /// below its `level` (its large model would never hand back).
    pub fn build(&self, seed: u64) -> Result<Box<dyn HandoffAlgorithm>, SpecError> {
        let def = lookup(&self.name).ok_or_else(|| unknown_algorithm(&self.name))?;
        let algorithm = || def.name.to_owned();
        for (key, &value) in &self.params {
            let accepts = def.param(key).ok_or_else(|| SpecError::UnknownParam {
                algorithm: algorithm(),
                key: key.clone(),
                accepted: def.accepted_params(),
            })?;
            if !accepts.accepts(value) {
                return Err(SpecError::OutOfRange {
                    algorithm: algorithm(),
                    key: key.clone(),
                    value,
                    expected: accepts.expected(),
                });
            }
        }
        for &(first, second) in def.conflicts {
            if self.params.contains_key(first) && self.params.contains_key(second) {
                return Err(SpecError::Conflict {
                    algorithm: algorithm(),
                    first,
                    second,
                });
            }
        }
        let param = |key: &str| self.params.get(key).copied();
        let get = |key: &str, default: f64| param(key).unwrap_or(default);
        // Counts are checked whole and within u32 above.
        let count = |key: &str, default: u32| param(key).map_or(default, |v| v as u32);
        let built: Box<dyn HandoffAlgorithm> = match def.kind {
            Kind::Entropy => {
                let d = EntropyGate::default();
                Box::new(EntropyGate::new(
                    get("threshold", d.threshold.into()) as f32,
                    count("span", d.span),
                    get("back_entropy", d.back_entropy.into()) as f32,
                ))
            }
            Kind::Confidence => {
                let d = ConfidenceGate::default();
                Box::new(ConfidenceGate::new(
                    get("threshold", d.threshold.into()) as f32,
                    count("span", d.span),
                ))
            }
            Kind::Momentum => {
                let signal = param("signal")
                    .and_then(Signal::from_code)
                    .unwrap_or_default();
                let d = UncertaintyMomentum::for_signal(signal);
                let level = get("level", d.level.into()) as f32;
                let hysteresis = get("hysteresis", d.hysteresis.into()) as f32;
                if hysteresis >= level {
                    return Err(SpecError::Invalid {
                        algorithm: algorithm(),
                        reason: format!(
                            "hysteresis ({hysteresis}) must be below level ({level}), or the \
                             large model never hands back"
                        ),
                    });
                }
                let decay = get("decay", d.decay.into()) as f32;
                Box::new(UncertaintyMomentum::new(level, hysteresis, decay, signal))
            }
            Kind::Ensemble => {
                let d = EnsembleGate::default();
                Box::new(EnsembleGate::new(
                    get("entropy", d.entropy.into()) as f32,
                    get("prob", d.prob.into()) as f32,
                    count("span", d.span),
                ))
            }
            Kind::AlwaysSmall => Box::new(AlwaysSmall),
            Kind::AlwaysLarge => Box::new(AlwaysLarge),
            Kind::Random => {
                let span = param("span");
                let to_small = span.map_or_else(|| get("to_small", RANDOM_TO_SMALL), |s| 1.0 / s);
                Box::new(match param("share") {
                    Some(share) => {
                        RandomHandoff::for_share(share, span.unwrap_or(1.0 / to_small), seed)
                    }
                    None => RandomHandoff::new(get("to_large", RANDOM_TO_LARGE), to_small, seed),
                })
            }
        };
        Ok(built)
    }
}

impl fmt::Display for AlgorithmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        for (i, (key, &value)) in self.params.iter().enumerate() {
            f.write_str(if i == 0 { ":" } else { "," })?;
            match Signal::from_code(value) {
                Some(signal) if key == "signal" => write!(f, "{key}={signal}")?,
                _ => write!(f, "{key}={value}")?,
            }
        }
        Ok(())
    }
}

impl FromStr for AlgorithmSpec {
    type Err = SpecError;

    /// Parses the text form and checks it like [`AlgorithmSpec::build`] does.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, params) = match s.split_once(':') {
            Some((name, params)) => (name, Some(params)),
            None => (s, None),
        };
        let name = normalize_name(name);
        if name.is_empty() {
            return Err(SpecError::Empty {
                accepted: accepted_names(),
            });
        }
        let def = lookup(&name).ok_or_else(|| unknown_algorithm(&name))?;
        let mut spec = AlgorithmSpec::new(def.name);
        for item in params.unwrap_or_default().split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (key, value) = item.split_once('=').ok_or_else(|| SpecError::Malformed {
                algorithm: def.name.to_owned(),
                item: item.to_owned(),
            })?;
            let key = normalize_key(key);
            let accepts = def.param(&key).ok_or_else(|| SpecError::UnknownParam {
                algorithm: def.name.to_owned(),
                key: key.clone(),
                accepted: def.accepted_params(),
            })?;
            let value = value.trim();
            let number = value.parse::<f64>().ok().or_else(|| match accepts {
                Accepts::Signal => value.parse::<Signal>().ok().map(Signal::code),
                _ => None,
            });
            let Some(number) = number else {
                return Err(SpecError::BadValue {
                    algorithm: def.name.to_owned(),
                    key,
                    value: value.to_owned(),
                    expected: accepts.expected(),
                });
            };
            if spec.params.insert(key.clone(), number).is_some() {
                return Err(SpecError::Duplicate {
                    algorithm: def.name.to_owned(),
                    key,
                });
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<AlgorithmSpec, SpecError> {
        s.parse()
    }

    fn built(s: &str) -> String {
        let spec = parse(s).expect("parses");
        format!("{:?}", spec.build(1).expect("builds"))
    }

    #[test]
    fn parses_names_and_params() {
        let spec = parse("entropy").expect("parses");
        assert_eq!(spec, AlgorithmSpec::new("entropy"));
        assert_eq!(spec.to_string(), "entropy");

        let spec = parse("entropy:threshold=2.5,span=8").expect("parses");
        assert_eq!(spec.name, "entropy");
        assert_eq!(spec.params.get("threshold"), Some(&2.5));
        assert_eq!(spec.params.get("span"), Some(&8.0));
        assert_eq!(spec.to_string(), "entropy:span=8,threshold=2.5");
        assert_eq!(parse(&spec.to_string()), Ok(spec));

        assert_eq!(
            parse(" R-Stitch : Back-Entropy = 0.5 , ")
                .expect("parses")
                .to_string(),
            "entropy:back_entropy=0.5"
        );
        assert_eq!(parse("co_llm").expect("parses").name, "confidence");
        assert_eq!(parse("r2r").expect("parses").name, "momentum");
    }

    #[test]
    fn display_roundtrips() {
        for text in [
            "confidence:span=2,threshold=0.25",
            "momentum:decay=0.75,hysteresis=0.2,level=1,signal=margin",
            "ensemble:entropy=3,prob=0.4,span=6",
            "random:share=0.3,span=4",
            "random:to_large=0.05,to_small=0.5",
            "always-small",
            "always-large",
        ] {
            let spec = parse(text).expect("parses");
            assert_eq!(spec.to_string(), text);
            assert_eq!(parse(&spec.to_string()), Ok(spec));
        }
        let spec = parse("momentum:signal=1").expect("parses");
        assert_eq!(spec.to_string(), "momentum:signal=prob");
    }

    #[test]
    fn builds_with_defaults_and_params() {
        assert_eq!(
            built("entropy"),
            "EntropyGate { threshold: 2.0, span: 4, back_entropy: 1.0 }"
        );
        assert_eq!(
            built("entropy:threshold=2.5,span=8"),
            "EntropyGate { threshold: 2.5, span: 8, back_entropy: 1.0 }"
        );
        assert_eq!(
            built("confidence"),
            "ConfidenceGate { threshold: 0.5, span: 4 }"
        );
        assert!(
            built("momentum").contains("level: 1.5, hysteresis: 0.3, decay: 0.5, signal: Entropy")
        );
        assert!(built("momentum:signal=prob").contains("level: 0.5, hysteresis: 0.1"));
        assert_eq!(
            built("ensemble"),
            "EnsembleGate { entropy: 2.0, prob: 0.5, span: 4 }"
        );
        assert!(built("random").contains("to_large: 0.1, to_small: 0.75"));
        assert!(built("random:share=0.5,span=4").contains("to_large: 0.2, to_small: 0.25"));
        assert_eq!(built("always-small"), "AlwaysSmall");
        let large = parse("always-large")
            .expect("parses")
            .build(0)
            .expect("builds");
        assert_eq!(large.start(), 1);
        for name in AlgorithmSpec::names() {
            let spec = parse(name).expect("parses");
            assert_eq!(spec.name, *name);
            assert!(spec.build(7).is_ok());
        }
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(matches!(parse(""), Err(SpecError::Empty { .. })));
        assert!(matches!(parse(":span=2"), Err(SpecError::Empty { .. })));
        let err = parse("greedy").expect_err("unknown");
        assert!(matches!(err, SpecError::UnknownAlgorithm { .. }));
        assert!(
            err.to_string().contains("entropy (alias r-stitch)"),
            "{err}"
        );
        assert!(err.to_string().contains("random"), "{err}");

        let err = parse("entropy:temperature=1").expect_err("unknown param");
        assert!(
            err.to_string()
                .contains("accepted: threshold, span, back_entropy"),
            "{err}"
        );
        let err = parse("always-small:span=1").expect_err("no params");
        assert!(err.to_string().ends_with("accepted: none"), "{err}");

        for bad in [
            "entropy:span=0",
            "entropy:span=2.5",
            "confidence:threshold=1.5",
        ] {
            assert!(
                matches!(parse(bad), Err(SpecError::OutOfRange { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            parse("entropy:threshold=inf"),
            Err(SpecError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse("momentum:decay=1"),
            Err(SpecError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse("momentum:signal=3"),
            Err(SpecError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse("entropy:threshold"),
            Err(SpecError::Malformed { .. })
        ));
        assert!(matches!(
            parse("entropy:threshold=abc"),
            Err(SpecError::BadValue { .. })
        ));
        assert!(matches!(
            parse("momentum:signal=loss"),
            Err(SpecError::BadValue { .. })
        ));
        assert!(matches!(
            parse("entropy:span=2,span=3"),
            Err(SpecError::Duplicate { .. })
        ));
        assert!(matches!(
            parse("random:share=0.3,to_large=0.1"),
            Err(SpecError::Conflict { .. })
        ));
        assert!(matches!(
            parse("momentum:level=0.2,hysteresis=0.3"),
            Err(SpecError::Invalid { .. })
        ));
        // Built specs are checked too.
        assert!(AlgorithmSpec::new("nope").build(0).is_err());
        assert!(
            AlgorithmSpec::new("entropy")
                .with_param("span", -1.0)
                .build(0)
                .is_err()
        );
    }

    #[test]
    fn overrides() {
        let spec = parse("random:share=0.3,span=4").expect("parses");
        let spec = spec.with_param("to_large", 0.2).with_param("to_small", 0.5);
        assert_eq!(spec.to_string(), "random:to_large=0.2,to_small=0.5");
        assert!(spec.validate().is_ok());

        assert_eq!(threshold_key("entropy"), Some("threshold"));
        assert_eq!(threshold_key("co-llm"), Some("threshold"));
        assert_eq!(threshold_key("r2r"), Some("level"));
        assert_eq!(threshold_key("ensemble"), Some("entropy"));
        assert_eq!(threshold_key("random"), Some("to_large"));
        assert_eq!(threshold_key("always-small"), None);
        assert_eq!(threshold_key("always-large"), None);
        assert_eq!(threshold_key("nope"), None);

        let spec = parse("momentum").expect("parses").with_threshold(2.0);
        assert_eq!(spec.to_string(), "momentum:level=2");
        let spec = parse("always-large").expect("parses").with_threshold(2.0);
        assert_eq!(spec.to_string(), "always-large");
    }
}

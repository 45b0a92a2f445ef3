//! Timing profiles of the simulated engine, loaded from JSON (shipped ones are embedded).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Shipped profiles: (name, JSON).
const BUILTIN: &[(&str, &str)] = &[
    (
        "dynamo-mocker",
        include_str!("../../profiles/dynamo-mocker.json"),
    ),
    (
        "qwen72b-h20",
        include_str!("../../profiles/qwen72b-h20.json"),
    ),
    (
        "qwen3-0.6b-a100",
        include_str!("../../profiles/qwen3-0.6b-a100.json"),
    ),
    (
        "qwen3-32b-2xa100",
        include_str!("../../profiles/qwen3-32b-2xa100.json"),
    ),
];

/// Prefill step time in ms: `t2 * t^2 + t1 * t + t0 + tc * p`, t = new prompt tokens in the
/// step, p = the sum over its prompt chunks of chunk tokens times the tokens already computed
/// before the chunk (attention of the new tokens over a cached prefix or earlier chunks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillCost {
    /// Quadratic coefficient (attention over the chunk).
    pub t2: f64,
    /// Linear coefficient (weights times tokens).
    pub t1: f64,
    /// Fixed cost of a step with prefill.
    pub t0: f64,
    /// Cost per (new prompt token, earlier context token) pair; 0 in the shipped profiles,
    /// whose engines' attention is a small share of a step (measured profiles fit it).
    #[serde(default)]
    pub tc: f64,
}

/// Decode step time in ms: `max(floor, a2 * a^2 + a1 * a + a0 + per_seq * batch)`, a = active
/// KV blocks / total blocks, batch = decoding sequences in the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeCost {
    /// Quadratic coefficient in occupancy.
    pub a2: f64,
    /// Linear coefficient in occupancy.
    pub a1: f64,
    /// Fixed cost of a step with decodes.
    pub a0: f64,
    /// Cost per decoding sequence.
    #[serde(default)]
    pub per_seq: f64,
    /// Lower bound of the decode time.
    pub floor: f64,
}

/// A simulated model-and-hardware combination.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimProfile {
    /// Profile name.
    pub name: String,
    /// Assumptions behind the numbers, one line each.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Prefill time model.
    pub prefill_ms: PrefillCost,
    /// Decode time model.
    pub decode_ms: DecodeCost,
    /// KV bytes per token of the simulated model (before the engine's byte scale).
    pub kv_bytes_per_token: u64,
    /// Link bandwidth between prefill and decode workers, Gb/s (for transfer-time models).
    pub link_gbps: f64,
    /// Chance that a generated token is end-of-sequence (0 for shipped profiles: outputs run to
    /// `max_tokens`; tests raise it).
    #[serde(default)]
    pub eos_probability: f64,
    /// How the modeled engine schedules (defaults of the engines and the simulator running
    /// this profile; a worker's flags override them): most prefill tokens of one sequence per
    /// step, 0 for no cap beyond the step budget.
    #[serde(default)]
    pub prefill_chunk_tokens: u32,
    /// Most prefill tokens in a step that also decodes, 0 for no cap beyond the step budget.
    #[serde(default)]
    pub mixed_prefill_tokens: u32,
}

/// Why a profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Not a shipped profile name and not a readable file.
    #[error("{name:?} is neither a shipped profile ({builtin}) nor a readable file")]
    NotFound {
        /// The name or path asked for.
        name: String,
        /// Shipped names.
        builtin: String,
        /// Why the file could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The JSON is malformed or has unknown fields.
    #[error("profile {path}: invalid JSON")]
    Parse {
        /// Where it came from.
        path: PathBuf,
        /// Parser error.
        #[source]
        source: serde_json::Error,
    },
    /// A value is out of range.
    #[error("profile {name}: {reason}")]
    Invalid {
        /// Profile name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

impl SimProfile {
    /// Names of the shipped profiles.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(n, _)| *n)
    }

    /// A shipped profile by name.
    pub fn builtin(name: &str) -> Option<SimProfile> {
        let (_, json) = BUILTIN.iter().find(|(n, _)| *n == name)?;
        // Shipped profiles are checked by a unit test, so this parse cannot fail.
        Self::from_json(json, Path::new(name)).ok()
    }

    /// A shipped profile's name, or else a path to a JSON file.
    pub fn load(name_or_path: &str) -> Result<SimProfile, ProfileError> {
        if let Some(p) = Self::builtin(name_or_path) {
            return Ok(p);
        }
        let path = Path::new(name_or_path);
        let json = std::fs::read_to_string(path).map_err(|source| ProfileError::NotFound {
            name: name_or_path.to_string(),
            builtin: Self::builtin_names().collect::<Vec<_>>().join(", "),
            source,
        })?;
        Self::from_json(&json, path)
    }

    /// Parses and validates a profile; `origin` names it in errors.
    pub fn from_json(json: &str, origin: &Path) -> Result<SimProfile, ProfileError> {
        let p: SimProfile = serde_json::from_str(json).map_err(|source| ProfileError::Parse {
            path: origin.to_path_buf(),
            source,
        })?;
        p.validate()?;
        Ok(p)
    }

    fn validate(&self) -> Result<(), ProfileError> {
        let invalid = |reason: &str| {
            Err(ProfileError::Invalid {
                name: self.name.clone(),
                reason: reason.into(),
            })
        };
        let p = &self.prefill_ms;
        let d = &self.decode_ms;
        if ![p.t2, p.t1, p.t0, p.tc, d.a2, d.a1, d.a0, d.per_seq, d.floor]
            .iter()
            .all(|c| c.is_finite())
        {
            return invalid("coefficients must be finite");
        }
        if d.floor < 0.0 {
            return invalid("decode floor must not be negative");
        }
        if self.kv_bytes_per_token == 0 {
            return invalid("kv_bytes_per_token must be at least 1");
        }
        if !(self.link_gbps.is_finite() && self.link_gbps > 0.0) {
            return invalid("link_gbps must be positive");
        }
        if !(0.0..=1.0).contains(&self.eos_probability) {
            return invalid("eos_probability must be within [0, 1]");
        }
        Ok(())
    }

    /// Prefill time of `t` new prompt tokens, ms (0 for none).
    pub fn prefill_ms(&self, t: u32) -> f64 {
        if t == 0 {
            return 0.0;
        }
        let t = f64::from(t);
        let c = &self.prefill_ms;
        (c.t2 * t * t + c.t1 * t + c.t0).max(0.0)
    }

    /// Extra prefill time of chunks that start after `pairs` (new token, earlier token) pairs of
    /// context ([`PrefillCost::tc`]), ms.
    pub fn prefill_context_ms(&self, pairs: u64) -> f64 {
        (self.prefill_ms.tc * pairs as f64).max(0.0)
    }

    /// Decode time of `batch` sequences at KV occupancy `occupancy` (0..=1), ms (0 for none).
    pub fn decode_ms(&self, batch: u32, occupancy: f64) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        let a = occupancy.clamp(0.0, 1.0);
        let c = &self.decode_ms;
        (c.a2 * a * a + c.a1 * a + c.a0 + c.per_seq * f64::from(batch)).max(c.floor)
    }

    /// Time of a step: prefill and decode costs add up in a mixed step (which is how local
    /// prefill slows the decodes it runs beside).
    pub fn step_ms(&self, prefill_tokens: u32, decode_seqs: u32, occupancy: f64) -> f64 {
        self.prefill_ms(prefill_tokens) + self.decode_ms(decode_seqs, occupancy)
    }

    /// Time to move `bytes` at the profile's line rate.
    pub fn transfer_time(&self, bytes: u64) -> Duration {
        line_time(bytes, self.link_gbps)
    }
}

/// Time to move `bytes` at `gbps` gigabits per second.
pub fn line_time(bytes: u64, gbps: f64) -> Duration {
    Duration::from_secs_f64(bytes as f64 * 8.0 / (gbps * 1e9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_profiles_parse_and_validate() {
        for name in SimProfile::builtin_names() {
            let p = SimProfile::builtin(name).unwrap_or_else(|| panic!("{name} does not parse"));
            assert_eq!(p.name, name);
            assert!(!p.notes.is_empty(), "{name} explains its numbers");
            assert_eq!(p.eos_probability, 0.0);
        }
    }

    #[test]
    fn dynamo_mocker_matches_the_published_formulas() {
        let p = SimProfile::builtin("dynamo-mocker").expect("shipped");
        let t = 1000.0f64;
        let expect = 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142;
        assert!((p.prefill_ms(1000) - expect).abs() < 1e-9);
        let a = 0.5f64;
        let expect = -25.74 * a * a + 54.01 * a + 5.74;
        assert!((p.decode_ms(8, 0.5) - expect).abs() < 1e-9);
        assert_eq!(p.prefill_ms(0), 0.0);
        assert_eq!(p.decode_ms(0, 0.5), 0.0);
        assert!((p.step_ms(1000, 8, 0.5) - p.prefill_ms(1000) - p.decode_ms(8, 0.5)).abs() < 1e-9);
    }

    #[test]
    fn qwen72b_profile_is_in_the_intended_ranges() {
        let p = SimProfile::builtin("qwen72b-h20").expect("shipped");
        let prefill_8k = p.prefill_ms(8192);
        assert!(
            (2000.0..=3000.0).contains(&prefill_8k),
            "8k prefill {prefill_8k} ms"
        );
        let small = p.decode_ms(1, 0.05);
        assert!((30.0..=60.0).contains(&small), "batch-1 decode {small} ms");
        assert!(
            p.decode_ms(64, 0.8) > p.decode_ms(8, 0.2),
            "grows with batch and occupancy"
        );
        assert_eq!(p.kv_bytes_per_token, 320 * 1024);
        let t = p.transfer_time(8192 * 320 * 1024);
        assert!(
            (0.10..0.11).contains(&t.as_secs_f64()),
            "8k KV over 200 Gb/s: {t:?}"
        );
    }

    #[test]
    fn load_takes_a_path_and_rejects_bad_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.json");
        let mut p = SimProfile::builtin("dynamo-mocker").expect("shipped");
        p.name = "custom".into();
        p.eos_probability = 0.25;
        std::fs::write(&path, serde_json::to_string(&p).expect("json")).expect("write");
        let loaded = SimProfile::load(path.to_str().expect("utf-8 path")).expect("loads");
        assert_eq!(loaded, p);

        std::fs::write(&path, r#"{"name": "x", "bogus": 1}"#).expect("write");
        assert!(matches!(
            SimProfile::load(path.to_str().expect("utf-8")),
            Err(ProfileError::Parse { .. })
        ));
        p.link_gbps = 0.0;
        std::fs::write(&path, serde_json::to_string(&p).expect("json")).expect("write");
        assert!(matches!(
            SimProfile::load(path.to_str().expect("utf-8")),
            Err(ProfileError::Invalid { .. })
        ));
        assert!(matches!(
            SimProfile::load("no-such-profile"),
            Err(ProfileError::NotFound { .. })
        ));
    }
}

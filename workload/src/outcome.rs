//! What one replayed request measured, on the live cluster or in the simulator.

use serde::{Deserialize, Serialize};

use crate::request::RequestKind;

/// Per-request latency targets (DESIGN.md section 1).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Time to first token, ms.
    pub ttft_ms: f64,
    /// Time per output token, ms.
    pub tpot_ms: f64,
}

impl Slo {
    /// An SLO of `ttft_ms` / `tpot_ms`.
    pub const fn new(ttft_ms: f64, tpot_ms: f64) -> Self {
        Slo { ttft_ms, tpot_ms }
    }

    /// End-to-end budget of a request with `output_tokens` tokens:
    /// `TTFT_slo + (output_tokens - 1) * TPOT_slo`.
    pub fn e2e_budget_ms(&self, output_tokens: u32) -> f64 {
        self.ttft_ms + f64::from(output_tokens.saturating_sub(1)) * self.tpot_ms
    }

    /// DolphinRouting's criterion: `e2e <= TTFT_slo + (output_tokens - 1) * TPOT_slo`.
    pub fn met_e2e(&self, e2e_ms: f64, output_tokens: u32) -> bool {
        e2e_ms <= self.e2e_budget_ms(output_tokens)
    }

    /// TaiChi's criterion: TTFT and TPOT each within their own target.
    pub fn met_each(&self, ttft_ms: f64, tpot_ms: f64) -> bool {
        ttft_ms <= self.ttft_ms && tpot_ms <= self.tpot_ms
    }
}

/// One replayed request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestOutcome {
    /// Index of the request in its workload.
    pub index: u32,
    /// What kind of request it was.
    pub kind: RequestKind,
    /// When it was sent, ms from the start of the replay.
    pub sent_ms: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Time to first token, ms.
    pub ttft_ms: f64,
    /// Mean time per output token after the first, ms (0 for one-token outputs).
    pub tpot_ms: f64,
    /// Sent to last token, ms.
    pub e2e_ms: f64,
    /// The router's four features for it: prompt length, uncached length on the chosen
    /// prefill worker, uncached length on the chosen decode worker, expected output length
    /// (all zero where the target did not report them).
    pub features: [u32; 4],
    /// Routing-table cluster (`None` when the policy used no table; -1 in JSON).
    #[serde(with = "cluster_json")]
    pub cluster: Option<u32>,
    /// Whether the router sent it to a prefill worker (its decision; see
    /// [`prefilled_remotely`](Self::prefilled_remotely) for the path really taken).
    pub remote: bool,
    /// Whether a remote prefill failed and the decode worker prefilled instead.
    pub fell_back: bool,
    /// Whether the router sent it remote but the decode worker already held the prompt up to
    /// its last block and prefilled it itself (false in results written before this existed).
    #[serde(default)]
    pub held: bool,
    /// Whether the request completed (an error or refusal counts as not meeting the SLO).
    pub ok: bool,
    /// `ok` and the end-to-end SLO met ([`Slo::met_e2e`]).
    pub met: bool,
    /// `ok` and TTFT and TPOT each met ([`Slo::met_each`]).
    pub met_each: bool,
}

impl RequestOutcome {
    /// Whether a prefill worker really computed its prompt: sent remote, not held by the decode
    /// worker, and no fallback.
    pub fn prefilled_remotely(&self) -> bool {
        self.remote && !self.fell_back && !self.held
    }

    /// Sets `met` and `met_each` from the latencies against `slo` (both false unless `ok`).
    pub fn judge(mut self, slo: &Slo) -> Self {
        self.met = self.ok && slo.met_e2e(self.e2e_ms, self.output_tokens);
        self.met_each = self.ok && slo.met_each(self.ttft_ms, self.tpot_ms);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_follows_the_e2e_formula() {
        let slo = Slo::new(5000.0, 250.0);
        assert_eq!(slo.e2e_budget_ms(1), 5000.0);
        assert_eq!(slo.e2e_budget_ms(5), 6000.0);
        assert_eq!(slo.e2e_budget_ms(0), 5000.0);
        assert!(slo.met_e2e(6000.0, 5));
        assert!(!slo.met_e2e(6000.1, 5));
        // A slow first token can be made up by fast decoding under the e2e criterion only.
        assert!(slo.met_e2e(5500.0, 5));
        assert!(!slo.met_each(5500.0, 100.0));
    }
}

/// A routing-table cluster in JSON as the request log and `RoutingInfo` write it: its number,
/// or -1 when no table decided (any negative number reads as none).
pub mod cluster_json {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `None` as -1.
    pub fn serialize<S: Serializer>(c: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(c.map_or(-1, i64::from))
    }

    /// Reads -1 (any negative number) as `None`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        Ok(u32::try_from(i64::deserialize(d)?).ok())
    }

    #[cfg(test)]
    mod tests {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Row {
            #[serde(with = "super")]
            cluster: Option<u32>,
        }

        #[test]
        fn none_is_minus_one_in_json_both_ways() {
            for (row, json) in [
                (Row { cluster: None }, r#"{"cluster":-1}"#),
                (Row { cluster: Some(3) }, r#"{"cluster":3}"#),
            ] {
                assert_eq!(serde_json::to_string(&row).unwrap(), json);
                assert_eq!(serde_json::from_str::<Row>(json).unwrap(), row);
            }
        }
    }
}

//! When the router takes a table's bit for a request, and when it routes the request by the
//! `dolphin` policy's fallback instead: a table learned on one kind of traffic says nothing
//! reliable about requests unlike any it was trained on, nor through bits that little or no
//! measurement backs.
//!
//! Each cluster of a learned table carries its evidence ([`ClusterEvidence`]): how many
//! training requests it held, the reward margin of its bit over the other path, and its
//! training range (how far from the cluster's centre its farthest training request lay). The
//! router distrusts the bit of a cluster whose evidence is thin, and any request that lies
//! beyond its cluster's range (scaled by a slack), and routes those by the fallback
//! ([`Distrust`], counted in `dolphin_router_dolphin_distrusted_total`). Tables without
//! evidence (learned before it was recorded, or written by hand) are trusted as before.

use serde::{Deserialize, Serialize};

/// The evidence behind one cluster's bit, recorded when the table is learned.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterEvidence {
    /// Training requests in the cluster: the distinct requests its bit was measured on.
    pub requests: u64,
    /// The bit's reward minus the other path's, each pooled over the learning rounds that
    /// measured it (`None`: the other path was never measured for this cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<f64>,
    /// How far the cluster's farthest training request lay from its centre, in standardized
    /// units: the Euclidean distance to the centroid (k-means) or the Mahalanobis distance to
    /// the component's mean (mixture).
    pub range: f64,
}

/// The smallest range a check uses (standardized units): a cluster of identical training
/// requests has range 0, and should still accept requests a hair away.
pub const MIN_RANGE: f64 = 0.25;

/// When a table's bit is trusted (the `dolphin` policy's `--table-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustConfig {
    /// Check evidence and ranges at all (off: every bit is taken, as before evidence existed).
    pub enabled: bool,
    /// Fewest training requests behind a bit.
    pub min_requests: u64,
    /// Smallest reward margin of a bit over the other path (a bit with no measured margin
    /// is distrusted).
    pub min_margin: f64,
    /// A request is out of range when its distance to its cluster's centre exceeds the
    /// cluster's training range (at least [`MIN_RANGE`]) times this.
    pub range_slack: f64,
}

impl Default for TrustConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_requests: 20,
            min_margin: 0.0,
            range_slack: 1.5,
        }
    }
}

impl TrustConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), String> {
        if !self.min_margin.is_finite() || !(-1.0..=1.0).contains(&self.min_margin) {
            return Err(format!(
                "min_margin must be within [-1, 1], got {}",
                self.min_margin
            ));
        }
        if !(self.range_slack.is_finite() && self.range_slack >= 1.0) {
            return Err(format!(
                "range_slack must be at least 1, got {}",
                self.range_slack
            ));
        }
        Ok(())
    }

    /// Whether `evidence` backs its bit.
    pub fn enough(&self, evidence: &ClusterEvidence) -> bool {
        evidence.requests >= self.min_requests
            && evidence.margin.is_some_and(|m| m >= self.min_margin)
    }

    /// Whether a request at `distance` from its cluster's centre lies within `evidence`'s
    /// range.
    pub fn in_range(&self, evidence: &ClusterEvidence, distance: f64) -> bool {
        distance <= evidence.range.max(MIN_RANGE) * self.range_slack
    }

    /// Why a request at `distance` from the centre of a cluster with `evidence` is not routed
    /// by the cluster's bit (`None`: it is).
    pub fn check(&self, evidence: &ClusterEvidence, distance: f64) -> Option<Distrust> {
        if !self.enabled {
            None
        } else if !self.in_range(evidence, distance) {
            Some(Distrust::OutOfRange)
        } else if !self.enough(evidence) {
            Some(Distrust::ThinEvidence)
        } else {
            None
        }
    }
}

/// Why a table's bit was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distrust {
    /// The request lies beyond its cluster's training range.
    OutOfRange,
    /// Too few training requests, or too small a margin, behind the cluster's bit.
    ThinEvidence,
}

impl Distrust {
    /// "out_of_range" / "thin_evidence", for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Distrust::OutOfRange => "out_of_range",
            Distrust::ThinEvidence => "thin_evidence",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(requests: u64, margin: Option<f64>, range: f64) -> ClusterEvidence {
        ClusterEvidence {
            requests,
            margin,
            range,
        }
    }

    #[test]
    fn thin_evidence_and_far_requests_are_distrusted() {
        let t = TrustConfig::default();
        let good = evidence(100, Some(0.1), 2.0);
        assert_eq!(t.check(&good, 2.9), None);
        assert_eq!(t.check(&good, 3.1), Some(Distrust::OutOfRange));
        assert_eq!(
            t.check(&evidence(5, Some(0.1), 2.0), 1.0),
            Some(Distrust::ThinEvidence)
        );
        assert_eq!(
            t.check(&evidence(100, None, 2.0), 1.0),
            Some(Distrust::ThinEvidence),
            "the other path never measured"
        );
        assert_eq!(
            t.check(&evidence(100, Some(-0.01), 2.0), 1.0),
            Some(Distrust::ThinEvidence)
        );
        // A cluster of identical requests still takes requests a hair away.
        assert_eq!(t.check(&evidence(100, Some(0.0), 0.0), 0.3), None);
        let off = TrustConfig {
            enabled: false,
            ..t
        };
        assert_eq!(off.check(&evidence(0, None, 0.0), 99.0), None);
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = |f: fn(&mut TrustConfig)| {
            let mut t = TrustConfig::default();
            f(&mut t);
            t.validate().is_err()
        };
        assert!(bad(|t| t.range_slack = 0.5));
        assert!(bad(|t| t.range_slack = f64::NAN));
        assert!(bad(|t| t.min_margin = 2.0));
        assert!(TrustConfig::default().validate().is_ok());
    }
}

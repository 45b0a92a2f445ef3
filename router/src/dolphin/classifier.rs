//! The output-length classifier: short / medium / long from the admission sketch, by
//! multinomial logistic regression, and each class's representative length (the fourth routing
//! feature).
//!
//! Classes are cut at two output-length boundaries learned from the request log (terciles), and
//! each class's representative length is the median output of its training requests. Inference
//! is three dot products over a sparse input (two dense values, one family bucket, at most
//! [`HEAD_TOKENS`](super::admission::HEAD_TOKENS) hashed tokens): well under a microsecond.
//!
//! Before any training the router uses [`OutputClassifier::prior`]: it predicts the class that
//! `max_tokens` itself falls in, since the output can never be longer than that.

use serde::{Deserialize, Serialize};

use super::admission::{Admission, InputShape, N_DENSE, visit_features};

/// The classifier schema this router reads.
pub const CLASSIFIER_SCHEMA_VERSION: u32 = 1;
/// Number of output classes.
pub const N_CLASSES: usize = 3;
/// Class names, by index.
pub const CLASS_NAMES: [&str; N_CLASSES] = ["short", "medium", "long"];
/// Most buckets of either hashed input (16-bit token hashes).
pub const MAX_BUCKETS: usize = 1 << 16;

/// A trained (or prior) classifier, as stored in etcd.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputClassifier {
    /// Must be [`CLASSIFIER_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Output-token boundaries: short `< b0 <=` medium `< b1 <=` long.
    pub boundaries: [u32; 2],
    /// Representative output length of each class (the median of its training requests).
    pub representative: [u32; N_CLASSES],
    /// Means of the dense inputs, for standardization.
    pub dense_mean: [f64; N_DENSE],
    /// Standard deviations of the dense inputs (> 0).
    pub dense_std: [f64; N_DENSE],
    /// Prefix-family buckets (a power of two).
    pub n_family: usize,
    /// Hashed-token buckets (a power of two).
    pub n_hash: usize,
    /// Per-class bias.
    pub bias: [f64; N_CLASSES],
    /// Per-class weights over the input vector (see [`InputShape`]).
    pub weights: Vec<Vec<f64>>,
    /// Where it came from.
    pub provenance: ClassifierProvenance,
}

/// Where a classifier came from and how well it did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifierProvenance {
    /// The request log it was trained on ("prior" for the built-in default).
    pub source: String,
    /// When (RFC 3339).
    pub date: String,
    /// Training plus held-out requests.
    pub samples: u64,
    /// Accuracy on held-out requests.
    pub heldout_accuracy: f64,
    /// Accuracy of always predicting the most common class, on the same held-out requests.
    pub majority_baseline: f64,
}

/// One prediction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputPrediction {
    /// Class index (see [`CLASS_NAMES`]).
    pub class: usize,
    /// Expected output length: the class's representative length, at most `max_tokens`.
    pub length: u32,
}

/// Why a classifier was refused.
#[derive(Debug, thiserror::Error)]
pub enum ClassifierError {
    /// Not JSON, or the wrong shape.
    #[error("the classifier is not a valid classifier document: {0}")]
    Json(#[source] serde_json::Error),
    /// A schema this router does not know.
    #[error(
        "unknown classifier schema_version {} (this router reads version {supported})",
        super::table::version_text(*.found)
    )]
    UnknownVersion {
        /// What the document says.
        found: Option<u64>,
        /// [`CLASSIFIER_SCHEMA_VERSION`].
        supported: u32,
    },
    /// Any other broken invariant.
    #[error("invalid classifier: {0}")]
    Invalid(String),
}

impl OutputClassifier {
    /// The default before any training: the class `max_tokens` falls in, with boundaries 128
    /// and 1024 and representative lengths 64, 512 and 2048 (capped by `max_tokens`).
    ///
    /// With `x = ln(1 + max_tokens)`, logits `c * x - sum_{j < c} ln(b_j)` make class `c` win
    /// exactly when `b_{c-1} <= max_tokens < b_c`.
    pub fn prior() -> OutputClassifier {
        let boundaries = [128u32, 1024];
        let lb = boundaries.map(|b| f64::from(b).ln());
        let shape = InputShape {
            n_family: 1,
            n_hash: 1,
        };
        let weights = (0..N_CLASSES)
            .map(|c| {
                let mut w = vec![0.0; shape.dim()];
                w[1] = c as f64;
                w
            })
            .collect();
        OutputClassifier {
            schema_version: CLASSIFIER_SCHEMA_VERSION,
            boundaries,
            representative: [64, 512, 2048],
            dense_mean: [0.0; N_DENSE],
            dense_std: [1.0; N_DENSE],
            n_family: 1,
            n_hash: 1,
            bias: [0.0, -lb[0], -lb[0] - lb[1]],
            weights,
            provenance: ClassifierProvenance {
                source: "prior".into(),
                ..Default::default()
            },
        }
    }

    /// Whether this is the built-in prior.
    pub fn is_prior(&self) -> bool {
        self.provenance.source == "prior"
    }

    /// The input shape.
    pub fn shape(&self) -> InputShape {
        InputShape {
            n_family: self.n_family,
            n_hash: self.n_hash,
        }
    }

    /// Parses and validates a classifier document.
    pub fn from_json(text: &str) -> Result<OutputClassifier, ClassifierError> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(ClassifierError::Json)?;
        let found = value
            .get("schema_version")
            .and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(CLASSIFIER_SCHEMA_VERSION)) {
            return Err(ClassifierError::UnknownVersion {
                found,
                supported: CLASSIFIER_SCHEMA_VERSION,
            });
        }
        let c: OutputClassifier = serde_json::from_value(value).map_err(ClassifierError::Json)?;
        c.validate()?;
        Ok(c)
    }

    /// Checks every invariant inference relies on.
    pub fn validate(&self) -> Result<(), ClassifierError> {
        let bad = |m: String| Err(ClassifierError::Invalid(m));
        if self.schema_version != CLASSIFIER_SCHEMA_VERSION {
            return Err(ClassifierError::UnknownVersion {
                found: Some(u64::from(self.schema_version)),
                supported: CLASSIFIER_SCHEMA_VERSION,
            });
        }
        let [b0, b1] = self.boundaries;
        if !(0 < b0 && b0 < b1) {
            return bad(format!(
                "boundaries must satisfy 0 < b0 < b1, got {:?}",
                self.boundaries
            ));
        }
        if self.representative.contains(&0) {
            return bad("representative lengths must be at least 1".into());
        }
        for (name, n) in [("n_family", self.n_family), ("n_hash", self.n_hash)] {
            if !n.is_power_of_two() || n > MAX_BUCKETS {
                return bad(format!(
                    "{name} must be a power of two up to {MAX_BUCKETS}, got {n}"
                ));
            }
        }
        if self.dense_std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return bad(format!(
                "dense_std must be finite and positive, got {:?}",
                self.dense_std
            ));
        }
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        if !finite(&self.dense_mean) || !finite(&self.bias) {
            return bad("dense_mean and bias must be finite".into());
        }
        if self.weights.len() != N_CLASSES {
            return bad(format!(
                "weights has {} rows, expected {N_CLASSES}",
                self.weights.len()
            ));
        }
        let dim = self.shape().dim();
        for (c, row) in self.weights.iter().enumerate() {
            if row.len() != dim {
                return bad(format!(
                    "weights[{c}] has {} entries, expected {dim}",
                    row.len()
                ));
            }
            if !finite(row) {
                return bad(format!("weights[{c}] has a non-finite value"));
            }
        }
        Ok(())
    }

    /// Class scores (unnormalized log-probabilities).
    pub fn logits(&self, a: &Admission) -> [f64; N_CLASSES] {
        let mut out = self.bias;
        let [w0, w1, w2] = [&self.weights[0], &self.weights[1], &self.weights[2]];
        visit_features(
            a,
            self.shape(),
            &self.dense_mean,
            &self.dense_std,
            |i, v| {
                out[0] += w0[i] * v;
                out[1] += w1[i] * v;
                out[2] += w2[i] * v;
            },
        );
        out
    }

    /// The predicted class and its representative length (capped by `max_tokens`).
    pub fn predict(&self, a: &Admission) -> OutputPrediction {
        let l = self.logits(a);
        let mut class = 0;
        for c in 1..N_CLASSES {
            if l[c] > l[class] {
                class = c;
            }
        }
        OutputPrediction {
            class,
            length: self.representative[class].min(a.max_tokens).max(1),
        }
    }

    /// The class of an observed output length.
    pub fn class_of(&self, output_tokens: u32) -> usize {
        let [b0, b1] = self.boundaries;
        if output_tokens < b0 {
            0
        } else if output_tokens < b1 {
            1
        } else {
            2
        }
    }

    /// Pretty JSON.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adm(max_tokens: u32) -> Admission {
        Admission::new(&[1, 2, 3, 4, 5], max_tokens)
    }

    #[test]
    fn prior_predicts_the_class_of_max_tokens() {
        let c = OutputClassifier::prior();
        c.validate().expect("valid prior");
        for m in [1, 16, 127, 128, 500, 1023, 1024, 4096, 100_000] {
            let p = c.predict(&adm(m));
            assert_eq!(p.class, c.class_of(m), "max_tokens {m}");
            assert!(p.length <= m);
        }
        assert_eq!(c.predict(&adm(16)).length, 16);
        assert_eq!(c.predict(&adm(4096)).length, 2048);
        assert!(c.is_prior());
    }

    #[test]
    fn roundtrips_and_refuses_bad_documents() {
        let c = OutputClassifier::prior();
        let back = OutputClassifier::from_json(&c.to_json_pretty()).expect("valid");
        assert_eq!(back, c);
        let edit = |f: &dyn Fn(&mut OutputClassifier)| {
            let mut x = c.clone();
            f(&mut x);
            OutputClassifier::from_json(&serde_json::to_string(&x).expect("json"))
        };
        assert!(matches!(
            edit(&|x| x.schema_version = 9),
            Err(ClassifierError::UnknownVersion { found: Some(9), .. })
        ));
        assert!(edit(&|x| x.boundaries = [10, 10]).is_err());
        assert!(edit(&|x| x.n_hash = 3).is_err());
        assert!(edit(&|x| x.weights[1].push(0.0)).is_err());
        assert!(edit(&|x| x.weights.pop().map_or((), |_| ())).is_err());
        assert!(edit(&|x| x.dense_std[0] = 0.0).is_err());
        assert!(edit(&|x| x.representative[2] = 0).is_err());
        let mut nan = c.clone();
        nan.weights[0][0] = f64::NAN;
        assert!(nan.validate().is_err());
        assert!(matches!(
            OutputClassifier::from_json("[]"),
            Err(ClassifierError::UnknownVersion { found: None, .. })
        ));
    }
}

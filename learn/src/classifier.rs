//! Training the output-length classifier from the request log.
//!
//! Class boundaries are the terciles of the logged output lengths; each class's representative
//! length is the median output of its training requests. The model is a multinomial logistic
//! regression over the router's own input vector ([`visit_features`]), trained with mini-batch
//! Adam and L2 regularization on a shuffled 80% of the requests; the other 20% measure its
//! accuracy against always predicting the most common class.

use dolphin_router::dolphin::Admission;
use dolphin_router::dolphin::admission::{InputShape, N_DENSE, visit_features};
use dolphin_router::dolphin::classifier::{
    CLASSIFIER_SCHEMA_VERSION, ClassifierProvenance, N_CLASSES, OutputClassifier,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::error::LearnError;
use crate::log::LogRecord;
use crate::stats;

/// Fewest usable requests to train on.
pub const MIN_SAMPLES: usize = 30;

/// Training settings.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Prefix-family buckets (a power of two).
    pub n_family: usize,
    /// Hashed-token buckets (a power of two).
    pub n_hash: usize,
    /// Passes over the training set.
    pub epochs: usize,
    /// Adam step size.
    pub learning_rate: f64,
    /// L2 penalty on the weights.
    pub l2: f64,
    /// Share of requests held out for evaluation.
    pub heldout: f64,
    /// Random seed (shuffle, batches).
    pub seed: u64,
    /// Name of the log, for the provenance.
    pub source: String,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            n_family: 256,
            n_hash: 256,
            epochs: 40,
            learning_rate: 0.05,
            l2: 1e-4,
            heldout: 0.2,
            seed: 0,
            source: String::new(),
        }
    }
}

/// The trained classifier and how well it does.
#[derive(Clone, Debug, Serialize)]
pub struct TrainReport {
    /// The classifier (validated).
    #[serde(skip)]
    pub classifier: OutputClassifier,
    /// Usable requests (finished, with an admission sketch).
    pub samples: usize,
    /// Requests skipped (not finished, or logged without a sketch).
    pub skipped: usize,
    /// Training requests.
    pub train: usize,
    /// Held-out requests.
    pub heldout: usize,
    /// Output-token boundaries between the classes.
    pub boundaries: [u32; 2],
    /// Representative length per class.
    pub representative: [u32; N_CLASSES],
    /// Training requests per class.
    pub class_counts: [usize; N_CLASSES],
    /// Accuracy on the training requests.
    pub train_accuracy: f64,
    /// Accuracy on the held-out requests.
    pub heldout_accuracy: f64,
    /// Held-out accuracy of always predicting the most common training class.
    pub majority_baseline: f64,
    /// That class.
    pub majority_class: usize,
}

struct Sample {
    admission: Admission,
    label: usize,
    x: Vec<(usize, f64)>,
}

/// Trains a classifier on the finished requests of `records`.
pub fn train(records: &[LogRecord], cfg: &TrainConfig) -> Result<TrainReport, LearnError> {
    for (name, n) in [("n_family", cfg.n_family), ("n_hash", cfg.n_hash)] {
        if !n.is_power_of_two() {
            return Err(LearnError::Invalid(format!(
                "{name} must be a power of two, got {n}"
            )));
        }
    }
    if !(0.0..1.0).contains(&cfg.heldout) {
        return Err(LearnError::Invalid("heldout must be in [0, 1)".into()));
    }
    let mut usable: Vec<(Admission, u32)> = records
        .iter()
        .filter(|r| r.ok() && r.completion_tokens > 0)
        .filter_map(|r| {
            let a = r.admission.as_ref()?;
            Some((
                Admission::from_record(r.prompt_tokens, a),
                r.completion_tokens,
            ))
        })
        .collect();
    let skipped = records.len() - usable.len();
    if usable.len() < MIN_SAMPLES {
        return Err(LearnError::NotEnoughData(format!(
            "{} finished requests with an admission sketch; need at least {MIN_SAMPLES}",
            usable.len()
        )));
    }
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    usable.shuffle(&mut rng);
    let n_held = ((usable.len() as f64 * cfg.heldout).round() as usize).clamp(1, usable.len() - 1);
    let (held, trainset) = usable.split_at(n_held);

    let mut outs: Vec<u32> = trainset.iter().map(|(_, o)| *o).collect();
    outs.sort_unstable();
    let b0 = stats::nearest_rank(&outs, 1.0 / 3.0).max(1);
    let b1 = stats::nearest_rank(&outs, 2.0 / 3.0).max(b0 + 1);
    let mut c = OutputClassifier {
        schema_version: CLASSIFIER_SCHEMA_VERSION,
        boundaries: [b0, b1],
        representative: [1; N_CLASSES],
        dense_mean: [0.0; N_DENSE],
        dense_std: [1.0; N_DENSE],
        n_family: cfg.n_family,
        n_hash: cfg.n_hash,
        bias: [0.0; N_CLASSES],
        weights: vec![vec![0.0; 0]; N_CLASSES],
        provenance: ClassifierProvenance::default(),
    };
    let mut per_class: [Vec<u32>; N_CLASSES] = Default::default();
    for (_, o) in trainset {
        per_class[c.class_of(*o)].push(*o);
    }
    let fallback = [(b0 / 2).max(1), (b0 + b1) / 2, b1.saturating_mul(2)];
    for k in 0..N_CLASSES {
        c.representative[k] = stats::median(&mut per_class[k])
            .unwrap_or(fallback[k])
            .max(1);
    }
    let class_counts = per_class.each_ref().map(Vec::len);
    for (d, f) in [|a: &Admission| a.isl, |a: &Admission| a.max_tokens]
        .iter()
        .enumerate()
    {
        let (m, s) = stats::mean_std(trainset.iter().map(|(a, _)| f64::from(f(a)).ln_1p()));
        c.dense_mean[d] = m;
        c.dense_std[d] = s;
    }
    let shape = InputShape {
        n_family: cfg.n_family,
        n_hash: cfg.n_hash,
    };
    let sample = |(a, o): &(Admission, u32)| {
        let mut x = Vec::with_capacity(40);
        visit_features(a, shape, &c.dense_mean, &c.dense_std, |i, v| x.push((i, v)));
        Sample {
            admission: *a,
            label: c.class_of(*o),
            x,
        }
    };
    let train_s: Vec<Sample> = trainset.iter().map(sample).collect();
    let held_s: Vec<Sample> = held.iter().map(sample).collect();
    let (weights, bias) = fit_softmax(&train_s, shape.dim(), cfg, &mut rng);
    c.weights = weights;
    c.bias = bias;

    let accuracy = |c: &OutputClassifier, set: &[Sample]| {
        let right = set
            .iter()
            .filter(|s| c.predict(&s.admission).class == s.label)
            .count();
        right as f64 / set.len().max(1) as f64
    };
    let majority_class = (0..N_CLASSES).max_by_key(|k| class_counts[*k]).unwrap_or(0);
    let majority_baseline = held_s.iter().filter(|s| s.label == majority_class).count() as f64
        / held_s.len().max(1) as f64;
    let heldout_accuracy = accuracy(&c, &held_s);
    let train_accuracy = accuracy(&c, &train_s);
    c.provenance = ClassifierProvenance {
        source: cfg.source.clone(),
        date: stats::now_rfc3339(),
        samples: usable.len() as u64,
        heldout_accuracy,
        majority_baseline,
    };
    c.validate()?;
    Ok(TrainReport {
        samples: usable.len(),
        skipped,
        train: train_s.len(),
        heldout: held_s.len(),
        boundaries: c.boundaries,
        representative: c.representative,
        class_counts,
        train_accuracy,
        heldout_accuracy,
        majority_baseline,
        majority_class,
        classifier: c,
    })
}

/// Multinomial logistic regression by mini-batch Adam; returns (weights per class, bias).
fn fit_softmax(
    samples: &[Sample],
    dim: usize,
    cfg: &TrainConfig,
    rng: &mut SmallRng,
) -> (Vec<Vec<f64>>, [f64; N_CLASSES]) {
    const BATCH: usize = 128;
    const B1: f64 = 0.9;
    const B2: f64 = 0.999;
    // Parameters flattened: class c's weights at [c * dim, (c + 1) * dim), biases at the end.
    let n_params = N_CLASSES * dim + N_CLASSES;
    let mut theta = vec![0.0; n_params];
    let (mut m, mut v, mut g) = (
        vec![0.0; n_params],
        vec![0.0; n_params],
        vec![0.0; n_params],
    );
    let mut order: Vec<usize> = (0..samples.len()).collect();
    let mut step = 0i32;
    for _ in 0..cfg.epochs {
        order.shuffle(rng);
        for batch in order.chunks(BATCH) {
            g.iter_mut().for_each(|x| *x = 0.0);
            for &i in batch {
                let s = &samples[i];
                let mut logits = [0.0; N_CLASSES];
                for (k, l) in logits.iter_mut().enumerate() {
                    *l = theta[N_CLASSES * dim + k]
                        + s.x.iter().map(|(j, x)| theta[k * dim + j] * x).sum::<f64>();
                }
                let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                for k in 0..N_CLASSES {
                    let p = (logits[k] - max).exp() / z;
                    let err = p - f64::from(u8::from(k == s.label));
                    g[N_CLASSES * dim + k] += err;
                    for (j, x) in &s.x {
                        g[k * dim + j] += err * x;
                    }
                }
            }
            step += 1;
            let scale = 1.0 / batch.len() as f64;
            let (c1, c2) = (1.0 - B1.powi(step), 1.0 - B2.powi(step));
            for p in 0..n_params {
                let l2 = if p < N_CLASSES * dim {
                    cfg.l2 * theta[p]
                } else {
                    0.0
                };
                let grad = g[p] * scale + l2;
                m[p] = B1 * m[p] + (1.0 - B1) * grad;
                v[p] = B2 * v[p] + (1.0 - B2) * grad * grad;
                theta[p] -= cfg.learning_rate * (m[p] / c1) / ((v[p] / c2).sqrt() + 1e-8);
            }
        }
    }
    let weights = (0..N_CLASSES)
        .map(|k| theta[k * dim..(k + 1) * dim].to_vec())
        .collect();
    let mut bias = [0.0; N_CLASSES];
    bias.copy_from_slice(&theta[N_CLASSES * dim..]);
    (weights, bias)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic;

    #[test]
    fn beats_the_majority_baseline_when_output_depends_on_the_features() {
        let log = synthetic::log(3000, 11);
        let cfg = TrainConfig {
            source: "synthetic".into(),
            epochs: 15,
            ..Default::default()
        };
        let r = train(&log, &cfg).expect("train");
        assert_eq!((r.samples, r.heldout), (3000, 600));
        assert!(r.boundaries[0] < r.boundaries[1]);
        assert!(r.representative[0] < r.boundaries[0]);
        assert!(r.representative[2] >= r.boundaries[1]);
        assert!(
            r.majority_baseline < 0.5,
            "three balanced classes: {}",
            r.majority_baseline
        );
        assert!(
            r.heldout_accuracy > r.majority_baseline + 0.3,
            "held-out {} vs baseline {}",
            r.heldout_accuracy,
            r.majority_baseline
        );
        // The router loads it and predicts with it.
        let json = r.classifier.to_json_pretty();
        let loaded = OutputClassifier::from_json(&json).expect("router accepts it");
        assert_eq!(loaded.provenance.samples, 3000);
    }

    #[test]
    fn cannot_learn_what_the_features_do_not_carry() {
        // Output lengths independent of everything known at admission: no better than chance.
        let mut log = synthetic::log(1500, 3);
        let mut x = 7u32;
        for r in &mut log {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            r.completion_tokens = 1 + (x >> 16) % 3000;
        }
        let r = train(
            &log,
            &TrainConfig {
                epochs: 10,
                ..Default::default()
            },
        )
        .expect("train");
        assert!(r.heldout_accuracy < r.majority_baseline + 0.1, "{r:?}");
    }

    #[test]
    fn refuses_too_little_data_and_bad_settings() {
        let log = synthetic::log(20, 1);
        assert!(matches!(
            train(&log, &TrainConfig::default()),
            Err(LearnError::NotEnoughData(_))
        ));
        let log = synthetic::log(100, 1);
        let bad = TrainConfig {
            n_hash: 100,
            ..Default::default()
        };
        assert!(matches!(train(&log, &bad), Err(LearnError::Invalid(_))));
        let mut unfinished = log.clone();
        unfinished
            .iter_mut()
            .for_each(|r| r.outcome = "cancelled".into());
        assert!(train(&unfinished, &TrainConfig::default()).is_err());
    }
}

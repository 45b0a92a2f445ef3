//! Output classes without an oracle (issue 14 item 4, the measured part): how well the output
//! classifier predicts a request's output class from what is known at admission (prompt
//! length, prefix family, hashed head tokens where text exists, and a `max_tokens` that is the
//! workload's fixed cap, never the answer's length), against always predicting the most common
//! class.

use std::fmt::Write as _;

use dolphin_learn::classifier::{TrainConfig, TrainReport, train};
use dolphin_learn::log::LogRecord;
use dolphin_router::policy::Features;
use dolphin_sim::SimRequest;
use dolphin_workload::{Slo, Workload};
use serde::Serialize;

use crate::BenchError;

/// The classifier trained on one workload.
#[derive(Debug, Serialize)]
pub struct ClassRow {
    /// Workload name.
    pub workload: String,
    /// How training went: classes, boundaries, held-out accuracy, majority baseline.
    pub report: TrainReport,
}

/// `w`'s requests as request-log records whose admission sketch carries the kind's
/// `max_tokens` cap (at least the output, so no request is cut short).
pub fn capped_records(w: &Workload) -> Vec<LogRecord> {
    let slo = Slo::new(1.0, 1.0);
    SimRequest::from_workload(w, slo, dolphin_cluster::DEFAULT_BLOCK_SIZE as u32)
        .into_iter()
        .zip(&w.requests)
        .map(|(s, r)| {
            let mut admission = s.admission;
            admission.max_tokens = r.kind.max_tokens_cap().max(r.output_len);
            LogRecord {
                features: Features::default(),
                admission: Some(admission.to_record()),
                prompt_tokens: r.prompt_len,
                completion_tokens: r.output_len,
                outcome: "ok".into(),
                decision: None,
                path: None,
                slo_met: None,
            }
        })
        .collect()
}

/// Trains the classifier on each workload's training and test samples together (a fifth held
/// out, seeded) and appends a table of its held-out accuracy against the majority class.
pub fn output_classes(
    workloads: &[(&str, (Workload, Workload))],
    md: &mut String,
) -> Result<Vec<ClassRow>, BenchError> {
    md.push_str("| workload | requests | class boundaries (output tokens) | held-out accuracy | majority class | its accuracy | gain |\n|---|---|---|---|---|---|---|\n");
    let mut rows = Vec::new();
    for (name, (train_sample, test_sample)) in workloads {
        let mut records = capped_records(train_sample);
        records.extend(capped_records(test_sample));
        let report = train(
            &records,
            &TrainConfig {
                source: (*name).to_owned(),
                ..TrainConfig::default()
            },
        )
        .map_err(|e| BenchError::Experiment(format!("{name}: {e}")))?;
        let _ = writeln!(
            md,
            "| {name} | {} | {} / {} | {:.3} | {} | {:.3} | {:+.1} pt |",
            report.samples,
            report.boundaries[0],
            report.boundaries[1],
            report.heldout_accuracy,
            dolphin_router::dolphin::classifier::CLASS_NAMES[report.majority_class],
            report.majority_baseline,
            (report.heldout_accuracy - report.majority_baseline) * 100.0
        );
        rows.push(ClassRow {
            workload: (*name).to_owned(),
            report,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use dolphin_workload::synthetic;

    use super::*;

    #[test]
    fn records_carry_the_kinds_cap_never_the_answer() {
        let w = synthetic::hybrid(60, 3);
        let records = capped_records(&w);
        assert_eq!(records.len(), 60);
        for (rec, r) in records.iter().zip(&w.requests) {
            let a = rec.admission.as_ref().expect("sketch");
            assert_eq!(a.max_tokens, r.kind.max_tokens_cap());
            assert!(a.max_tokens >= r.output_len);
            assert_eq!(rec.completion_tokens, r.output_len);
        }
        let mut md = String::new();
        let rows = output_classes(
            &[("hybrid", (w.clone(), synthetic::hybrid(60, 4)))],
            &mut md,
        )
        .expect("trains");
        let r = &rows[0].report;
        assert_eq!(r.samples, 120);
        assert!((0.0..=1.0).contains(&r.heldout_accuracy));
        assert!(md.contains("| hybrid | 120 |"), "{md}");
    }
}

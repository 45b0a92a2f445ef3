//! Learned tables under a load rule (issue 14): the bits cannot see the prefill pool's queue,
//! which Dynamo's `prefill_load` rule follows. Here the learner also chooses a load rule (none,
//! or local while the chosen prefill worker has more than 0.5, 1 or 2 steps of prefill work
//! pending), learning the bits under each on the training sample and keeping the table that
//! attains the most on a validation sample; the result is measured on the test sample against
//! the plain learned table and the baselines.

use std::fmt::Write as _;

use dolphin_learn::load_rule::{CANDIDATES, learn_rule_on_sim};
use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_workload::{Summary, Workload};
use serde::Serialize;

use super::{Baseline, Setup, best_baseline, change_pct, learn_err, run_baseline, run_table};
use crate::BenchError;

/// A workload's training, validation and test samples.
pub type Samples3 = (Workload, Workload, Workload);

/// One setting.
#[derive(Debug, Serialize)]
pub struct LoadRuleRow {
    /// Workload name.
    pub workload: String,
    /// The split.
    pub split: String,
    /// Closed-loop concurrency.
    pub concurrency: u32,
    /// Each candidate's busy threshold (`None`: no rule), its training and its validation
    /// attainment.
    pub candidates: Vec<(Option<f64>, f64, Option<f64>)>,
    /// The threshold chosen.
    pub chosen: Option<f64>,
    /// The plain learned table (no rule) on the test sample.
    pub plain: Summary,
    /// The table learned with the chosen rule, on the test sample.
    pub with_rule: Summary,
    /// Dynamo 1.6 on the test sample.
    pub dynamo: Summary,
    /// The best baseline's name and result on the test sample.
    pub best_baseline: (String, Summary),
}

/// For each setting (workload, split, concurrency): learn the plain table and the table with
/// a chosen load rule on the training sample, and measure both and every baseline on the test
/// sample. Appends a markdown table to `md`.
pub fn load_rule_comparison(
    settings: &[(String, Setup, Samples3)],
    md: &mut String,
) -> Result<Vec<LoadRuleRow>, BenchError> {
    let rules = &CANDIDATES;
    md.push_str("| workload | split | in flight | rule chosen (attainment in training / validation: none, 0.5, 1, 2) | best baseline | plain table | table with rule | with rule vs best: P90 TTFT, P90 TPOT | with rule vs Dynamo 1.6: P90 TTFT, P90 TPOT |\n|---|---|---|---|---|---|---|---|---|\n");
    let mut rows = Vec::new();
    for (name, setup, (train, validate, test)) in settings {
        let s = setup.with_classifier_for(name, train)?;
        let fit = s.fit(name, 8, ClusterMethod::Kmeans, 1);
        let search = SearchConfig::new(8);
        let mut train_target = s.target(train)?;
        let mut validate_target = s.target(validate)?;
        let (with_rule, candidates) = learn_rule_on_sim(
            &mut train_target,
            Some(&mut validate_target),
            &fit,
            &search,
            rules,
        )
        .map_err(learn_err)?;
        // The plain table is the candidate without a rule, learned on the same sample.
        let plain = candidates
            .iter()
            .find(|c| c.rule.is_none())
            .map(|c| c.table.clone())
            .ok_or_else(|| BenchError::Experiment("no candidate without a rule".into()))?;
        let mut target = s.target(test)?;
        let baselines = Baseline::ALL
            .iter()
            .map(|&b| run_baseline(&mut target, b))
            .collect::<Result<Vec<_>, _>>()?;
        let best = best_baseline(&baselines, |s| s.attainment)
            .cloned()
            .ok_or_else(|| BenchError::Experiment("no baseline".into()))?;
        let dynamo = baselines[2].summary.clone();
        let plain = run_table(&mut target, "learned", &plain)?.summary;
        let ruled = run_table(&mut target, "learned with rule", &with_rule.table)?.summary;
        let chosen = with_rule.table.load_rule.map(|r| r.prefill_busy_threshold);
        let split = s.split.to_string();
        let concurrency = s.arrivals.concurrency().unwrap_or(0);
        let _ = writeln!(
            md,
            "| {name} | {split} | {concurrency} | {} ({}) | {} {:.3} | {:.3} | {:.3} | {:+.1}%, {:+.1}% | {:+.1}%, {:+.1}% |",
            chosen.map_or("none".to_owned(), |t| t.to_string()),
            candidates
                .iter()
                .map(|c| format!(
                    "{:.3}/{:.3}",
                    c.attainment,
                    c.validation.unwrap_or(f64::NAN)
                ))
                .collect::<Vec<_>>()
                .join(", "),
            best.policy,
            best.summary.attainment,
            plain.attainment,
            ruled.attainment,
            change_pct(best.summary.ttft.p90, ruled.ttft.p90),
            change_pct(best.summary.tpot.p90, ruled.tpot.p90),
            change_pct(dynamo.ttft.p90, ruled.ttft.p90),
            change_pct(dynamo.tpot.p90, ruled.tpot.p90),
        );
        rows.push(LoadRuleRow {
            workload: name.clone(),
            split,
            concurrency,
            candidates: candidates
                .iter()
                .map(|c| {
                    (
                        c.rule.map(|r| r.prefill_busy_threshold),
                        c.attainment,
                        c.validation,
                    )
                })
                .collect(),
            chosen,
            plain,
            with_rule: ruled,
            dynamo,
            best_baseline: (best.policy, best.summary),
        });
    }
    Ok(rows)
}

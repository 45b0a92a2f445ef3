//! Choosing a table's load rule by measurement: the bits are learned under each candidate rule
//! (none among them), and the table whose learned bits attain the most on the training
//! workload is kept. A rule is one more thing the table learns, as its bits are: a table whose
//! best bits are all remote under the rule is Dynamo's `prefill_load`, one without a rule is
//! DolphinRouting's plain table.

use dolphin_router::dolphin::table::LoadRule;
use dolphin_router::dolphin::{CompiledTable, RoutingTable};
use dolphin_router::policy::{DolphinConfig, Policy};

use crate::error::LearnError;
use crate::fit::FitConfig;
use crate::measure::period_of;
use crate::search::SearchConfig;
use crate::sim_target::{SimLearned, SimTarget, learn_on_sim};

/// The rules the learner chooses among by default: none (first, so the plain table wins
/// ties), and busy above 0.5, 1 and 2 steps of prefill work.
pub const CANDIDATES: [Option<LoadRule>; 4] = [
    None,
    Some(LoadRule {
        prefill_busy_threshold: 0.5,
    }),
    Some(LoadRule {
        prefill_busy_threshold: 1.0,
    }),
    Some(LoadRule {
        prefill_busy_threshold: 2.0,
    }),
];

/// One candidate's learning.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The rule (`None`: the bits alone).
    pub rule: Option<LoadRule>,
    /// The training attainment of the bits learned under it.
    pub attainment: f64,
    /// The attainment of its table on the validation workload (when one was given).
    pub validation: Option<f64>,
    /// The table learned under it.
    pub table: RoutingTable,
}

/// Learns the table under every rule of `rules` on the simulator and keeps the one whose table
/// attains the most on `validate` (another sample of the traffic: the bits are learned to fit
/// their training sample, so a rule judged there is judged partly on how well its bits overfit)
/// or, without one, on the training sample. The first wins a tie, so list `None` first to
/// prefer the plain table. Returns it and every candidate, in `rules`' order.
pub fn learn_rule_on_sim(
    target: &mut SimTarget,
    mut validate: Option<&mut SimTarget>,
    fit: &FitConfig,
    search: &SearchConfig,
    rules: &[Option<LoadRule>],
) -> Result<(SimLearned, Vec<Candidate>), LearnError> {
    let mut best: Option<(f64, SimLearned)> = None;
    let mut candidates = Vec::with_capacity(rules.len());
    for &rule in rules {
        let fit = FitConfig {
            load_rule: rule,
            ..fit.clone()
        };
        let learned = learn_on_sim(target, &fit, search, &[], &mut |_| {})?;
        let attainment = learned.search.attainment;
        let validation = match validate.as_deref_mut() {
            Some(v) => Some(attainment_of(v, &learned.table)?),
            None => None,
        };
        candidates.push(Candidate {
            rule,
            attainment,
            validation,
            table: learned.table.clone(),
        });
        let score = validation.unwrap_or(attainment);
        if best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, learned));
        }
    }
    let (_, best) =
        best.ok_or_else(|| LearnError::Invalid("no load rule to learn under".into()))?;
    Ok((best, candidates))
}

/// `table`'s attainment on `target`'s workload, under the reward it was learned with.
fn attainment_of(target: &mut SimTarget, table: &RoutingTable) -> Result<f64, LearnError> {
    let outcomes = target.run(
        Policy::Dolphin(DolphinConfig::default()),
        Some(CompiledTable::compile(table.clone())?),
    )?;
    Ok(period_of(&outcomes, table.k, table.provenance.reward).attainment)
}

#[cfg(test)]
mod tests {
    use dolphin_engine::SimProfile;
    use dolphin_router::dolphin::Split;
    use dolphin_router::dolphin::table::{ClusterMethod, Reward, TableSlo};
    use dolphin_router::policy::ThresholdConfig;
    use dolphin_sim::SimClusterConfig;
    use dolphin_workload::{Arrivals, Slo, synthetic};

    use super::*;
    use crate::fit::InitBits;

    fn target(seed: u64) -> SimTarget {
        let profile = SimProfile::builtin("qwen72b-h20").expect("shipped profile");
        let cfg = SimClusterConfig::new(1, 1, profile);
        SimTarget::new(
            cfg,
            &synthetic::hybrid(48, seed),
            Arrivals::ClosedLoop { concurrency: 12 },
            Slo::new(5000.0, 250.0),
        )
        .expect("target")
    }

    fn fit(bits: InitBits) -> FitConfig {
        FitConfig {
            split: Split::new(1, 1),
            k: 2,
            method: ClusterMethod::Kmeans,
            slo: TableSlo {
                ttft_ms: 5000.0,
                tpot_ms: 250.0,
            },
            workload: "hybrid".into(),
            bits,
            seed: 1,
            features: [true; 4],
            reward: Reward::E2e,
            load_rule: None,
        }
    }

    fn rule(t: f64) -> Option<LoadRule> {
        Some(LoadRule {
            prefill_busy_threshold: t,
        })
    }

    #[test]
    fn the_simulated_router_follows_a_tables_load_rule() {
        // Every bit remote; under a rule that calls the prefill worker busy as soon as it has
        // anything pending, part of the traffic stays local.
        let search = SearchConfig {
            max_rounds: 1,
            ..SearchConfig::new(2)
        };
        let mut t = target(1);
        let mut plain = learn_on_sim(&mut t, &fit(InitBits::Remote), &search, &[], &mut |_| {})
            .expect("learns")
            .table;
        assert_eq!(plain.bits, vec![1, 1]);
        // No evidence: every bit is taken (none distrusted and sent to the fallback).
        plain.evidence.clear();
        let remote_share = |t: &mut SimTarget, table: &RoutingTable| {
            let compiled = CompiledTable::compile(table.clone()).expect("compiles");
            let out = t
                .run(Policy::Dolphin(DolphinConfig::default()), Some(compiled))
                .expect("runs");
            out.iter().filter(|o| o.remote).count()
        };
        let all = remote_share(&mut t, &plain);
        assert_eq!(all, 48);
        let mut ruled = plain.clone();
        ruled.load_rule = rule(0.0);
        let some = remote_share(&mut t, &ruled);
        assert!(
            0 < some && some < all,
            "{some} of {all} remote under the rule"
        );
    }

    #[test]
    fn the_rule_whose_table_attains_most_on_the_validation_sample_is_kept() {
        let search = SearchConfig {
            max_rounds: 3,
            scan: false,
            ..SearchConfig::new(2)
        };
        let rules = [None, rule(0.0), rule(1.0)];
        let (mut train, mut validate) = (target(1), target(2));
        let (best, candidates) = learn_rule_on_sim(
            &mut train,
            Some(&mut validate),
            &fit(InitBits::Threshold(ThresholdConfig::default())),
            &search,
            &rules,
        )
        .expect("learns");
        let got: Vec<_> = candidates.iter().map(|c| c.rule).collect();
        assert_eq!(got, rules);
        let scores: Vec<f64> = candidates
            .iter()
            .map(|c| c.validation.expect("validated"))
            .collect();
        let top = scores.iter().copied().fold(f64::MIN, f64::max);
        let first_top = scores.iter().position(|&s| s == top).expect("a top");
        assert_eq!(best.table.load_rule, rules[first_top]);
        // The score is the kept table's own attainment there (the simulator is deterministic).
        assert_eq!(
            attainment_of(&mut validate, &best.table).expect("runs"),
            top
        );
        // Without a validation sample the training attainment decides.
        let (best, candidates) = learn_rule_on_sim(
            &mut train,
            None,
            &fit(InitBits::Threshold(ThresholdConfig::default())),
            &search,
            &rules,
        )
        .expect("learns");
        assert!(candidates.iter().all(|c| c.validation.is_none()));
        let top = candidates
            .iter()
            .map(|c| c.attainment)
            .fold(f64::MIN, f64::max);
        assert_eq!(best.search.attainment, top);
        assert!(learn_rule_on_sim(&mut train, None, &fit(InitBits::Remote), &search, &[]).is_err());
    }
}

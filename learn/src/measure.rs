//! Turning replayed requests (live or simulated) into what learning consumes: request-log
//! records for fitting a table, and a measured [`Period`] for the search.

use dolphin_router::dolphin::{Reward, RoutingTable};
use dolphin_router::policy::{Decision, Features, PrefillPath};
use dolphin_workload::{RequestOutcome, Summary};

use crate::log::LogRecord;
use crate::search::{Period, Round, SearchResult};

/// The request-log view of replayed requests: their four features, lengths, path and whether
/// they met the SLO. Failed requests are kept with outcome `"error"` (fitting skips them).
pub fn records_from_outcomes(outcomes: &[RequestOutcome]) -> Vec<LogRecord> {
    outcomes
        .iter()
        .map(|o| LogRecord {
            features: Features {
                isl: o.features[0],
                eff_isl_prefill: o.features[1],
                eff_isl_decode: o.features[2],
                output_len_hint: o.features[3],
            },
            admission: None,
            prompt_tokens: o.prompt_tokens,
            completion_tokens: o.output_tokens,
            outcome: if o.ok { "ok" } else { "error" }.into(),
            decision: Some(if o.remote {
                Decision::Remote
            } else {
                Decision::Local
            }),
            path: Some(path_taken(o)),
            slo_met: Some(o.met),
        })
        .collect()
}

/// The prefill path `o` really took.
pub fn path_taken(o: &RequestOutcome) -> PrefillPath {
    match (o.remote, o.held, o.fell_back) {
        (false, ..) => PrefillPath::Local,
        (true, true, _) => PrefillPath::LocalHeld,
        (true, false, true) => PrefillPath::LocalFallback,
        (true, false, false) => PrefillPath::Remote,
    }
}

/// Whether `o` met its SLO under `reward` (judged outcomes: see [`RequestOutcome::judge`]).
pub fn met(o: &RequestOutcome, reward: Reward) -> bool {
    match reward {
        Reward::E2e => o.met,
        Reward::PerMetric => o.met_each,
    }
}

/// One measured period of a table with `k` clusters: per-cluster requests and SLO hits under
/// `reward` (by the cluster the router reported), overall attainment under `reward` and P90
/// latencies. Requests the router decided without the table (cluster -1, or out of range)
/// count only in the overall figures.
pub fn period_of(outcomes: &[RequestOutcome], k: usize, reward: Reward) -> Period {
    let mut per_cluster = vec![(0u64, 0u64); k];
    let mut per_cluster_held = vec![0u64; k];
    for o in outcomes {
        if let Some(c) = o.cluster.map(|c| c as usize).filter(|&c| c < k) {
            per_cluster[c].0 += 1;
            per_cluster[c].1 += u64::from(met(o, reward));
            per_cluster_held[c] += u64::from(o.held);
        }
    }
    let s = Summary::of(outcomes);
    Period {
        per_cluster,
        per_cluster_held,
        attainment: match reward {
            Reward::E2e => s.attainment,
            Reward::PerMetric => s.attainment_each,
        },
        p90_ttft_ms: s.ttft.p90,
        p90_tpot_ms: s.tpot.p90,
    }
}

/// `table` as a learning period serves it: with `bits`, and without its evidence, so the router
/// takes every bit (a period measures the bits themselves; see `dolphin_router::dolphin::trust`).
pub fn under_measurement(table: &RoutingTable, bits: &[u8]) -> RoutingTable {
    let mut t = table.clone();
    t.bits = bits.to_vec();
    t.evidence.clear();
    t
}

/// Per cluster, the reward of bit `bits[c]` minus the other bit's, each pooled over every round
/// of `history` that measured it (`None` where the other bit was never measured).
pub fn margins(history: &[Round], bits: &[u8]) -> Vec<Option<f64>> {
    let mut pooled = vec![[(0u64, 0u64); 2]; bits.len()];
    for r in history {
        for (c, (&b, &(n, met))) in r.bits.iter().zip(&r.per_cluster).enumerate() {
            if let Some(p) = pooled.get_mut(c) {
                p[usize::from(b.min(1))].0 += n;
                p[usize::from(b.min(1))].1 += met;
            }
        }
    }
    let mean = |(n, met): (u64, u64)| (n > 0).then(|| met as f64 / n as f64);
    pooled
        .iter()
        .zip(bits)
        .map(|(p, &b)| {
            let b = usize::from(b.min(1));
            Some(mean(p[b])? - mean(p[1 - b])?)
        })
        .collect()
}

/// `table` with the learned bits and its provenance: rounds run, the per-cluster rewards of the
/// round that found the bits (a cluster without requests in it gets 0), and how it was learned;
/// its evidence (if the fit recorded any) gains each bit's reward margin over the other path.
pub fn learned_table(mut table: RoutingTable, result: &SearchResult, how: &str) -> RoutingTable {
    table.bits = result.bits.clone();
    table.provenance.rounds = result.rounds;
    if let Some(best) = result
        .history
        .iter()
        .find(|r| r.round == result.converged_round)
    {
        table.provenance.rewards = best
            .per_cluster_reward
            .iter()
            .map(|r| r.unwrap_or(0.0))
            .collect();
    }
    let margins = margins(&result.history, &table.bits);
    for (e, m) in table.evidence.iter_mut().zip(margins) {
        e.margin = m;
    }
    table.provenance.notes = format!(
        "bits learned by measurement ({how}), reward {}: {} rounds, best found in round {}, attainment {:.4}",
        table.provenance.reward.as_str(),
        result.rounds,
        result.converged_round,
        result.attainment
    );
    table
}

#[cfg(test)]
mod tests {
    use dolphin_workload::{RequestKind, Slo};

    use super::*;

    fn outcome(cluster: i32, e2e_ms: f64, ok: bool) -> RequestOutcome {
        // -1 in these tests: no table.
        let cluster = u32::try_from(cluster).ok();
        RequestOutcome {
            kind: RequestKind::Arxiv,
            sent_ms: 0.0,
            prompt_tokens: 1000,
            ttft_ms: 100.0,
            tpot_ms: 10.0,
            features: [1000, 1000, 600, 64],
            ..dolphin_workload::testing::outcome(0, cluster, e2e_ms, ok)
        }
        .judge(&Slo::new(500.0, 50.0))
    }

    #[test]
    fn periods_count_per_cluster_and_overall() {
        // Budget 1000 ms.
        let rows = [
            outcome(0, 900.0, true),
            outcome(0, 1200.0, true),
            outcome(1, 100.0, true),
            outcome(-1, 100.0, true),
            outcome(5, 100.0, false),
        ];
        let p = period_of(&rows, 2, Reward::E2e);
        assert_eq!(p.per_cluster, vec![(2, 1), (1, 1)]);
        assert_eq!(p.per_cluster_held, vec![0, 0]);
        assert_eq!(p.attainment, 3.0 / 5.0);
        let logs = records_from_outcomes(&rows);
        assert_eq!(logs.len(), 5);
        assert_eq!(logs[0].features.eff_isl_decode, 600);
        assert!(logs[0].ok() && !logs[4].ok());
        assert_eq!(logs[1].slo_met, Some(false));
        assert_eq!(logs[2].decision, Some(Decision::Remote));
        assert_eq!(logs[2].path_taken(), Some(PrefillPath::Remote));
        assert_eq!(logs[0].path_taken(), Some(PrefillPath::Local));
    }

    #[test]
    fn margins_pool_every_round_that_measured_each_bit() {
        let round = |bits: Vec<u8>, per_cluster: Vec<(u64, u64)>| Round {
            round: 0,
            phase: crate::search::Phase::Refine,
            bits,
            per_cluster,
            per_cluster_held: Vec::new(),
            per_cluster_reward: Vec::new(),
            attainment: 0.0,
            p90_ttft_ms: 0.0,
            p90_tpot_ms: 0.0,
            best_bits: Vec::new(),
            best_attainment: 0.0,
            improved: false,
        };
        let history = [
            round(vec![0, 1], vec![(10, 5), (10, 9)]),
            round(vec![1, 1], vec![(10, 8), (10, 7)]),
            round(vec![1, 1], vec![(10, 6), (10, 8)]),
        ];
        let m = margins(&history, &[1, 1]);
        // Cluster 0: remote 14/20 against local 5/10; cluster 1 never measured local.
        assert!((m[0].expect("both measured") - 0.2).abs() < 1e-12);
        assert_eq!(m[1], None);
        assert!((margins(&history, &[0, 1])[0].expect("both") + 0.2).abs() < 1e-12);
    }

    #[test]
    fn records_keep_the_path_the_decode_worker_took() {
        let held = RequestOutcome {
            held: true,
            ..outcome(1, 100.0, true)
        };
        let fell_back = RequestOutcome {
            fell_back: true,
            ..outcome(1, 100.0, true)
        };
        let logs = records_from_outcomes(&[held, fell_back]);
        assert_eq!(logs[0].decision, Some(Decision::Remote));
        assert_eq!(logs[0].path, Some(PrefillPath::LocalHeld));
        assert_eq!(logs[1].path, Some(PrefillPath::LocalFallback));
        assert_eq!(path_taken(&outcome(0, 1.0, true)), PrefillPath::Local);
    }

    #[test]
    fn the_per_metric_reward_judges_ttft_and_tpot_each() {
        // A slow first token made up by fast decoding: met end to end, not per metric.
        let slow_first = RequestOutcome {
            ttft_ms: 600.0,
            ..outcome(0, 900.0, true)
        }
        .judge(&Slo::new(500.0, 50.0));
        let rows = [slow_first, outcome(0, 900.0, true)];
        assert_eq!(period_of(&rows, 1, Reward::E2e).per_cluster, vec![(2, 2)]);
        let p = period_of(&rows, 1, Reward::PerMetric);
        assert_eq!(p.per_cluster, vec![(2, 1)]);
        assert_eq!(p.attainment, 0.5);
    }
}

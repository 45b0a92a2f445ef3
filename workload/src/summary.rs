//! The aggregates operators read after a replay: order statistics of TTFT, TPOT and e2e, SLO
//! attainment overall, per routing-table cluster and per request kind, and throughput.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::outcome::RequestOutcome;
use crate::request::RequestKind;

/// Order statistics of one latency, ms (nearest rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// Statistics of `values` (sorted in place; empty gives zeros).
    pub fn of(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_by(f64::total_cmp);
        let rank = |q: f64| crate::stats::nearest_rank(values, q);
        Percentiles {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
        }
    }
}

/// Attainment of one routing-table cluster.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterAttainment {
    /// The cluster (`None`, -1 in JSON: requests decided without a table).
    #[serde(with = "crate::outcome::cluster_json")]
    pub cluster: Option<u32>,
    /// Requests in it.
    pub requests: u64,
    /// Of which met their end-to-end SLO.
    pub met: u64,
    /// `met / requests`.
    pub attainment: f64,
    /// Of which the router sent remote.
    pub remote: u64,
}

impl ClusterAttainment {
    /// Per cluster, in ascending order (`None` first), from each request's `(cluster, met,
    /// remote)`.
    pub fn tally(
        requests: impl IntoIterator<Item = (Option<u32>, bool, bool)>,
    ) -> Vec<ClusterAttainment> {
        let mut clusters: BTreeMap<Option<u32>, ClusterAttainment> = BTreeMap::new();
        for (cluster, met, remote) in requests {
            let c = clusters.entry(cluster).or_insert(ClusterAttainment {
                cluster,
                requests: 0,
                met: 0,
                attainment: 0.0,
                remote: 0,
            });
            c.requests += 1;
            c.met += u64::from(met);
            c.remote += u64::from(remote);
        }
        clusters
            .into_values()
            .map(|mut c| {
                c.attainment = c.met as f64 / c.requests as f64;
                c
            })
            .collect()
    }
}

/// Latency and attainment of one kind of request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    /// The kind.
    pub kind: RequestKind,
    /// Requests of this kind.
    pub requests: u64,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Time per output token.
    pub tpot: Percentiles,
    /// Share that met the end-to-end SLO.
    pub attainment: f64,
}

/// The summary of a replay. Latencies count completed requests only; attainment counts every
/// request (a failed one did not meet its SLO).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests replayed.
    pub requests: u64,
    /// Of which completed.
    pub completed: u64,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Time per output token.
    pub tpot: Percentiles,
    /// End to end.
    pub e2e: Percentiles,
    /// Share that met the end-to-end SLO (DolphinRouting's criterion).
    pub attainment: f64,
    /// Share whose TTFT and TPOT each met their target (TaiChi's criterion).
    pub attainment_each: f64,
    /// Per routing-table cluster, ascending.
    pub per_cluster: Vec<ClusterAttainment>,
    /// Per request kind, in [`RequestKind::ALL`] order (kinds present only).
    pub per_kind: Vec<KindSummary>,
    /// Requests the router sent remote.
    pub remote: u64,
    /// Of which a prefill worker really prefilled (neither held nor fallen back).
    #[serde(default)]
    pub prefilled_remotely: u64,
    /// Of which the decode worker held the prompt up to its last block and prefilled it.
    #[serde(default)]
    pub held: u64,
    /// Of which the remote prefill failed and the decode worker prefilled.
    pub fell_back: u64,
    /// From the first send to the last token, ms.
    pub makespan_ms: f64,
    /// Completed requests per second of makespan.
    pub throughput_rps: f64,
    /// Output tokens per second of makespan.
    pub output_tokens_per_s: f64,
}

impl Summary {
    /// Aggregates `outcomes` (judged already: see [`RequestOutcome::judge`]).
    pub fn of(outcomes: &[RequestOutcome]) -> Self {
        let done: Vec<&RequestOutcome> = outcomes.iter().filter(|o| o.ok).collect();
        let stats = |f: &dyn Fn(&RequestOutcome) -> f64, rows: &[&RequestOutcome]| {
            let mut v: Vec<f64> = rows.iter().map(|o| f(o)).collect();
            Percentiles::of(&mut v)
        };
        let per_cluster =
            ClusterAttainment::tally(outcomes.iter().map(|o| (o.cluster, o.met, o.remote)));
        let per_kind = RequestKind::ALL
            .iter()
            .filter_map(|&kind| {
                let all = outcomes.iter().filter(|o| o.kind == kind).count();
                if all == 0 {
                    return None;
                }
                let rows: Vec<&RequestOutcome> =
                    done.iter().copied().filter(|o| o.kind == kind).collect();
                let met = outcomes.iter().filter(|o| o.kind == kind && o.met).count();
                Some(KindSummary {
                    kind,
                    requests: all as u64,
                    ttft: stats(&|o| o.ttft_ms, &rows),
                    tpot: stats(&|o| o.tpot_ms, &rows),
                    attainment: met as f64 / all as f64,
                })
            })
            .collect();
        let n = outcomes.len();
        let share = |k: usize| if n > 0 { k as f64 / n as f64 } else { 0.0 };
        let start = outcomes
            .iter()
            .map(|o| o.sent_ms)
            .fold(f64::INFINITY, f64::min);
        let end = done
            .iter()
            .map(|o| o.sent_ms + o.e2e_ms)
            .fold(f64::NEG_INFINITY, f64::max);
        let makespan_ms = if end > start { end - start } else { 0.0 };
        let secs = makespan_ms / 1e3;
        let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        let tokens: f64 = done.iter().map(|o| f64::from(o.output_tokens)).sum();
        Summary {
            requests: n as u64,
            completed: done.len() as u64,
            ttft: stats(&|o| o.ttft_ms, &done),
            tpot: stats(&|o| o.tpot_ms, &done),
            e2e: stats(&|o| o.e2e_ms, &done),
            attainment: share(outcomes.iter().filter(|o| o.met).count()),
            attainment_each: share(outcomes.iter().filter(|o| o.met_each).count()),
            remote: per_cluster.iter().map(|c| c.remote).sum(),
            prefilled_remotely: outcomes.iter().filter(|o| o.prefilled_remotely()).count() as u64,
            held: outcomes.iter().filter(|o| o.held).count() as u64,
            fell_back: outcomes.iter().filter(|o| o.fell_back).count() as u64,
            per_cluster,
            per_kind,
            makespan_ms,
            throughput_rps: per_s(done.len() as f64),
            output_tokens_per_s: per_s(tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Slo;

    fn outcome(
        index: u32,
        kind: RequestKind,
        cluster: i32,
        e2e_ms: f64,
        ok: bool,
    ) -> RequestOutcome {
        // -1 in these tests: no table.
        let cluster = u32::try_from(cluster).ok();
        RequestOutcome {
            kind,
            ..crate::testing::outcome(index, cluster, e2e_ms, ok)
        }
        .judge(&Slo::new(500.0, 50.0))
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p90, p.p99), (50.0, 90.0, 99.0));
        assert_eq!(p.mean, 50.5);
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
        assert_eq!(Percentiles::of(&mut [7.0]).p99, 7.0);
    }

    #[test]
    fn attainment_counts_failures_and_splits_by_cluster_and_kind() {
        // Budget: 500 + 10 x 50 = 1000 ms.
        let rows = [
            outcome(0, RequestKind::Arxiv, 0, 900.0, true),
            outcome(1, RequestKind::Arxiv, 1, 1100.0, true),
            RequestOutcome {
                held: true,
                ..outcome(2, RequestKind::Humaneval, 1, 200.0, true)
            },
            outcome(3, RequestKind::Humaneval, 1, 200.0, false),
        ];
        let s = Summary::of(&rows);
        assert_eq!((s.requests, s.completed), (4, 3));
        assert_eq!(s.attainment, 0.5);
        assert_eq!(s.per_cluster.len(), 2);
        assert_eq!(s.per_cluster[0].attainment, 1.0);
        assert_eq!((s.per_cluster[1].requests, s.per_cluster[1].met), (3, 1));
        assert_eq!(s.remote, 3);
        // Sent remote three times; one was held by its decode worker.
        assert_eq!((s.prefilled_remotely, s.held, s.fell_back), (2, 1, 0));
        assert_eq!(s.per_kind.len(), 2);
        assert_eq!(s.per_kind[1].kind, RequestKind::Humaneval);
        assert_eq!(s.per_kind[1].attainment, 0.5);
        // Makespan: first send at 0 to the last completed token, request 1's at 100 + 1100
        // ms (the failed request 3 does not count).
        assert_eq!(s.makespan_ms, 1200.0);
        assert_eq!(s.throughput_rps, 2.5);
        assert_eq!(s.ttft.p99, 550.0);
    }
}

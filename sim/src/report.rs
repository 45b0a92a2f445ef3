//! What a run produces: one record per request and the aggregates operators read (P50/P90/P99
//! of TTFT, TPOT and e2e; SLO attainment overall and per routing-table cluster).

use std::collections::BTreeMap;

use dolphin_router::policy::{Decision, Features};
use serde::Serialize;

/// One simulated request, as the router's request log would record it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Arrival at the router, ms.
    pub arrival_ms: f64,
    /// Decode worker (index in its pool).
    pub decode_worker: u32,
    /// Prefill worker that computed the prompt (remote requests only).
    pub prefill_worker: Option<u32>,
    /// The four routing features.
    pub features: Features,
    /// Routing-table cluster (-1 without a table).
    pub cluster: i32,
    /// The path taken.
    pub decision: Decision,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Time to first token, ms.
    pub ttft_ms: f64,
    /// Mean time per output token after the first, ms (0 for one-token outputs).
    pub tpot_ms: f64,
    /// Arrival to last token, ms.
    pub e2e_ms: f64,
    /// Whether `e2e <= TTFT_slo + (output_tokens - 1) * TPOT_slo` (DolphinRouting's criterion).
    pub met: bool,
    /// Whether TTFT and TPOT each meet their own target (TaiChi's criterion).
    pub met_each: bool,
}

/// Order statistics of one latency, ms (nearest rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
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
        let rank = |q: f64| {
            let i = (q * values.len() as f64).ceil() as usize;
            values[i.clamp(1, values.len()) - 1]
        };
        Percentiles {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
        }
    }
}

/// Attainment of one routing-table cluster.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ClusterAttainment {
    /// The cluster (-1: requests decided without a table).
    pub cluster: i32,
    /// Requests in it.
    pub requests: u64,
    /// Of which met their SLO.
    pub met: u64,
    /// `met / requests`.
    pub attainment: f64,
    /// Of which took the remote path.
    pub remote: u64,
}

/// The result of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    /// Every request, in input order.
    pub records: Vec<RequestRecord>,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Time per output token.
    pub tpot: Percentiles,
    /// End to end.
    pub e2e: Percentiles,
    /// Share of requests that met their SLO (`met`).
    pub attainment: f64,
    /// Share of requests whose TTFT and TPOT each met their target (`met_each`).
    pub attainment_each: f64,
    /// Per cluster, ascending.
    pub per_cluster: Vec<ClusterAttainment>,
    /// Requests prefilled remotely.
    pub remote: u64,
    /// Simulated time until the last event, ms.
    pub makespan_ms: f64,
    /// Requests per simulated second.
    pub throughput_rps: f64,
    /// Output tokens per simulated second.
    pub output_tokens_per_s: f64,
    /// Events the simulation scheduled (steps and transfers).
    pub events: u64,
}

impl SimReport {
    /// Aggregates `records`.
    pub fn from_records(records: Vec<RequestRecord>, makespan_ms: f64, events: u64) -> Self {
        let mut v: Vec<f64> = records.iter().map(|r| r.ttft_ms).collect();
        let ttft = Percentiles::of(&mut v);
        v.clear();
        v.extend(records.iter().map(|r| r.tpot_ms));
        let tpot = Percentiles::of(&mut v);
        v.clear();
        v.extend(records.iter().map(|r| r.e2e_ms));
        let e2e = Percentiles::of(&mut v);
        let mut clusters: BTreeMap<i32, ClusterAttainment> = BTreeMap::new();
        for r in &records {
            let c = clusters.entry(r.cluster).or_insert(ClusterAttainment {
                cluster: r.cluster,
                requests: 0,
                met: 0,
                attainment: 0.0,
                remote: 0,
            });
            c.requests += 1;
            c.met += u64::from(r.met);
            c.remote += u64::from(r.decision == Decision::Remote);
        }
        let per_cluster: Vec<ClusterAttainment> = clusters
            .into_values()
            .map(|mut c| {
                c.attainment = c.met as f64 / c.requests as f64;
                c
            })
            .collect();
        let n = records.len() as f64;
        let met = per_cluster.iter().map(|c| c.met).sum::<u64>() as f64;
        let secs = makespan_ms / 1e3;
        let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        let tokens: f64 = records.iter().map(|r| f64::from(r.output_tokens)).sum();
        let met_each = records.iter().filter(|r| r.met_each).count() as f64;
        SimReport {
            attainment: if n > 0.0 { met / n } else { 0.0 },
            attainment_each: if n > 0.0 { met_each / n } else { 0.0 },
            remote: per_cluster.iter().map(|c| c.remote).sum(),
            per_cluster,
            throughput_rps: per_s(n),
            output_tokens_per_s: per_s(tokens),
            records,
            ttft,
            tpot,
            e2e,
            makespan_ms,
            events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p90, p.p99), (50.0, 90.0, 99.0));
        assert_eq!(p.mean, 50.5);
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
        assert_eq!(Percentiles::of(&mut [7.0]).p99, 7.0);
    }
}

//! Request-by-request comparison: the same request on both sides, to measure the live
//! cluster's own overhead per path and prompt size.

use std::collections::HashMap;

use dolphin_workload::{Percentiles, RequestKind, RequestOutcome};
use serde::Serialize;

/// Request by request (same index on both sides): how often both took the same path, and the
/// median live-minus-sim latency of the requests that did, per path. With one worker per pool
/// both sides route alike, so these medians are the live cluster's own overhead (RPC hops, the
/// KV transfer, streaming through the router) plus what it perturbs downstream.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Paired {
    /// Share of requests that took the same path on both sides.
    pub same_path: f64,
    /// Median TTFT difference of local requests on both sides, ms.
    pub local_ttft_delta_p50: f64,
    /// Median TTFT difference of remote requests on both sides, ms.
    pub remote_ttft_delta_p50: f64,
    /// Median TPOT difference of requests on the same path, ms.
    pub tpot_delta_p50: f64,
    /// The TTFT differences by path and kind: how the live overhead grows with the prompt.
    pub groups: Vec<PairGroup>,
    /// A line through the remote groups' (computed tokens, median TTFT difference): the live
    /// remote path's fixed cost, ms, and its cost per prompt token computed and moved, us.
    pub remote_fit: Option<[f64; 2]>,
}

/// Least-squares line `y = a + b x` through `points`; `None` with fewer than two distinct x.
fn fit_line(points: &[(f64, f64)]) -> Option<[f64; 2]> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| [my - sxy / sxx * mx, sxy / sxx])
}

/// Paired TTFT differences of one path and kind of request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PairGroup {
    /// "local" or "remote".
    pub path: &'static str,
    /// The kind of request.
    pub kind: RequestKind,
    /// Requests paired.
    pub requests: usize,
    /// Their mean prompt length, tokens.
    pub prompt_tokens_mean: f64,
    /// Their mean uncached prompt tokens at routing (decode side for local, prefill side for
    /// remote): what the engine computes.
    pub computed_tokens_mean: f64,
    /// Median live-minus-sim TTFT, ms.
    pub ttft_delta_p50: f64,
}

impl Paired {
    /// Pairs `sim` and `live` outcomes by request index (failed live requests are skipped).
    pub fn of(sim: &[RequestOutcome], live: &[RequestOutcome]) -> Paired {
        let by_index: HashMap<u32, &RequestOutcome> = sim.iter().map(|o| (o.index, o)).collect();
        let pairs: Vec<(&RequestOutcome, &RequestOutcome)> = live
            .iter()
            .filter(|l| l.ok)
            .filter_map(|l| by_index.get(&l.index).map(|s| (*s, l)))
            .filter(|(s, l)| s.remote == l.remote)
            .collect();
        let median = |f: &dyn Fn(&RequestOutcome, &RequestOutcome) -> Option<f64>| {
            let mut v: Vec<f64> = pairs.iter().filter_map(|(s, l)| f(s, l)).collect();
            Percentiles::of(&mut v).p50
        };
        let ttft =
            |remote: bool| median(&|s, l| (s.remote == remote).then_some(l.ttft_ms - s.ttft_ms));
        let mut groups = Vec::new();
        for remote in [false, true] {
            for kind in RequestKind::ALL {
                let rows: Vec<&(&RequestOutcome, &RequestOutcome)> = pairs
                    .iter()
                    .filter(|(s, _)| s.remote == remote && s.kind == kind)
                    .collect();
                if rows.is_empty() {
                    continue;
                }
                let n = rows.len() as f64;
                let mean = |f: fn(&RequestOutcome) -> u32| {
                    rows.iter().map(|(s, _)| f64::from(f(s))).sum::<f64>() / n
                };
                let mut d: Vec<f64> = rows.iter().map(|(s, l)| l.ttft_ms - s.ttft_ms).collect();
                groups.push(PairGroup {
                    path: if remote { "remote" } else { "local" },
                    kind,
                    requests: rows.len(),
                    prompt_tokens_mean: mean(|o| o.prompt_tokens),
                    computed_tokens_mean: if remote {
                        mean(|o| o.features[1])
                    } else {
                        mean(|o| o.features[2])
                    },
                    ttft_delta_p50: Percentiles::of(&mut d).p50,
                });
            }
        }
        let remote: Vec<(f64, f64)> = groups
            .iter()
            .filter(|g| g.path == "remote")
            .map(|g| (g.computed_tokens_mean, g.ttft_delta_p50))
            .collect();
        Paired {
            remote_fit: fit_line(&remote).map(|[a, b]| [a, b * 1e3]),
            same_path: pairs.len() as f64 / live.len().max(1) as f64,
            local_ttft_delta_p50: ttft(false),
            remote_ttft_delta_p50: ttft(true),
            tpot_delta_p50: median(&|s, l| Some(l.tpot_ms - s.tpot_ms)),
            groups,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::tests::outcome;

    #[test]
    fn pairs_match_by_index_and_path() {
        let mut sim = vec![
            outcome(50.0, 5.0, false, 20),
            outcome(150.0, 20.0, true, 100),
            outcome(70.0, 5.0, false, 20),
        ];
        for (i, o) in sim.iter_mut().enumerate() {
            o.index = i as u32;
        }
        let mut live = sim.clone();
        live[0].ttft_ms += 4.0;
        live[1].ttft_ms += 10.0;
        live[1].tpot_ms += 1.0;
        live[2].remote = true; // another path: not paired
        live.reverse(); // order does not matter
        let p = Paired::of(&sim, &live);
        assert!((p.same_path - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(p.local_ttft_delta_p50, 4.0);
        assert_eq!(p.remote_ttft_delta_p50, 10.0);
        assert_eq!(p.tpot_delta_p50, 0.0); // nearest rank of [0, 1]
        let paths: Vec<(&str, usize)> = p.groups.iter().map(|g| (g.path, g.requests)).collect();
        assert_eq!(paths, [("local", 1), ("remote", 1)]);
        assert_eq!(p.groups[1].ttft_delta_p50, 10.0);
    }

    #[test]
    fn lines_fit_exactly_through_collinear_points() {
        let [a, b] = fit_line(&[(0.0, 4.0), (1000.0, 5.0), (2000.0, 6.0)]).expect("fits");
        assert!((a - 4.0).abs() < 1e-9 && (b - 0.001).abs() < 1e-12);
        assert_eq!(fit_line(&[(5.0, 1.0), (5.0, 2.0)]), None);
    }
}

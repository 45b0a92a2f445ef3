//! What a run produces: one record per request and the aggregates operators read (P50/P90/P99
//! of TTFT, TPOT and e2e; SLO attainment overall and per routing-table cluster). The order
//! statistics and per-cluster attainment are `dolphin_workload`'s, so a simulated replay and a
//! live one report alike ([`SimReport::outcomes`]).

use dolphin_router::dolphin::RoutingTable;
use dolphin_router::policy::{Decision, Features, PrefillPath};
pub use dolphin_workload::{ClusterAttainment, Percentiles};
use dolphin_workload::{RequestKind, RequestOutcome};
use serde::Serialize;

/// One simulated request, as the router's request log would record it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Arrival at the router, ms (under closed-loop arrivals, when it was released).
    pub arrival_ms: f64,
    /// Where the request comes from.
    pub kind: RequestKind,
    /// Decode worker (index in its pool).
    pub decode_worker: u32,
    /// Prefill worker that computed the prompt (remote requests only).
    pub prefill_worker: Option<u32>,
    /// The four routing features.
    pub features: Features,
    /// Routing-table cluster (`None` without a table; -1 in JSON).
    #[serde(with = "dolphin_workload::outcome_cluster_json")]
    pub cluster: Option<u32>,
    /// The router's decision.
    pub decision: Decision,
    /// The prefill path really taken (`local_held` where the decode worker held the prompt).
    pub path: PrefillPath,
    /// The online learner sent it by the path its cluster's bit does not give.
    pub explored: bool,
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
    /// What the online learner did (`None`: it was off).
    pub online: Option<OnlineRun>,
}

/// The online learner's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OnlineRun {
    /// Every flip, in order.
    pub flips: Vec<FlipRecord>,
    /// Requests explored.
    pub explored: u64,
    /// The table at the end of the run.
    pub table: RoutingTable,
}

/// One bit the online learner flipped.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FlipRecord {
    /// Simulated time, ms.
    pub at_ms: f64,
    /// The cluster.
    pub cluster: u32,
    /// Its new path.
    pub to: Decision,
    /// The new path's estimated attainment gain.
    pub gain: f64,
    /// An untrusted cluster adopted a path (the bit may be unchanged).
    pub adopted: bool,
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
        let per_cluster = ClusterAttainment::tally(
            records
                .iter()
                .map(|r| (r.cluster, r.met, r.decision == Decision::Remote)),
        );
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
            online: None,
        }
    }

    /// Every request as a replay outcome, in input order (`index` is the position in the
    /// input): sent at its arrival, completed (`ok`, never fell back: the simulator has no
    /// failures), with its features, cluster, path and SLO verdicts. `Summary::of` over them
    /// gives this report's percentiles, attainment and per-cluster numbers.
    pub fn outcomes(&self) -> Vec<RequestOutcome> {
        self.records
            .iter()
            .enumerate()
            .map(|(i, r)| RequestOutcome {
                index: i as u32,
                kind: r.kind,
                sent_ms: r.arrival_ms,
                prompt_tokens: r.features.isl,
                output_tokens: r.output_tokens,
                ttft_ms: r.ttft_ms,
                tpot_ms: r.tpot_ms,
                e2e_ms: r.e2e_ms,
                features: [
                    r.features.isl,
                    r.features.eff_isl_prefill,
                    r.features.eff_isl_decode,
                    r.features.output_len_hint,
                ],
                cluster: r.cluster,
                remote: r.decision == Decision::Remote,
                fell_back: false,
                held: r.path == PrefillPath::LocalHeld,
                ok: true,
                met: r.met,
                met_each: r.met_each,
            })
            .collect()
    }
}

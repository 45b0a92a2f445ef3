//! The numbers compared between the simulator and the live cluster, their differences, and the
//! table printed for them.

use dolphin_workload::{Percentiles, RequestOutcome, Summary};
use serde::Serialize;

use crate::paired::Paired;

/// What one side (simulator or live cluster) measured, latencies in profile milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Side {
    /// Requests replayed.
    pub requests: u64,
    /// Of which failed (live only).
    pub failed: u64,
    /// Time to first token, ms.
    pub ttft: Percentiles,
    /// Time per output token, ms.
    pub tpot: Percentiles,
    /// End to end, ms.
    pub e2e: Percentiles,
    /// P50 / P90 TTFT of the requests prefilled locally, ms.
    pub local_ttft_p50: f64,
    /// P90 of the same.
    pub local_ttft_p90: f64,
    /// P50 TTFT of the requests prefilled remotely, ms.
    pub remote_ttft_p50: f64,
    /// P90 of the same.
    pub remote_ttft_p90: f64,
    /// Share of requests meeting the end-to-end SLO.
    pub attainment: f64,
    /// Share of requests prefilled remotely.
    pub remote_share: f64,
    /// Share of prompt tokens the chosen decode workers held at routing time (the router's
    /// `1 - sum(eff_isl_decode) / sum(isl)`): how much the prefix caches served.
    pub decode_cached_share: f64,
    /// The same on the chosen prefill workers.
    pub prefill_cached_share: f64,
    /// Remote prefills that fell back to local (live only).
    pub fell_back: u64,
    /// Output tokens per second of makespan.
    pub output_tokens_per_s: f64,
}

impl Side {
    /// The numbers of a replay's `outcomes`.
    pub fn of(outcomes: &[RequestOutcome]) -> Side {
        let s = Summary::of(outcomes);
        let path = |remote: bool| {
            let mut v: Vec<f64> = outcomes
                .iter()
                .filter(|o| o.ok && o.remote == remote)
                .map(|o| o.ttft_ms)
                .collect();
            Percentiles::of(&mut v)
        };
        let (local, remote) = (path(false), path(true));
        let isl: f64 = outcomes.iter().map(|o| f64::from(o.features[0])).sum();
        let cached = |i: usize| {
            let eff: f64 = outcomes.iter().map(|o| f64::from(o.features[i])).sum();
            if isl > 0.0 { 1.0 - eff / isl } else { 0.0 }
        };
        let n = s.requests.max(1) as f64;
        Side {
            requests: s.requests,
            failed: s.requests - s.completed,
            ttft: s.ttft,
            tpot: s.tpot,
            e2e: s.e2e,
            local_ttft_p50: local.p50,
            local_ttft_p90: local.p90,
            remote_ttft_p50: remote.p50,
            remote_ttft_p90: remote.p90,
            attainment: s.attainment,
            remote_share: s.remote as f64 / n,
            decode_cached_share: cached(2),
            prefill_cached_share: cached(1),
            fell_back: s.fell_back,
            output_tokens_per_s: s.output_tokens_per_s,
        }
    }
}

/// Live relative to the simulator: `(live - sim) / sim` for latencies, `live - sim` for shares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Diff {
    /// P50 TTFT, relative.
    pub p50_ttft: f64,
    /// P90 TTFT, relative.
    pub p90_ttft: f64,
    /// P50 TPOT, relative.
    pub p50_tpot: f64,
    /// P90 TPOT, relative.
    pub p90_tpot: f64,
    /// P90 e2e, relative.
    pub p90_e2e: f64,
    /// Attainment, absolute (share points).
    pub attainment: f64,
    /// Remote share, absolute.
    pub remote_share: f64,
    /// Decode-side cached share, absolute.
    pub decode_cached_share: f64,
    /// Whether P90 TTFT and P90 TPOT both agree within the tolerance.
    pub within_tolerance: bool,
}

fn rel(live: f64, sim: f64) -> f64 {
    if sim == 0.0 {
        if live == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        (live - sim) / sim
    }
}

impl Diff {
    /// `live` against `sim`, P90s judged against `tolerance` (0.15: within 15%).
    pub fn of(sim: &Side, live: &Side, tolerance: f64) -> Diff {
        let p90_ttft = rel(live.ttft.p90, sim.ttft.p90);
        let p90_tpot = rel(live.tpot.p90, sim.tpot.p90);
        Diff {
            p50_ttft: rel(live.ttft.p50, sim.ttft.p50),
            p90_ttft,
            p50_tpot: rel(live.tpot.p50, sim.tpot.p50),
            p90_tpot,
            p90_e2e: rel(live.e2e.p90, sim.e2e.p90),
            attainment: live.attainment - sim.attainment,
            remote_share: live.remote_share - sim.remote_share,
            decode_cached_share: live.decode_cached_share - sim.decode_cached_share,
            within_tolerance: p90_ttft.abs() <= tolerance && p90_tpot.abs() <= tolerance,
        }
    }
}

/// One row of the table: a number of each side and, where compared, its difference.
struct Row {
    name: &'static str,
    get: fn(&Side) -> f64,
    delta: Option<fn(&Diff) -> f64>,
    /// Milliseconds (else a share, shown in percent).
    ms: bool,
}

const fn row(name: &'static str, get: fn(&Side) -> f64, delta: Option<fn(&Diff) -> f64>) -> Row {
    Row {
        name,
        get,
        delta,
        ms: true,
    }
}

const fn share_row(
    name: &'static str,
    get: fn(&Side) -> f64,
    delta: Option<fn(&Diff) -> f64>,
) -> Row {
    Row {
        name,
        get,
        delta,
        ms: false,
    }
}

const ROWS: [Row; 14] = [
    row("P50 TTFT ms", |s| s.ttft.p50, Some(|d| d.p50_ttft)),
    row("P90 TTFT ms", |s| s.ttft.p90, Some(|d| d.p90_ttft)),
    row("P50 TPOT ms", |s| s.tpot.p50, Some(|d| d.p50_tpot)),
    row("P90 TPOT ms", |s| s.tpot.p90, Some(|d| d.p90_tpot)),
    row("P90 e2e ms", |s| s.e2e.p90, Some(|d| d.p90_e2e)),
    row("local P50 / P90 TTFT ms", |s| s.local_ttft_p50, None),
    row("", |s| s.local_ttft_p90, None),
    row("remote P50 / P90 TTFT ms", |s| s.remote_ttft_p50, None),
    row("", |s| s.remote_ttft_p90, None),
    share_row("attainment", |s| s.attainment, Some(|d| d.attainment)),
    share_row("remote share", |s| s.remote_share, Some(|d| d.remote_share)),
    share_row(
        "decode cached share",
        |s| s.decode_cached_share,
        Some(|d| d.decode_cached_share),
    ),
    share_row("prefill cached share", |s| s.prefill_cached_share, None),
    row("output tok/s", |s| s.output_tokens_per_s, None),
];

/// The table of one split: a row per number, columns sim, live, difference.
pub fn table(
    split: &str,
    sim: &Side,
    live: Option<&Side>,
    diff: Option<&Diff>,
    paired: Option<&Paired>,
) -> String {
    let mut out = format!(
        "{split:<6} {:<26} {:>10} {:>10} {:>9}\n",
        "", "sim", "live", "diff"
    );
    let pct = |d: Option<f64>| d.map_or("-".to_string(), |d| format!("{:+.1}%", d * 100.0));
    let pts = |d: Option<f64>| d.map_or("-".to_string(), |d| format!("{:+.1}pt", d * 100.0));
    let mut line = |name: &str, s: String, l: Option<String>, d: String| {
        let l = l.unwrap_or_else(|| "-".into());
        out.push_str(&format!("       {name:<26} {s:>10} {l:>10} {d:>9}\n"));
    };
    let ms = |v: f64| format!("{v:.1}");
    let share = |v: f64| format!("{:.1}%", v * 100.0);
    for r in ROWS {
        let fmt = |v: f64| if r.ms { ms(v) } else { share(v) };
        let d = r.delta.and_then(|f| diff.map(f));
        let d = if r.ms { pct(d) } else { pts(d) };
        line(r.name, fmt((r.get)(sim)), live.map(|l| fmt((r.get)(l))), d);
    }
    if let Some(l) = live {
        line(
            "failed / fell back",
            "0 / 0".into(),
            Some(format!("{} / {}", l.failed, l.fell_back)),
            String::new(),
        );
    }
    if let Some(p) = paired {
        out.push_str(&format!(
            "       same path {:.1}%; median live - sim: local TTFT {:+.1} ms, remote TTFT {:+.1} ms, TPOT {:+.2} ms\n",
            p.same_path * 100.0,
            p.local_ttft_delta_p50,
            p.remote_ttft_delta_p50,
            p.tpot_delta_p50
        ));
        for g in &p.groups {
            out.push_str(&format!(
                "         {:<6} {:<9} n={:<3} prompt {:>6.0} computed {:>6.0} tokens: TTFT {:+.1} ms\n",
                g.path,
                g.kind.name(),
                g.requests,
                g.prompt_tokens_mean,
                g.computed_tokens_mean,
                g.ttft_delta_p50
            ));
        }
        if let Some([fixed, per_token]) = p.remote_fit {
            out.push_str(&format!(
                "         remote path live overhead ~ {fixed:.1} ms + {per_token:.2} us per computed token\n"
            ));
        }
    }
    if let Some(d) = diff {
        let verdict = if d.within_tolerance { "yes" } else { "NO" };
        out.push_str(&format!("       P90 TTFT and TPOT agree: {verdict}\n"));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use dolphin_workload::{RequestKind, Slo};

    use super::*;

    pub(crate) fn outcome(ttft: f64, tpot: f64, remote: bool, eff_decode: u32) -> RequestOutcome {
        RequestOutcome {
            index: 0,
            kind: RequestKind::Humaneval,
            sent_ms: 0.0,
            prompt_tokens: 100,
            output_tokens: 11,
            ttft_ms: ttft,
            tpot_ms: tpot,
            e2e_ms: ttft + 10.0 * tpot,
            features: [100, 100, eff_decode, 64],
            cluster: None,
            remote,
            fell_back: false,
            held: false,
            ok: true,
            met: false,
            met_each: false,
        }
        .judge(&Slo::new(100.0, 10.0))
    }

    #[test]
    fn sides_split_paths_and_count_cache_hits() {
        let side = Side::of(&[
            outcome(50.0, 5.0, false, 20),
            outcome(150.0, 20.0, true, 100),
        ]);
        assert_eq!(side.requests, 2);
        assert_eq!(side.local_ttft_p90, 50.0);
        assert_eq!(side.remote_ttft_p90, 150.0);
        assert!((side.remote_share - 0.5).abs() < 1e-12);
        assert!((side.decode_cached_share - 0.4).abs() < 1e-12);
        assert!((side.attainment - 0.5).abs() < 1e-12);
    }

    #[test]
    fn differences_are_relative_for_latency_and_absolute_for_shares() {
        let sim = Side::of(&[outcome(100.0, 10.0, false, 100)]);
        let live = Side::of(&[outcome(110.0, 12.0, true, 100)]);
        let d = Diff::of(&sim, &live, 0.15);
        assert!((d.p90_ttft - 0.1).abs() < 1e-9);
        assert!((d.p90_tpot - 0.2).abs() < 1e-9);
        assert!(!d.within_tolerance, "TPOT is 20% off");
        assert!((d.remote_share - 1.0).abs() < 1e-12);
        assert!(Diff::of(&sim, &live, 0.25).within_tolerance);
        let text = table("1p1d", &sim, Some(&live), Some(&d), None);
        assert!(
            text.contains("P90 TPOT ms") && text.contains("+20.0%"),
            "{text}"
        );
        assert!(text.contains("agree: NO"), "{text}");
    }
}

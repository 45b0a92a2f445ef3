//! What a replay reports: a compact table on stdout and, on request, a JSON document with the
//! config, the [`Summary`] and every outcome.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use dolphin_workload::{Percentiles, RequestOutcome, Summary};
use serde::Serialize;

use super::ReplayError;
use super::args::ConfigRecord;
use super::live::failure_summary;

/// The JSON report (`--json`).
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// The settings.
    pub config: &'a ConfigRecord,
    /// The aggregates.
    pub summary: &'a Summary,
    /// Failed requests by status code.
    pub failures: &'a BTreeMap<String, u64>,
    /// Every request, in workload order.
    pub outcomes: &'a [RequestOutcome],
}

/// Writes `report` as pretty JSON to `path`.
pub fn write_json(path: &Path, report: &JsonReport<'_>) -> Result<(), ReplayError> {
    let write = |source| ReplayError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut text = serde_json::to_string_pretty(report)
        .map_err(std::io::Error::other)
        .map_err(write)?;
    text.push('\n');
    std::fs::write(path, text).map_err(write)
}

/// A cluster's name in reports: "c3", or "none" for requests no table decided.
pub fn cluster_label(cluster: Option<u32>) -> String {
    cluster.map_or_else(|| "none".to_owned(), |c| format!("c{c}"))
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn latency_row(out: &mut String, name: &str, p: &Percentiles) {
    let _ = writeln!(
        out,
        "  {name:<6}{:>10.1}{:>10.1}{:>10.1}{:>10.1}",
        p.p50, p.p90, p.p99, p.mean
    );
}

/// The human report: what ran, throughput and paths, latency percentiles, attainment overall,
/// per cluster and per kind, and failures by code.
pub fn render(
    config: &ConfigRecord,
    summary: &Summary,
    failures: &BTreeMap<String, u64>,
) -> String {
    let s = summary;
    let mut out = String::new();
    let target = match (&config.router_grpc, &config.split) {
        (Some(url), _) => format!("live router {url}"),
        (None, Some(split)) => format!(
            "sim {split}, {}, policy {}",
            config.sim_profile.as_deref().unwrap_or("?"),
            config.policy.as_deref().unwrap_or("?")
        ),
        (None, None) => "?".to_owned(),
    };
    let _ = writeln!(
        out,
        "replay of {} ({} requests, arrivals {}) on {target}; SLO TTFT {} ms, TPOT {} ms",
        config.workload, s.requests, config.arrivals, config.slo.ttft_ms, config.slo.tpot_ms
    );
    let share = |k: u64| {
        if s.requests > 0 {
            k as f64 / s.requests as f64
        } else {
            0.0
        }
    };
    let _ = writeln!(
        out,
        "completed {}/{} in {:.2} s: {:.2} req/s, {:.0} output tok/s; sent remote {} ({}): \
         prefilled remotely {}, held by the decode worker {}, fell back {}",
        s.completed,
        s.requests,
        s.makespan_ms / 1e3,
        s.throughput_rps,
        s.output_tokens_per_s,
        s.remote,
        pct(share(s.remote)),
        s.prefilled_remotely,
        s.held,
        s.fell_back
    );
    let _ = writeln!(
        out,
        "\n  {:<6}{:>10}{:>10}{:>10}{:>10}",
        "ms", "p50", "p90", "p99", "mean"
    );
    latency_row(&mut out, "TTFT", &s.ttft);
    latency_row(&mut out, "TPOT", &s.tpot);
    latency_row(&mut out, "e2e", &s.e2e);
    let _ = writeln!(
        out,
        "\nattainment: {} end to end (TTFT_slo + (n-1) x TPOT_slo), {} TTFT and TPOT each",
        pct(s.attainment),
        pct(s.attainment_each)
    );
    let _ = writeln!(
        out,
        "\n  {:<8}{:>10}{:>8}{:>12}{:>8}",
        "cluster", "requests", "met", "attainment", "remote"
    );
    for c in &s.per_cluster {
        let _ = writeln!(
            out,
            "  {:<8}{:>10}{:>8}{:>12}{:>8}",
            cluster_label(c.cluster),
            c.requests,
            c.met,
            pct(c.attainment),
            c.remote
        );
    }
    let _ = writeln!(
        out,
        "\n  {:<10}{:>10}{:>12}{:>10}{:>10}",
        "kind", "requests", "attainment", "p90 TTFT", "p90 TPOT"
    );
    for k in &s.per_kind {
        let _ = writeln!(
            out,
            "  {:<10}{:>10}{:>12}{:>10.1}{:>10.1}",
            k.kind.name(),
            k.requests,
            pct(k.attainment),
            k.ttft.p90,
            k.tpot.p90
        );
    }
    let failed: u64 = failures.values().sum();
    if failed > 0 {
        let _ = writeln!(out, "\nfailed: {failed} ({})", failure_summary(failures));
    } else {
        let _ = writeln!(out, "\nfailed: 0");
    }
    out
}

#[cfg(test)]
mod tests {
    use dolphin_workload::Slo;

    use super::*;
    use crate::replay::args::Target;

    fn outcome(index: u32, cluster: i32, ok: bool) -> RequestOutcome {
        // -1 in these tests: no table.
        let cluster = u32::try_from(cluster).ok();
        RequestOutcome {
            sent_ms: 0.0,
            prompt_tokens: 200,
            output_tokens: 10,
            ttft_ms: 100.0,
            tpot_ms: 20.0,
            features: [200, 200, 200, 64],
            ..dolphin_workload::testing::outcome(index, cluster, 280.0, ok)
        }
        .judge(&Slo::new(5000.0, 250.0))
    }

    fn config() -> ConfigRecord {
        ConfigRecord {
            workload: "humaneval".into(),
            requests: Some(3),
            seed: 0,
            arrivals: "closed:4".into(),
            slo: Slo::new(5000.0, 250.0),
            target: Target::Live,
            router_grpc: Some("http://127.0.0.1:1".into()),
            max_in_flight: Some(4),
            model: None,
            split: None,
            sim_profile: None,
            policy: None,
            policy_params: None,
            table: None,
            total_blocks: None,
            classifier: None,
            max_tokens_cap: false,
        }
    }

    #[test]
    fn table_names_clusters_kinds_and_failures() {
        let rows = [
            outcome(0, 0, true),
            outcome(1, 1, true),
            outcome(2, 1, false),
        ];
        let failures = BTreeMap::from([("Unavailable".to_owned(), 1)]);
        let text = render(&config(), &Summary::of(&rows), &failures);
        assert!(text.contains("completed 2/3"), "{text}");
        assert!(text.contains("live router http://127.0.0.1:1"), "{text}");
        assert!(text.contains("remote 2 (66.7%)"), "{text}");
        assert!(text.contains("66.7% end to end"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("c1") && l.contains("50.0%"))
        );
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("humaneval"))
        );
        assert!(text.contains("failed: 1 (Unavailable x 1)"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("TTFT") && l.contains("100.0"))
        );
    }

    #[test]
    fn json_has_config_summary_and_outcomes() {
        let rows = [outcome(0, -1, true)];
        let summary = Summary::of(&rows);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let failures = BTreeMap::new();
        let cfg = config();
        write_json(
            &path,
            &JsonReport {
                config: &cfg,
                summary: &summary,
                failures: &failures,
                outcomes: &rows,
            },
        )
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["config"]["arrivals"], "closed:4");
        assert_eq!(v["config"]["target"], "live");
        assert!(v["config"].get("split").is_none());
        assert_eq!(v["summary"]["requests"], 1);
        let back: Vec<RequestOutcome> = serde_json::from_value(v["outcomes"].clone()).unwrap();
        assert_eq!(back, rows);
        assert_eq!(cluster_label(None), "none");
        let err = write_json(
            &dir.path().join("no/such/dir/r.json"),
            &JsonReport {
                config: &cfg,
                summary: &summary,
                failures: &failures,
                outcomes: &rows,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("r.json"), "{err}");
    }
}

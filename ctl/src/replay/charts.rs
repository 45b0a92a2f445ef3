//! The replay's PNG charts (`--plots DIR`): CDFs of TTFT, TPOT and e2e, and attainment per
//! routing-table cluster.

use std::path::{Path, PathBuf};

use dolphin_workload::{RequestKind, RequestOutcome, Summary};

use super::ReplayError;
use super::report::cluster_label;
use crate::chart::{self, PlotError, Series};

/// File names, in the order they are written.
pub const CHARTS: [&str; 4] = [
    "ttft_cdf.png",
    "tpot_cdf.png",
    "e2e_cdf.png",
    "cluster_attainment.png",
];

/// One latency CDF chart.
struct Cdf {
    file: &'static str,
    title: &'static str,
    x_label: &'static str,
    value: fn(&RequestOutcome) -> f64,
    /// TTFT and e2e span orders of magnitude under load; TPOT does not (and is 0 for
    /// one-token outputs, which a log axis would drop).
    log_x: bool,
}

const CDFS: [Cdf; 3] = [
    Cdf {
        file: CHARTS[0],
        title: "Time to first token",
        x_label: "TTFT (ms, log scale)",
        value: |o| o.ttft_ms,
        log_x: true,
    },
    Cdf {
        file: CHARTS[1],
        title: "Time per output token",
        x_label: "TPOT (ms)",
        value: |o| o.tpot_ms,
        log_x: false,
    },
    Cdf {
        file: CHARTS[2],
        title: "End-to-end latency",
        x_label: "e2e (ms, log scale)",
        value: |o| o.e2e_ms,
        log_x: true,
    },
];

/// Curves of one latency over completed requests: all of them, then local and remote (the
/// prefill path really taken) when both were, then each kind when the workload mixes kinds.
pub fn latency_series(outcomes: &[RequestOutcome], f: fn(&RequestOutcome) -> f64) -> Vec<Series> {
    let done: Vec<&RequestOutcome> = outcomes.iter().filter(|o| o.ok).collect();
    let values = |keep: &dyn Fn(&RequestOutcome) -> bool| -> Vec<f64> {
        done.iter().filter(|o| keep(o)).map(|o| f(o)).collect()
    };
    let mut series = vec![Series::new("all", values(&|_| true))];
    // By the path really taken: a remote decision the decode worker served itself is local.
    let remote = done.iter().filter(|o| o.prefilled_remotely()).count();
    if remote > 0 && remote < done.len() {
        series.push(Series::new("local", values(&|o| !o.prefilled_remotely())));
        series.push(Series::new("remote", values(&|o| o.prefilled_remotely())));
    }
    let kinds: Vec<RequestKind> = RequestKind::ALL
        .into_iter()
        .filter(|k| done.iter().any(|o| o.kind == *k))
        .collect();
    if kinds.len() > 1 {
        for k in kinds {
            series.push(Series::new(k.name(), values(&|o| o.kind == k)));
        }
    }
    series
}

/// Writes the [`CHARTS`] into `dir` (created if missing) and returns their paths. A chart with
/// nothing to draw (e.g. no request completed) is skipped with a note in `skipped`.
pub fn write_charts(
    dir: &Path,
    outcomes: &[RequestOutcome],
    summary: &Summary,
    skipped: &mut Vec<String>,
) -> Result<Vec<PathBuf>, ReplayError> {
    std::fs::create_dir_all(dir).map_err(|source| ReplayError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let mut keep = |name: &str, result: Result<(), PlotError>| match result {
        Ok(()) => {
            written.push(dir.join(name));
            Ok(())
        }
        Err(PlotError::Empty(why)) => {
            skipped.push(format!("{name}: {why}"));
            Ok(())
        }
        Err(source) => Err(ReplayError::Plot {
            name: name.to_owned(),
            source,
        }),
    };
    let n = summary.completed;
    for cdf in CDFS {
        let title = format!("{} ({n} completed requests)", cdf.title);
        let series = latency_series(outcomes, cdf.value);
        keep(
            cdf.file,
            chart::cdf_chart(&dir.join(cdf.file), &title, cdf.x_label, &series, cdf.log_x),
        )?;
    }
    let categories: Vec<String> = summary
        .per_cluster
        .iter()
        .map(|c| format!("{} ({})", cluster_label(c.cluster), c.requests))
        .collect();
    let attainment = Series::new(
        "SLO attainment (e2e)",
        summary.per_cluster.iter().map(|c| c.attainment).collect(),
    );
    let remote = Series::new(
        "remote share",
        summary
            .per_cluster
            .iter()
            .map(|c| c.remote as f64 / c.requests.max(1) as f64)
            .collect(),
    );
    keep(
        CHARTS[3],
        chart::bar_chart(
            &dir.join(CHARTS[3]),
            "SLO attainment per routing-table cluster (requests)",
            "share of requests",
            &categories,
            &[attainment, remote],
            true,
        ),
    )?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use dolphin_workload::Slo;

    use super::*;

    fn outcome(index: u32, kind: RequestKind, remote: bool, ok: bool) -> RequestOutcome {
        RequestOutcome {
            index,
            kind,
            sent_ms: f64::from(index),
            prompt_tokens: 100,
            output_tokens: 5,
            ttft_ms: 10.0 + f64::from(index),
            tpot_ms: 2.0,
            e2e_ms: 18.0 + f64::from(index),
            features: [100, 100, 100, 5],
            cluster: Some(u32::from(remote)),
            remote,
            fell_back: false,
            held: false,
            ok,
            met: false,
            met_each: false,
        }
        .judge(&Slo::new(100.0, 10.0))
    }

    #[test]
    fn series_split_by_path_and_kind_only_when_mixed() {
        let one_kind = [
            outcome(0, RequestKind::Arxiv, false, true),
            outcome(1, RequestKind::Arxiv, false, true),
            outcome(2, RequestKind::Arxiv, false, false),
        ];
        let s = latency_series(&one_kind, |o| o.ttft_ms);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].values, [10.0, 11.0]);
        let mixed = [
            outcome(0, RequestKind::Arxiv, false, true),
            outcome(1, RequestKind::Humaneval, true, true),
        ];
        let labels: Vec<String> = latency_series(&mixed, |o| o.ttft_ms)
            .into_iter()
            .map(|s| s.label)
            .collect();
        assert_eq!(labels, ["all", "local", "remote", "arxiv", "humaneval"]);
    }

    #[test]
    fn writes_every_chart_as_png() {
        let rows: Vec<RequestOutcome> = (0..20)
            .map(|i| outcome(i, RequestKind::Humaneval, i % 2 == 0, true))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("plots");
        let mut skipped = Vec::new();
        let written = write_charts(&out, &rows, &Summary::of(&rows), &mut skipped).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(written.len(), CHARTS.len());
        for name in CHARTS {
            let bytes = std::fs::read(out.join(name)).unwrap();
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}");
        }
    }

    #[test]
    fn nothing_completed_skips_the_latency_charts() {
        let rows = [outcome(0, RequestKind::Arxiv, false, false)];
        let dir = tempfile::tempdir().unwrap();
        let mut skipped = Vec::new();
        let written = write_charts(dir.path(), &rows, &Summary::of(&rows), &mut skipped).unwrap();
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert_eq!(written, [dir.path().join("cluster_attainment.png")]);
    }
}

//! The simulator against the live real-model cluster, as a section of `docs/results.md`: a
//! timing profile measured on the candle engine (`dolphinctl profile fit`), then
//! `sim_crosscheck --engine candle` replaying one workload on the simulator under that profile
//! and on real SmolLM2 workers. `paper_results --run-crosscheck` runs both (about 20 minutes on
//! two cores, and it needs the model); without it the section is read from the result file the
//! last run wrote, and says when that was.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use dolphin_router::request_log::rfc3339;
use serde::Serialize;
use serde_json::Value;

use crate::BenchError;
use crate::process::sibling_binary;

/// `dolphinctl profile fit` for the cross-check's profile: one compute thread and the pool the
/// live workers get, prefill sizes up to candle's 256-token step (and two past it).
pub const FIT_ARGS: &[&str] = &[
    "profile",
    "fit",
    "--engine",
    "candle",
    "--threads",
    "1",
    "--kv-bytes",
    "512MiB",
    "--prefill-tokens",
    "16,32,64,128,192,256,384,512",
    "--prefill-context",
    "0,256,512,1024,2048",
    "--reps",
    "3",
];

/// `sim_crosscheck` for the section: Hybrid scaled to 1/32 (prompts of 5 to about 600 tokens),
/// 60 requests, Poisson at 0.15 requests per second per decode worker, 1p1d and 1p2d.
pub const CROSSCHECK_ARGS: &[&str] = &[
    "--engine",
    "candle",
    "--workload",
    "hybrid",
    "--length-scale",
    "0.03125",
    "--requests",
    "60",
    "--rate-per-decode",
    "0.15",
    "--splits",
    "1p1d,1p2d",
    "--sim-seeds",
    "3",
];

/// One split of the cross-check.
#[derive(Clone, Debug, Serialize)]
pub struct CrosscheckRow {
    /// `1p1d`, ...
    pub split: String,
    /// Simulated and live P90 TTFT, ms.
    pub p90_ttft_ms: [f64; 2],
    /// (live - sim) / sim.
    pub ttft_diff: f64,
    /// Simulated and live P90 TPOT, ms.
    pub p90_tpot_ms: [f64; 2],
    /// (live - sim) / sim.
    pub tpot_diff: f64,
    /// Both within the run's tolerance.
    pub within: bool,
}

/// Measures the profile into `profile` and runs the cross-check into `result`, with the
/// sibling `dolphinctl` and `sim_crosscheck` binaries (their output goes to this process's).
pub fn run_crosscheck(profile: &Path, result: &Path) -> Result<(), BenchError> {
    let fit = sibling_binary("dolphinctl")?;
    let mut cmd = Command::new(&fit);
    cmd.args(FIT_ARGS).arg("--out").arg(profile);
    run(cmd, "dolphinctl profile fit")?;
    let mut cmd = Command::new(sibling_binary("sim_crosscheck")?);
    cmd.args(CROSSCHECK_ARGS)
        .arg("--profile")
        .arg(profile)
        .arg("--out")
        .arg(result);
    run(cmd, "sim_crosscheck")
}

fn run(mut cmd: Command, what: &str) -> Result<(), BenchError> {
    eprintln!("paper_results: {what} ...");
    let status = cmd
        .status()
        .map_err(BenchError::io(format!("start {what}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(BenchError::Experiment(format!("{what} failed ({status})")))
    }
}

/// Appends the cross-check section read from `result` (a `sim_crosscheck` JSON) to `md`; the
/// rows, or none when the file is absent (the section then says how to make it).
pub fn crosscheck_section(
    result: &Path,
    md: &mut String,
) -> Result<Vec<CrosscheckRow>, BenchError> {
    let _ = writeln!(
        md,
        "\n## The simulator against the live real-model cluster\n\nA timing profile measured on the candle engine (`dolphinctl {}`), given to the simulator, which then replays the same requests as a live cluster of real SmolLM2 workers started by `dolphinctl up --engine candle` (`sim_crosscheck {}`; `paper_results --run-crosscheck` runs both). Target: P90 TTFT and P90 TPOT within 15%.\n",
        FIT_ARGS.join(" "),
        CROSSCHECK_ARGS.join(" ")
    );
    let text = match std::fs::read_to_string(result) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let _ = writeln!(
                md,
                "Not measured: `{}` is absent (run `paper_results --run-crosscheck`).",
                result.display()
            );
            return Ok(Vec::new());
        }
        Err(e) => return Err(BenchError::io(format!("read {}", result.display()))(e)),
    };
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Experiment(format!("{}: {e}", result.display())))?;
    let rows = rows(&v).ok_or_else(|| {
        BenchError::Experiment(format!(
            "{}: not a live sim_crosscheck result",
            result.display()
        ))
    })?;
    let c = &v["config"];
    let _ = writeln!(
        md,
        "Measured {} on {} (profile `{}`, {} requests of `{}`, {} KV blocks per worker, steps of {} tokens), from `{}`:\n",
        v["written_unix_s"]
            .as_u64()
            .map_or_else(|| "(date not recorded)".to_owned(), utc_date),
        v["cpu"].as_str().unwrap_or("(CPU not recorded)"),
        c["profile"].as_str().unwrap_or("?"),
        c["requests"],
        c["workload"].as_str().unwrap_or("?"),
        c["total_blocks"],
        c["max_batched_tokens"],
        result.display()
    );
    md.push_str(
        "| split | P90 TTFT sim / live | diff | P90 TPOT sim / live | diff | within 15% |\n|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {:.1} / {:.1} ms | {:+.1}% | {:.1} / {:.1} ms | {:+.1}% | {} |",
            r.split,
            r.p90_ttft_ms[0],
            r.p90_ttft_ms[1],
            100.0 * r.ttft_diff,
            r.p90_tpot_ms[0],
            r.p90_tpot_ms[1],
            100.0 * r.tpot_diff,
            if r.within { "yes" } else { "**no**" }
        );
    }
    Ok(rows)
}

/// `YYYY-MM-DD` (UTC) of a Unix time.
fn utc_date(unix_s: u64) -> String {
    let mut date = rfc3339(unix_s);
    date.truncate("YYYY-MM-DD".len());
    date
}

/// The rows of a live cross-check, `None` if any split lacks its live side.
fn rows(v: &Value) -> Option<Vec<CrosscheckRow>> {
    v["splits"]
        .as_array()?
        .iter()
        .map(|s| {
            let p90 = |side: &str, metric: &str| s[side][metric]["p90"].as_f64();
            Some(CrosscheckRow {
                split: s["split"].as_str()?.to_owned(),
                p90_ttft_ms: [p90("sim", "ttft")?, p90("live", "ttft")?],
                ttft_diff: s["diff"]["p90_ttft"].as_f64()?,
                p90_tpot_ms: [p90("sim", "tpot")?, p90("live", "tpot")?],
                tpot_diff: s["diff"]["p90_tpot"].as_f64()?,
                within: s["diff"]["within_tolerance"].as_bool()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_result_becomes_a_table_and_an_absent_one_says_how_to_make_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("x.json");
        let mut md = String::new();
        assert!(
            crosscheck_section(&path, &mut md)
                .expect("absent")
                .is_empty()
        );
        assert!(md.contains("--run-crosscheck"), "{md}");
        let split = |name: &str, within: bool| {
            serde_json::json!({
                "split": name,
                "sim": {"ttft": {"p90": 100.0}, "tpot": {"p90": 40.0}},
                "live": {"ttft": {"p90": 110.0}, "tpot": {"p90": 38.0}},
                "diff": {"p90_ttft": 0.1, "p90_tpot": -0.05, "within_tolerance": within},
            })
        };
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(1_796_342_400), "2026-12-04");
        let v = serde_json::json!({
            "cpu": "AMD EPYC",
            "written_unix_s": 1_796_342_400u64,
            "config": {"profile": "p", "requests": 60, "workload": "w", "total_blocks": 728,
                       "max_batched_tokens": 256},
            "splits": [split("1p1d", true), split("1p2d", false)],
        });
        std::fs::write(&path, v.to_string()).expect("write");
        let mut md = String::new();
        let rows = crosscheck_section(&path, &mut md).expect("read");
        assert_eq!(rows.len(), 2);
        assert!(
            md.contains("| 1p1d | 100.0 / 110.0 ms | +10.0% | 40.0 / 38.0 ms | -5.0% | yes |"),
            "{md}"
        );
        assert!(md.contains("**no**"));
        assert!(md.contains("Measured 2026-12-04 on AMD EPYC"), "{md}");
        // A simulator-only run has no live side: refused, not rendered as zeros.
        std::fs::write(
            &path,
            r#"{"splits":[{"split":"1p1d","sim":{},"live":null}]}"#,
        )
        .expect("w");
        assert!(crosscheck_section(&path, &mut String::new()).is_err());
    }
}

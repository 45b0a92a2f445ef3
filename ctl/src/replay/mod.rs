//! `dolphinctl replay`: send a workload (a trace or a synthetic mix, under trace, Poisson or
//! closed-loop arrivals) to the live router or to the cluster simulator, and report latency
//! percentiles, SLO attainment (overall, per routing-table cluster, per request kind) and
//! throughput, as a table, a JSON document and PNG charts.
//!
//! The drivers are library functions, so `dolphinctl learn` can measure a period with them:
//! [`replay_live`] (async, over gRPC) and [`replay_sim`] (in-process, simulated time). Both
//! return every request's [`RequestOutcome`] with the router's features, so a table can be
//! fitted from a replay.

mod args;
mod charts;
pub mod duration;
mod error;
mod live;
mod progress;
mod report;
mod sim;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::io::Write;

use dolphin_workload::{RequestOutcome, Summary};

pub use args::{ConfigRecord, ReplayArgs, ReplayPlan, Target, TargetPlan};
pub use charts::{CHARTS, write_charts};
pub use duration::{DurationError, parse_duration};
pub use error::ReplayError;
pub use live::{FAIL_FAST_AFTER, LiveConfig, replay_live};
pub use report::{JsonReport, render as render_report, write_json};
pub use sim::{
    DEFAULT_SIM_PROFILE, DEFAULT_TOTAL_BLOCKS, SimTargetConfig, load_classifier, load_table,
    replay_sim, router_policy,
};

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayRun {
    /// Every request sent (all of the workload unless the replay stopped early), in workload
    /// order, judged against the SLO.
    pub outcomes: Vec<RequestOutcome>,
    /// Failed requests by gRPC status code (`Unavailable`, `ResourceExhausted`, ...; `NoTokens`
    /// for a stream that ended without output, `FinishError` for one that ended in error).
    pub failures: BTreeMap<String, u64>,
    /// Wall-clock time the replay took, ms (the simulator's run time for `--target sim`).
    pub wall_ms: f64,
}

/// Says on stderr how many trace rows were left out (empty prompts), if any.
pub(crate) fn warn_skipped(w: &dolphin_workload::Workload) {
    if w.skipped_rows > 0 {
        eprintln!(
            "dolphinctl: warning: {} rows of {} have an empty prompt and are left out ({} kept)",
            w.skipped_rows,
            w.name,
            w.requests.len()
        );
    }
}

/// Runs `dolphinctl replay`: validates the arguments, loads the workload, replays it, prints the
/// report to `out` and writes the JSON and the charts if asked.
pub async fn run(args: &ReplayArgs, out: &mut impl Write) -> Result<(), ReplayError> {
    let plan = args.plan()?;
    for w in &plan.warnings {
        eprintln!("dolphinctl: warning: {w}");
    }
    prepare_outputs(&plan)?;
    let workload = plan.spec.load()?;
    warn_skipped(&workload);
    let run = match &plan.target {
        TargetPlan::Live(cfg) => replay_live(cfg, &workload, plan.arrivals, plan.slo).await?,
        TargetPlan::Sim(cfg) => replay_sim(cfg, &workload, plan.arrivals, plan.slo)?,
    };
    let summary = Summary::of(&run.outcomes);
    out.write_all(render_report(&plan.record, &summary, &run.failures).as_bytes())
        .map_err(ReplayError::Output)?;
    if let Some(path) = &plan.json {
        let report = JsonReport {
            config: &plan.record,
            summary: &summary,
            failures: &run.failures,
            outcomes: &run.outcomes,
        };
        write_json(path, &report)?;
        writeln!(out, "wrote {}", path.display()).map_err(ReplayError::Output)?;
    }
    if let Some(dir) = &plan.plots {
        let mut skipped = Vec::new();
        let written = write_charts(dir, &run.outcomes, &summary, &mut skipped)?;
        for s in skipped {
            eprintln!("dolphinctl: warning: chart skipped: {s}");
        }
        for path in written {
            writeln!(out, "wrote {}", path.display()).map_err(ReplayError::Output)?;
        }
    }
    Ok(())
}

/// Creates the JSON report's directory and the charts' directory before the replay, so a bad
/// path fails in a second rather than after a long replay.
fn prepare_outputs(plan: &ReplayPlan) -> Result<(), ReplayError> {
    let json_dir = plan
        .json
        .as_deref()
        .and_then(std::path::Path::parent)
        .filter(|d| !d.as_os_str().is_empty());
    for dir in json_dir.into_iter().chain(plan.plots.as_deref()) {
        std::fs::create_dir_all(dir).map_err(|source| ReplayError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

//! Traffic that differs from the training traffic (issue 14 item 9): a table learned on one
//! workload serving another, with and without the router's trust checks (a cluster's evidence,
//! a request's distance from its cluster), against Dynamo 1.6 on the same traffic.

use std::fmt::Write as _;

use dolphin_learn::search::SearchConfig;
use dolphin_router::dolphin::table::ClusterMethod;
use dolphin_router::dolphin::{CompiledTable, Distrust, RoutingTable, TrustConfig};
use dolphin_router::policy::{DecidedBy, DolphinConfig, Features, Policy, PoolState};
use dolphin_router::route::{TableRef, decide};
use dolphin_workload::{RequestOutcome, Summary, Workload};
use serde::Serialize;

use super::{Baseline, Setup, learn, learn_err, run_baseline};
use crate::BenchError;

/// A workload's training and test samples by name.
pub type Samples<'a> = dyn Fn(&str) -> Result<(Workload, Workload), BenchError> + 'a;

/// One table learned on `train`, serving `serve`.
#[derive(Debug, Serialize)]
pub struct ShiftRow {
    /// The workload the table was learned on.
    pub train: String,
    /// The workload it served.
    pub serve: String,
    /// Dynamo 1.6 on the served traffic.
    pub dynamo: Summary,
    /// The table with every bit taken (`--table-trust-all`).
    pub trust_all: Summary,
    /// The table with the range check alone (any evidence taken).
    pub range_only: Summary,
    /// The table under the router's default trust checks.
    pub checked: Summary,
    /// Share of the served requests the checks routed by the fallback: out of range, and
    /// through a cluster with thin evidence.
    pub out_of_range: f64,
    /// See `out_of_range`.
    pub thin_evidence: f64,
}

/// The served traffic under `table` with `trust`.
fn serve(
    setup: &Setup,
    workload: &Workload,
    table: &RoutingTable,
    trust: TrustConfig,
) -> Result<Vec<RequestOutcome>, BenchError> {
    let compiled = CompiledTable::compile(table.clone())
        .map_err(|e| BenchError::Experiment(format!("table: {e}")))?;
    let mut target = setup.target(workload)?;
    target
        .run(
            Policy::Dolphin(DolphinConfig {
                trust,
                ..DolphinConfig::default()
            }),
            Some(compiled),
        )
        .map_err(learn_err)
}

/// Shares of `outcomes` whose bit `table` distrusts under `trust` (out of range, thin
/// evidence), judged on the features each request was routed on.
fn distrusted(outcomes: &[RequestOutcome], table: &RoutingTable, trust: TrustConfig) -> (f64, f64) {
    let Ok(compiled) = CompiledTable::compile(table.clone()) else {
        return (0.0, 0.0);
    };
    let policy = Policy::Dolphin(DolphinConfig {
        trust,
        ..DolphinConfig::default()
    });
    let table_ref = TableRef {
        table: &compiled,
        version: None,
    };
    let (mut far, mut thin) = (0usize, 0usize);
    for o in outcomes {
        let features = Features {
            isl: o.features[0],
            eff_isl_prefill: o.features[1],
            eff_isl_decode: o.features[2],
            output_len_hint: o.features[3],
        };
        if let Ok(r) = decide(features, PoolState::IDLE, &policy, Some(table_ref), None)
            && let DecidedBy::Distrusted(_, why) = r.decided_by
        {
            match why {
                Distrust::OutOfRange => far += 1,
                Distrust::ThinEvidence => thin += 1,
            }
        }
    }
    let n = outcomes.len().max(1) as f64;
    (far as f64 / n, thin as f64 / n)
}

/// For each `(train, serve)` pair: a table learned on `train`'s training sample (cached per
/// training workload), serving `serve`'s test sample with every bit taken and with the default
/// checks, beside Dynamo 1.6. Appends the table to `md`.
pub fn traffic_shift(
    setup: &Setup,
    pairs: &[(&str, &str)],
    samples: &Samples<'_>,
    md: &mut String,
) -> Result<Vec<ShiftRow>, BenchError> {
    md.push_str("| learned on | serving | Dynamo 1.6 | every bit taken | range check only | default checks | routed by the fallback under the default checks: out of range, thin evidence |\n|---|---|---|---|---|---|---|\n");
    // Per training workload: its table, and the setup with the classifier trained beside it.
    let mut learned: Vec<(String, RoutingTable, Setup)> = Vec::new();
    let mut rows = Vec::new();
    let all = TrustConfig {
        enabled: false,
        ..TrustConfig::default()
    };
    let checked = TrustConfig::default();
    let range_only = TrustConfig {
        min_requests: 0,
        min_margin: -1.0,
        ..checked
    };
    for &(train, serve_name) in pairs {
        let (table, setup) = match learned.iter().find(|(n, ..)| n == train) {
            Some((_, t, s)) => (t.clone(), s.clone()),
            None => {
                let (train_sample, _) = samples(train)?;
                let s = setup.with_classifier_for(train, &train_sample)?;
                let t = learn(
                    &s,
                    &train_sample,
                    &s.fit(train, 8, ClusterMethod::Kmeans, 1),
                    &SearchConfig::new(8),
                )?
                .table;
                learned.push((train.to_owned(), t.clone(), s.clone()));
                (t, s)
            }
        };
        let setup = &setup;
        let (_, served) = samples(serve_name)?;
        let mut target = setup.target(&served)?;
        let dynamo = run_baseline(&mut target, Baseline::Dynamo16)?.summary;
        let trust_all = Summary::of(&serve(setup, &served, &table, all)?);
        let range_summary = Summary::of(&serve(setup, &served, &table, range_only)?);
        let outcomes = serve(setup, &served, &table, checked)?;
        let (out_of_range, thin_evidence) = distrusted(&outcomes, &table, checked);
        let checked_summary = Summary::of(&outcomes);
        let pt = |s: &Summary| {
            format!(
                "{:.3} ({:+.1} pt)",
                s.attainment,
                (s.attainment - dynamo.attainment) * 100.0
            )
        };
        let _ = writeln!(
            md,
            "| {train} | {serve_name} | {:.3} | {} | {} | {} | {:.0}%, {:.0}% |",
            dynamo.attainment,
            pt(&trust_all),
            pt(&range_summary),
            pt(&checked_summary),
            out_of_range * 100.0,
            thin_evidence * 100.0
        );
        rows.push(ShiftRow {
            train: train.to_owned(),
            serve: serve_name.to_owned(),
            dynamo,
            trust_all,
            range_only: range_summary,
            checked: checked_summary,
            out_of_range,
            thin_evidence,
        });
    }
    Ok(rows)
}

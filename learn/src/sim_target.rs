//! Learning against the simulator (`dolphinctl learn --target sim`): replaying a workload on a
//! [`SimCluster`] under a policy, and the [`Evaluator`] that measures a table's bits that way.
//!
//! The simulator is deterministic, so every period replays the same requests and two bit
//! vectors are compared on identical work: the differences the search sees are the table's,
//! not sampling noise. A learned table should then be checked on a held-out workload (another
//! seed), as `docs/results.md` does.

use dolphin_router::dolphin::{CompiledTable, OutputClassifier, RoutingTable};
use dolphin_router::policy::{DolphinConfig, Policy, ThresholdConfig};
use dolphin_sim::{SimCluster, SimClusterConfig, SimReport, SimRequest};
use dolphin_workload::{Arrivals, RequestOutcome, Slo, Workload};

use crate::error::LearnError;
use crate::fit::{FitConfig, FitReport, fit_table};
use crate::measure::{learned_table, period_of, records_from_outcomes, under_measurement};
use crate::search::{Evaluator, Period, Round, SearchConfig, SearchResult, search};

/// A workload bound to a simulated cluster.
#[derive(Debug)]
pub struct SimTarget {
    sim: SimCluster,
    requests: Vec<SimRequest>,
    concurrency: Option<u32>,
    slo: Slo,
}

impl SimTarget {
    /// `workload` under `arrivals` (closed loop, or the arrival times they give), judged
    /// against `slo`, on a cluster of `cfg`.
    pub fn new(
        cfg: SimClusterConfig,
        workload: &Workload,
        arrivals: Arrivals,
        slo: Slo,
    ) -> Result<Self, LearnError> {
        let mut w = workload.clone();
        arrivals.apply(&mut w);
        let requests = SimRequest::from_workload(&w, slo, cfg.block_size);
        let sim = SimCluster::new(cfg).map_err(|e| LearnError::Target(e.to_string()))?;
        Ok(SimTarget {
            sim,
            requests,
            concurrency: arrivals.concurrency(),
            slo,
        })
    }

    /// The SLO requests are judged against.
    pub fn slo(&self) -> Slo {
        self.slo
    }

    /// Every request's `max_tokens`, as the router sees it at admission, becomes its workload's
    /// fixed cap ([`dolphin_workload::RequestKind::max_tokens_cap`], at least the output, so no
    /// answer is cut short), not its true output length. The simulated engines still end each
    /// request at its trace length, which the router never sees.
    pub fn cap_max_tokens(&mut self) {
        self.requests
            .iter_mut()
            .for_each(SimRequest::cap_max_tokens);
    }

    /// The output classifier the simulated router uses.
    pub fn set_classifier(&mut self, classifier: OutputClassifier) {
        self.sim.set_classifier(classifier);
    }

    /// Replays the workload from a cold cluster under `policy` (and `table` for
    /// `Policy::Dolphin`).
    pub fn run(
        &mut self,
        policy: Policy,
        table: Option<CompiledTable>,
    ) -> Result<Vec<RequestOutcome>, LearnError> {
        Ok(self.run_report(policy, table)?.outcomes())
    }

    /// [`run`](Self::run), with the simulator's whole report (per-request records, and what
    /// the online learner did).
    pub fn run_report(
        &mut self,
        policy: Policy,
        table: Option<CompiledTable>,
    ) -> Result<SimReport, LearnError> {
        self.sim.set_policy(policy, table);
        match self.concurrency {
            Some(c) => self.sim.run_closed(&self.requests, c),
            None => self.sim.run(&self.requests),
        }
        .map_err(|e| LearnError::Target(e.to_string()))
    }
}

/// Measures bits by simulating the whole workload with `table`'s clusters and those bits.
#[derive(Debug)]
pub struct SimEvaluator<'a> {
    target: &'a mut SimTarget,
    table: RoutingTable,
}

impl<'a> SimEvaluator<'a> {
    /// An evaluator of `table`'s clustering (its bits are replaced each period).
    pub fn new(target: &'a mut SimTarget, table: RoutingTable) -> Self {
        SimEvaluator { target, table }
    }
}

impl Evaluator for SimEvaluator<'_> {
    fn evaluate(&mut self, bits: &[u8]) -> Result<Period, LearnError> {
        let table = under_measurement(&self.table, bits);
        let k = table.k;
        let compiled = CompiledTable::compile(table)?;
        let outcomes = self
            .target
            .run(Policy::Dolphin(DolphinConfig::default()), Some(compiled))?;
        Ok(period_of(&outcomes, k, self.table.provenance.reward))
    }
}

/// What [`learn_on_sim`] produced.
#[derive(Clone, Debug)]
pub struct SimLearned {
    /// The table with its learned bits and provenance.
    pub table: RoutingTable,
    /// How the fitted clusters were populated and what the Dynamo rule did in them.
    pub fit: FitReport,
    /// The search's rounds and result.
    pub search: SearchResult,
}

/// The whole learning procedure on the simulator: gather the four features by replaying the
/// workload under the Dynamo 1.6 rule, fit the standardizer and clusters (`fit`; its initial
/// bits are the rule's majority per cluster unless `fit.bits` says otherwise), then learn the
/// bits by measurement (`search`). `resume` and `on_round` are passed to
/// [`search`](crate::search::search).
pub fn learn_on_sim(
    target: &mut SimTarget,
    fit: &FitConfig,
    search_cfg: &SearchConfig,
    resume: &[Round],
    on_round: &mut dyn FnMut(&Round),
) -> Result<SimLearned, LearnError> {
    let gathered = target.run(Policy::Threshold(ThresholdConfig::default()), None)?;
    let report = fit_table(&records_from_outcomes(&gathered), fit)?;
    let mut eval = SimEvaluator::new(target, report.table.clone());
    let result = search(&report.table.bits, search_cfg, &mut eval, resume, on_round)?;
    let how = format!(
        "simulator, {} {}, scan {}, epsilon {}",
        fit.method.as_str(),
        fit.k,
        search_cfg.scan,
        search_cfg.epsilon
    );
    Ok(SimLearned {
        table: learned_table(report.table.clone(), &result, &how),
        fit: report,
        search: result,
    })
}

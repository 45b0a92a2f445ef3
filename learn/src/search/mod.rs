//! Learning a table's bits by measurement (DESIGN.md section 1).
//!
//! An [`Evaluator`] runs the serving system (live or simulated) for one period with given bits
//! and reports, per cluster, how many requests arrived and how many met their end-to-end SLO.
//! [`search`] first scans each cluster (local for a period, then remote, the others held fixed:
//! 2K rounds), then refines the whole table epsilon-greedily, because clusters share workers and
//! caches and a cluster's best bit can depend on the others'.
//!
//! Every round is a [`Round`], one JSON line in a learning log. A search is deterministic given
//! its configuration, the initial bits and the measurements: the random choices of round `n`
//! come from a generator seeded by `(seed, n)`, so a search resumed from a log
//! ([`search`]'s `resume`) makes exactly the choices the interrupted one would have made.

mod learner;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::error::LearnError;
use learner::Learner;

/// Measures one period with the given bits.
pub trait Evaluator {
    /// Serves for one period with `bits` (K of them, 0 local / 1 remote) and reports it.
    fn evaluate(&mut self, bits: &[u8]) -> Result<Period, LearnError>;
}

/// What one measured period gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Period {
    /// Per cluster (K entries): requests completed in the period, and how many met their SLO.
    pub per_cluster: Vec<(u64 /* requests */, u64 /* met */)>,
    /// Per cluster: of those, requests the router sent remote that their decode worker
    /// prefilled itself because it held the prompt (the bit did not decide their path); empty
    /// when the evaluator does not know.
    pub per_cluster_held: Vec<u64>,
    /// Share of all the period's requests that met their SLO, in [0, 1].
    pub attainment: f64,
    /// P90 time to first token, milliseconds.
    pub p90_ttft_ms: f64,
    /// P90 time per output token, milliseconds.
    pub p90_tpot_ms: f64,
}

/// How to search.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchConfig {
    /// Number of clusters K.
    pub k: usize,
    /// Scan each cluster first (2K rounds); without it refinement starts right after round 0.
    pub scan: bool,
    /// Probability that a cluster takes the other bit than its best-known one, in the first
    /// refinement round; in [0, 1].
    pub epsilon: f64,
    /// Factor applied to epsilon after each refinement round, in [0, 1].
    pub epsilon_decay: f64,
    /// Most rounds in all, round 0 and the scan included (at least 1).
    pub max_rounds: u32,
    /// Stop after this many refinement rounds in a row without improvement.
    pub patience: u32,
    /// Seed of the random choices.
    pub seed: u64,
}

impl SearchConfig {
    /// The defaults for `k` clusters: scan, epsilon 0.2 decaying by 0.9 per refinement round,
    /// at most 60 rounds, patience 8, seed 1.
    pub fn new(k: usize) -> Self {
        SearchConfig {
            k,
            scan: true,
            epsilon: 0.2,
            epsilon_decay: 0.9,
            max_rounds: 60,
            patience: 8,
            seed: 1,
        }
    }

    fn validate(&self) -> Result<(), LearnError> {
        let bad = |m: String| Err(LearnError::Invalid(m));
        if self.k == 0 {
            return bad("the search needs at least one cluster".into());
        }
        if !(0.0..=1.0).contains(&self.epsilon) {
            return bad(format!("epsilon must be in [0, 1], got {}", self.epsilon));
        }
        if !(0.0..=1.0).contains(&self.epsilon_decay) {
            return bad(format!(
                "epsilon_decay must be in [0, 1], got {}",
                self.epsilon_decay
            ));
        }
        if self.max_rounds == 0 {
            return bad("max_rounds must be at least 1 (round 0 measures the initial bits)".into());
        }
        Ok(())
    }
}

/// What a round measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Phase {
    /// Scanning `cluster` with `bit`, the others held at the scan's table.
    Scan {
        /// The cluster scanned.
        cluster: usize,
        /// The bit it had this round.
        bit: u8,
    },
    /// A whole-table measurement: round 0 (the initial bits) and every refinement round.
    Refine,
}

/// One round of a search: what was measured and where the search stood after it. One JSON line
/// per round in a learning log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Round {
    /// Round number, from 0.
    pub round: u32,
    /// Scan or refinement.
    pub phase: Phase,
    /// The bits measured.
    pub bits: Vec<u8>,
    /// Per cluster: requests and requests that met the SLO. Not in the contract's first
    /// sketch, but needed: refinement weighs rewards by requests, and a resumed search must
    /// rebuild exactly the statistics the interrupted one had.
    #[serde(default)]
    pub per_cluster: Vec<(u64, u64)>,
    /// Per cluster: requests sent remote that their decode worker held (see
    /// [`Period::per_cluster_held`]; absent in logs written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_cluster_held: Vec<u64>,
    /// Per cluster: share of its requests that met the SLO (`None`: no requests).
    pub per_cluster_reward: Vec<Option<f64>>,
    /// Overall attainment of the period.
    pub attainment: f64,
    /// P90 TTFT of the period, milliseconds.
    pub p90_ttft_ms: f64,
    /// P90 TPOT of the period, milliseconds.
    pub p90_tpot_ms: f64,
    /// The best bits measured so far (this round included).
    pub best_bits: Vec<u8>,
    /// Their attainment (the mean, when the best table was measured more than once).
    pub best_attainment: f64,
    /// Whether this round's table became the best (a new table, not a re-measurement).
    pub improved: bool,
}

/// What a search found.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchResult {
    /// The best bits measured.
    pub bits: Vec<u8>,
    /// Their overall attainment (mean of their measurements).
    pub attainment: f64,
    /// Rounds run (resumed ones included).
    pub rounds: u32,
    /// The round that first measured `bits` (what ablations compare).
    pub converged_round: u32,
    /// Every round, resumed ones included.
    pub history: Vec<Round>,
}

/// Reward of each cluster: met / requests, `None` without requests.
pub fn rewards(per_cluster: &[(u64, u64)]) -> Vec<Option<f64>> {
    per_cluster
        .iter()
        .map(|&(n, met)| (n > 0).then(|| met as f64 / n as f64))
        .collect()
}

/// Scan (2K rounds: cluster c local then remote, others held fixed, keep the better
/// by c's reward), then epsilon-greedy refinement of the whole table (each cluster flips with
/// probability epsilon, otherwise takes its best-known bit), until `patience` rounds without
/// improvement of overall attainment or `max_rounds`. `resume` replays logged rounds without
/// measuring them again; `on_round` sees each new round (for logging). Round 0 measures the
/// initial bits.
///
/// Details:
/// - scan: the other clusters are held at the scan's table, which starts as the initial bits
///   and takes each cluster's kept bit once it is scanned; ties, and a cluster without requests
///   in either period, keep the bit it had;
/// - the best is the measured table with the highest overall attainment (another table must beat
///   it by more than 1e-9); scan rounds count too; a scan round that measures the best table
///   again averages into its attainment and is no improvement;
/// - refinement: a cluster's best-known bit is the one with the higher requests-weighted reward
///   over every period measured so far (unknown or tied: its bit in the best table); a round
///   that would measure the best table again flips one random cluster instead;
/// - `resume` must come from a search with the same configuration and initial bits: each logged
///   round must measure what this search would measure, else [`LearnError::Resume`].
pub fn search(
    initial: &[u8],
    cfg: &SearchConfig,
    eval: &mut dyn Evaluator,
    resume: &[Round],
    on_round: &mut dyn FnMut(&Round),
) -> Result<SearchResult, LearnError> {
    cfg.validate()?;
    if initial.len() != cfg.k {
        return Err(LearnError::KMismatch {
            what: "the initial bits".into(),
            expected: cfg.k,
            found: initial.len(),
        });
    }
    if let Some((i, b)) = initial.iter().enumerate().find(|(_, b)| **b > 1) {
        return Err(LearnError::Invalid(format!(
            "initial bit {i} is {b}; bits are 0 (local) or 1 (remote)"
        )));
    }
    let mut learner = Learner::new(initial, cfg.clone());
    let mut history = Vec::new();
    let mut logged = resume.iter();
    while let Some((phase, bits)) = learner.plan() {
        let (period, new) = match logged.next() {
            Some(r) => (
                replayed(r, learner.next_round(), phase, &bits, cfg.k)?,
                false,
            ),
            None => {
                let p = eval.evaluate(&bits)?;
                check_period(&p, cfg.k)?;
                (p, true)
            }
        };
        let round = learner.record(phase, bits, &period);
        if new {
            on_round(&round);
        }
        history.push(round);
    }
    if logged.len() > 0 {
        return Err(LearnError::Resume(format!(
            "the log has {} rounds but this search stops after {}",
            resume.len(),
            history.len()
        )));
    }
    Ok(SearchResult {
        bits: learner.best_bits().to_vec(),
        attainment: learner.best_attainment(),
        rounds: history.len() as u32,
        converged_round: learner.converged_round(),
        history,
    })
}

/// The period a logged round measured, after checking that it is the round this search would
/// run now.
fn replayed(
    r: &Round,
    round: u32,
    phase: Phase,
    bits: &[u8],
    k: usize,
) -> Result<Period, LearnError> {
    let fail = |m: String| LearnError::Resume(format!("logged round {}: {m}", r.round));
    if r.round != round {
        return Err(fail(format!("expected round {round} here")));
    }
    if r.bits.len() != k || r.per_cluster.len() != k {
        return Err(fail(format!(
            "{} bits and {} per-cluster counts for K = {k}",
            r.bits.len(),
            r.per_cluster.len()
        )));
    }
    if r.phase != phase || r.bits != bits {
        return Err(fail(format!(
            "measured {:?} {:?}, but this search would measure {phase:?} {bits:?} \
             (another configuration or other initial bits?)",
            r.phase, r.bits
        )));
    }
    let p = Period {
        per_cluster: r.per_cluster.clone(),
        per_cluster_held: r.per_cluster_held.clone(),
        attainment: r.attainment,
        p90_ttft_ms: r.p90_ttft_ms,
        p90_tpot_ms: r.p90_tpot_ms,
    };
    check_period(&p, k).map_err(|e| fail(e.to_string()))?;
    Ok(p)
}

/// A period must have K clusters, consistent counts and finite numbers.
fn check_period(p: &Period, k: usize) -> Result<(), LearnError> {
    if p.per_cluster.len() != k {
        return Err(LearnError::KMismatch {
            what: "the evaluator's period".into(),
            expected: k,
            found: p.per_cluster.len(),
        });
    }
    if let Some((c, (n, met))) = p.per_cluster.iter().enumerate().find(|(_, (n, m))| m > n) {
        return Err(LearnError::Invalid(format!(
            "cluster {c} has {met} requests meeting the SLO out of {n}"
        )));
    }
    if !p.per_cluster_held.is_empty()
        && (p.per_cluster_held.len() != k
            || p.per_cluster_held
                .iter()
                .zip(&p.per_cluster)
                .any(|(h, (n, _))| h > n))
    {
        return Err(LearnError::Invalid(format!(
            "held requests per cluster {:?} do not fit the requests {:?}",
            p.per_cluster_held, p.per_cluster
        )));
    }
    if !(0.0..=1.0).contains(&p.attainment) {
        return Err(LearnError::Invalid(format!(
            "period attainment {} is not in [0, 1]",
            p.attainment
        )));
    }
    for (name, v) in [("P90 TTFT", p.p90_ttft_ms), ("P90 TPOT", p.p90_tpot_ms)] {
        if !v.is_finite() {
            return Err(LearnError::Invalid(format!(
                "period {name} is {v} (a period without requests?)"
            )));
        }
    }
    Ok(())
}

//! Delayed-batching plans for a two-subserver decode worker (TokenRouter, NeurIPS 2026).
//!
//! # The model
//!
//! A decode worker hosts two subservers: index `0` is the small model, `1` the large one. Each is
//! an independent engine loop that steps a batch of the requests currently *ready* on it. The
//! worker serves a closed system of `C` concurrent requests (the concurrency): a finished request
//! is replaced at once, so exactly `C` requests are always in the system, each at exactly one
//! subserver.
//!
//! After each step of subserver `i`, every request of that step independently hands off to the
//! other subserver with probability `h[i]` (so the spans a request spends on a subserver are
//! geometric), otherwise it stays ready on `i`. Every request of a completed step writes one
//! token, except that a handoff from `i` with `drop[i] = true` discards it: the small model hands
//! an uncertain token to the large one, which rewrites that position. A handoff with
//! `drop[i] = false` keeps its token.
//!
//! **Delayed batching** with thresholds `B = [B0, B1]`: an idle subserver `i` starts a step only
//! when it has at least `B[i]` ready requests, or when it has at least one and has been waiting
//! (idle with a ready request) for at least `W[i]` ticks, the bound that keeps a lone request
//! from being stuck. `B[i] = 1` starts as soon as anything is ready. A starting step takes every
//! ready request, up to `max_batch[i]` when one is given (a threshold above that cap is lowered
//! to the cap). A step of batch `k` on `i` lasts `step_ms_i(k)`, from a measured [`StepProfile`].
//!
//! # The chain
//!
//! Time is discretized into ticks of `tick_ms`; a step lasts `max(1, round(step_ms / tick_ms))`
//! ticks and the wait bound is `max(1, ceil(max_wait_ms / tick_ms))` ticks. The state after a
//! tick is `(q0, k0, r0, a0, k1, r1, a1)`: `q_i` requests ready at `i`, `k_i` the batch of `i`'s
//! step in flight (`0` when idle), `r_i` the ticks that step still needs, `a_i` the ticks `i` has
//! waited idle with a ready request (capped at `W[i]`); `q1 = C - q0 - k0 - k1`. Each tick:
//!
//! 1. every running subserver counts `r` down; those reaching zero complete, subserver `0` first
//!    and then `1` (the same order in the exact solver and the simulator): a binomial number of
//!    the `k` requests hands off to the other subserver's queue, the rest return to the own
//!    queue, and the step's tokens are written;
//! 2. every idle subserver meeting the start rule starts a step with its ready requests; one
//!    that does not start counts its wait up (if it has a ready request) or resets it.
//!
//! [`predict`] enumerates the states reachable from "all `C` requests ready on the small model,
//! both idle", solves the stationary distribution by Gauss-Seidel sweeps (lazy power iteration as fallback) and reports the
//! steady-state throughput and per-subserver statistics. [`simulate`] runs the very same chain by
//! Monte Carlo, and [`plan`] searches the thresholds for the best throughput.
//!
//! # Assumptions
//!
//! - Decode only: prefill is not in the chain, and requests have no lengths: a finished request's
//!   replacement is taken to continue where the finished one stood, so prefill time, first-token
//!   placement and request lengths do not enter the throughput.
//! - A handoff is instantaneous: the cost of the receiving model catching up on the tokens it has
//!   not seen is assumed folded into the measured step times.
//! - Closed system: the concurrency is constant.
//! - `B[i]` above the batch cap (or above `C`) acts as the cap (or `C`): the threshold can never
//!   exceed what one step can take.
//! - Step times depend on the batch size only (not on context lengths).

use std::collections::HashMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Most reachable states [`predict`] enumerates before giving up with
/// [`PlanError::TooManyStates`].
pub const MAX_STATES: usize = 2_000_000;

/// Most stored transitions [`predict`] keeps before giving up with
/// [`PlanError::TooManyTransitions`].
pub const MAX_TRANSITIONS: usize = 40_000_000;

/// Largest concurrency a [`ChainSpec`] may ask for (bounds the binomial tables).
pub const MAX_CONCURRENCY: u32 = 2048;

/// The solver stops once a sweep changes the distribution by less than this (L1).
pub const TOLERANCE: f64 = 1e-12;

/// Power iterations tried before [`PlanError::NoConvergence`] (Gauss-Seidel gets a tenth of
/// them before it falls back to power iteration).
pub const MAX_ITERATIONS: u32 = 200_000;

/// Share of the old distribution kept each power iteration (`x = L x + (1 - L) x P`), which makes
/// the iterated chain aperiodic: deterministic step durations make the plain chain periodic.
const LAZINESS: f64 = 0.5;

/// Relative throughput difference under which [`plan`] treats two candidates as tied.
const TIE_TOLERANCE: f64 = 1e-9;

/// The two subserver indices, in the deterministic order completions are processed.
const SUBSERVERS: [usize; 2] = [0, 1];

/// The handoff distribution of a subserver that does not complete this tick: nobody moves.
static NOBODY_MOVES: [f64; 1] = [1.0];

/// Measured duration of one decode step as a function of the batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepProfile {
    /// `step_ms[k - 1]` is the duration, in milliseconds, of a decode step with batch `k`.
    pub step_ms: Vec<f64>,
}

impl StepProfile {
    /// A profile from its per-batch step times (`step_ms[k - 1]` for batch `k`).
    pub fn new(step_ms: Vec<f64>) -> Self {
        Self { step_ms }
    }

    /// Duration in milliseconds of a step with `batch` requests. Beyond the table the duration is
    /// extrapolated linearly from its last two entries (constant for a one-entry table) and
    /// clamped at zero; batch `0` and an empty table give `0`.
    pub fn at(&self, batch: u32) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        if let Some(&ms) = self.step_ms.get(batch as usize - 1) {
            return ms;
        }
        match *self.step_ms.as_slice() {
            [] => 0.0,
            [only] => only,
            [.., prev, last] => {
                let beyond = f64::from(batch) - self.step_ms.len() as f64;
                (last + beyond * (last - prev)).max(0.0)
            }
        }
    }

    /// Checks that the table is non-empty and every entry is finite and positive.
    fn validate(&self, subserver: usize) -> Result<(), PlanError> {
        if self.step_ms.is_empty() {
            return Err(invalid(format!(
                "subserver {subserver}: the step profile is empty"
            )));
        }
        match self.step_ms.iter().position(|&ms| !positive_finite(ms)) {
            Some(k) => Err(invalid(format!(
                "subserver {subserver}: step_ms[{k}] = {} is not a positive finite duration",
                self.step_ms[k]
            ))),
            None => Ok(()),
        }
    }
}

/// Everything the chain needs about a worker, except the batching thresholds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChainSpec {
    /// Concurrent requests in the closed system (at least 1, at most [`MAX_CONCURRENCY`]).
    pub concurrency: u32,
    /// Step times of the small (`0`) and large (`1`) subserver.
    pub profiles: [StepProfile; 2],
    /// Probability that a request of a completed step of subserver `i` hands off to the other.
    pub handoff: [f64; 2],
    /// Whether a handoff from subserver `i` discards the token that step wrote for the request.
    pub drop_on_handoff: [bool; 2],
    /// Wait bound `W[i]` in milliseconds: an idle subserver with a ready request starts after
    /// waiting this long even below its threshold (converted to ticks, rounded up, at least 1).
    pub max_wait_ms: [f64; 2],
    /// Largest batch subserver `i` steps at once (`None`: no cap beyond the concurrency).
    pub max_batch: [Option<u32>; 2],
    /// Length of one tick of the discrete-time chain, in milliseconds.
    pub tick_ms: f64,
}

impl ChainSpec {
    /// A sensible tick: a quarter of the smallest one-request step time over both subservers.
    /// Returns `0` (which the solvers reject) when a profile is empty.
    pub fn auto_tick(&self) -> f64 {
        let fastest = self.profiles[0].at(1).min(self.profiles[1].at(1));
        fastest / 4.0
    }

    /// This spec with `tick_ms` set to [`ChainSpec::auto_tick`].
    pub fn with_auto_tick(mut self) -> Self {
        self.tick_ms = self.auto_tick();
        self
    }

    /// Checks the spec: concurrency in `1..=MAX_CONCURRENCY`, a positive finite tick, non-empty
    /// positive profiles, handoff probabilities in `[0, 1]`, non-negative finite wait bounds and
    /// non-zero batch caps.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.concurrency == 0 {
            return Err(invalid("concurrency must be at least 1".to_owned()));
        }
        if self.concurrency > MAX_CONCURRENCY {
            return Err(invalid(format!(
                "concurrency {} is above the supported {MAX_CONCURRENCY}",
                self.concurrency
            )));
        }
        if !positive_finite(self.tick_ms) {
            return Err(invalid(format!(
                "tick_ms = {} must be positive and finite",
                self.tick_ms
            )));
        }
        for i in SUBSERVERS {
            self.validate_subserver(i)?;
        }
        Ok(())
    }

    /// Checks the per-subserver fields of subserver `i`.
    fn validate_subserver(&self, i: usize) -> Result<(), PlanError> {
        self.profiles[i].validate(i)?;
        let h = self.handoff[i];
        if !(0.0..=1.0).contains(&h) {
            return Err(invalid(format!(
                "subserver {i}: handoff probability {h} is outside [0, 1]"
            )));
        }
        let wait = self.max_wait_ms[i];
        if !non_negative_finite(wait) {
            return Err(invalid(format!(
                "subserver {i}: max_wait_ms = {wait} must be non-negative and finite"
            )));
        }
        if self.max_batch[i] == Some(0) {
            return Err(invalid(format!(
                "subserver {i}: max_batch must be at least 1"
            )));
        }
        Ok(())
    }
}

/// Steady-state prediction of the chain for one pair of batching thresholds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// The thresholds `[B0, B1]` this prediction is for.
    pub batch_wait: [u32; 2],
    /// Tokens written per second by the whole worker.
    pub tokens_per_s: f64,
    /// Share of the written tokens each subserver writes (both `0` when nothing is written).
    pub token_share: [f64; 2],
    /// Mean batch size of the steps each subserver runs (`0` for one that never steps).
    pub mean_batch: [f64; 2],
    /// Share of ticks each subserver has a step in flight.
    pub utilization: [f64; 2],
    /// Reachable states of the chain.
    pub states: usize,
    /// Sweeps (Gauss-Seidel, or power iterations on fallback) the stationary distribution took.
    pub iterations: u32,
}

/// The result of [`plan`]: the best thresholds and every candidate tried.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The candidate with the highest throughput (ties go to the smaller thresholds).
    pub best: Prediction,
    /// Every `(B0, B1)` tried, `B0` major, `B1` minor, both ascending.
    pub candidates: Vec<Prediction>,
}

/// Why a prediction, plan or simulation could not be made.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum PlanError {
    /// The spec or the thresholds are not valid.
    #[error("invalid chain spec: {0}")]
    InvalidSpec(String),
    /// The reachable state space is too large to enumerate.
    #[error(
        "the chain has more than {limit} reachable states at tick_ms = {tick_ms}; \
         raise tick_ms (ChainSpec::auto_tick is a sensible default) or lower the concurrency"
    )]
    TooManyStates {
        /// The state cap that was exceeded.
        limit: usize,
        /// The tick length the chain was built with.
        tick_ms: f64,
    },
    /// The chain has too many transitions to store.
    #[error(
        "the chain has more than {limit} transitions at tick_ms = {tick_ms}; \
         raise tick_ms, lower the concurrency or cap the batch sizes"
    )]
    TooManyTransitions {
        /// The transition cap that was exceeded.
        limit: usize,
        /// The tick length the chain was built with.
        tick_ms: f64,
    },
    /// Neither Gauss-Seidel nor power iteration reached [`TOLERANCE`].
    #[error(
        "the stationary distribution did not converge in {iterations} iterations (last L1 change {residual:e})"
    )]
    NoConvergence {
        /// Iterations run.
        iterations: u32,
        /// L1 change of the last iteration.
        residual: f64,
    },
}

/// Predicts the steady state of the chain with thresholds `batch_wait = [B0, B1]` (each at
/// least 1) by enumerating its reachable states and solving the stationary distribution.
pub fn predict(spec: &ChainSpec, batch_wait: [u32; 2]) -> Result<Prediction, PlanError> {
    let chain = Chain::new(spec, batch_wait)?;
    let sparse = reachable(&chain, MAX_STATES, MAX_TRANSITIONS)?;
    let (stationary, iterations) = stationary(&sparse)?;
    Ok(summarize(&chain, &sparse.states, &stationary, iterations))
}

/// Tries every `(B0, B1)` in `1..=min(max_b, concurrency)` and picks the highest throughput;
/// among candidates tied with it, the one with the smallest `B0 + B1`, then the smallest `B0`.
pub fn plan(spec: &ChainSpec, max_b: u32) -> Result<Plan, PlanError> {
    spec.validate()?;
    if max_b == 0 {
        return Err(invalid("max_b must be at least 1".to_owned()));
    }
    let top = max_b.min(spec.concurrency);
    let mut candidates = Vec::with_capacity((top as usize) * (top as usize));
    for b0 in 1..=top {
        for b1 in 1..=top {
            candidates.push(predict(spec, [b0, b1])?);
        }
    }
    let best = pick_best(&candidates)
        .expect("at least one candidate: max_b and the concurrency are at least 1")
        .clone();
    Ok(Plan { best, candidates })
}

/// Runs the same chain as [`predict`] by Monte Carlo for `ticks` ticks from the same start and
/// returns the tokens written per second, after discarding a warm-up of `ticks / 10` ticks.
pub fn simulate(
    spec: &ChainSpec,
    batch_wait: [u32; 2],
    ticks: u64,
    seed: u64,
) -> Result<f64, PlanError> {
    if ticks == 0 {
        return Err(invalid("simulate needs at least one tick".to_owned()));
    }
    let chain = Chain::new(spec, batch_wait)?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let warm_up = ticks / 10;
    let mut state = chain.initial();
    let mut written: u64 = 0;
    for tick in 0..ticks {
        let (next, tokens) = chain.sample_tick(&state, &mut rng);
        state = next;
        if tick >= warm_up {
            written += tokens;
        }
    }
    let measured = (ticks - warm_up) as f64;
    Ok(written as f64 / measured / chain.tick_ms * 1000.0)
}

/// A [`PlanError::InvalidSpec`] with `reason`.
fn invalid(reason: String) -> PlanError {
    PlanError::InvalidSpec(reason)
}

/// Whether `x` is finite and strictly positive.
fn positive_finite(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// Whether `x` is finite and not negative.
fn non_negative_finite(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

/// The best of `candidates` (see [`plan`]); `None` when there are none.
fn pick_best(candidates: &[Prediction]) -> Option<&Prediction> {
    let top = candidates
        .iter()
        .map(|p| p.tokens_per_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let floor = top - top.abs() * TIE_TOLERANCE;
    candidates
        .iter()
        .filter(|p| p.tokens_per_s >= floor)
        .min_by_key(|p| (p.batch_wait[0] + p.batch_wait[1], p.batch_wait[0]))
}

/// State of the chain after a tick. `q` holds both queues although `q[1]` follows from the rest
/// (`C - q0 - k0 - k1`); storing it keeps the transitions simple and does not add states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct State {
    /// Ready requests waiting at each subserver.
    q: [u32; 2],
    /// Batch of the step in flight (`0`: idle).
    k: [u32; 2],
    /// Ticks the step in flight still needs (`0` when idle).
    r: [u32; 2],
    /// Ticks waited idle with a ready request, capped at the wait bound.
    a: [u32; 2],
}

/// A [`ChainSpec`] and thresholds compiled into ticks and tables.
#[derive(Debug)]
struct Chain {
    /// Concurrency `C`.
    concurrency: u32,
    /// The thresholds `[B0, B1]` as given.
    batch_wait: [u32; 2],
    /// Effective thresholds: `B[i]` lowered to the batch cap.
    threshold: [u32; 2],
    /// Wait bounds in ticks (at least 1).
    wait: [u32; 2],
    /// Largest batch of each subserver (at most `C`).
    cap: [u32; 2],
    /// `duration[i][k]`: ticks of a step of batch `k` (`k` in `0..=cap[i]`; entry 0 unused).
    duration: [Vec<u32>; 2],
    /// `pmf[i][n][j]`: probability that `j` of `n` requests of a step of `i` hand off.
    pmf: [Vec<Vec<f64>>; 2],
    /// Whether a handoff from `i` discards the request's token.
    drop_on_handoff: [bool; 2],
    /// Expected tokens a request of a completed step of `i` writes: `1 - h` if dropped, else 1.
    kept: [f64; 2],
    /// Tick length in milliseconds.
    tick_ms: f64,
}

impl Chain {
    /// Validates `spec` and `batch_wait` and builds the tables.
    fn new(spec: &ChainSpec, batch_wait: [u32; 2]) -> Result<Self, PlanError> {
        spec.validate()?;
        if batch_wait.contains(&0) {
            return Err(invalid(format!(
                "batch_wait {batch_wait:?} must be at least 1 on both subservers"
            )));
        }
        let c = spec.concurrency;
        let cap: [u32; 2] = spec.max_batch.map(|limit| limit.map_or(c, |m| m.min(c)));
        let threshold: [u32; 2] = std::array::from_fn(|i| batch_wait[i].min(cap[i]));
        let wait: [u32; 2] = spec.max_wait_ms.map(|ms| ticks_ceil(ms, spec.tick_ms));
        let duration: [Vec<u32>; 2] =
            std::array::from_fn(|i| durations(&spec.profiles[i], cap[i], spec.tick_ms));
        let pmf: [Vec<Vec<f64>>; 2] =
            std::array::from_fn(|i| binomial_table(cap[i], spec.handoff[i]));
        let kept: [f64; 2] = std::array::from_fn(|i| {
            if spec.drop_on_handoff[i] {
                1.0 - spec.handoff[i]
            } else {
                1.0
            }
        });
        Ok(Self {
            concurrency: c,
            batch_wait,
            threshold,
            wait,
            cap,
            duration,
            pmf,
            drop_on_handoff: spec.drop_on_handoff,
            kept,
            tick_ms: spec.tick_ms,
        })
    }

    /// The start: every request ready on the small model, both subservers idle.
    fn initial(&self) -> State {
        State {
            q: [self.concurrency, 0],
            k: [0; 2],
            r: [0; 2],
            a: [0; 2],
        }
    }

    /// The handoff distribution of subserver `i` after the countdown: its binomial when it
    /// completes this tick, "nobody moves" otherwise.
    fn handoff_row(&self, i: usize, ticked: &State, done: bool) -> &[f64] {
        if done {
            self.pmf[i][ticked.k[i] as usize].as_slice()
        } else {
            NOBODY_MOVES.as_slice()
        }
    }

    /// Phase 2 of a tick: idle subservers meeting the start rule start a step, the others count
    /// their wait.
    fn start_idle(&self, mut s: State) -> State {
        for i in SUBSERVERS {
            if s.k[i] > 0 {
                continue;
            }
            let ready = s.q[i];
            if ready >= self.threshold[i] || (ready >= 1 && s.a[i] >= self.wait[i]) {
                let batch = ready.min(self.cap[i]);
                s.q[i] -= batch;
                s.k[i] = batch;
                s.r[i] = self.duration[i][batch as usize];
                s.a[i] = 0;
            } else if ready >= 1 {
                s.a[i] = (s.a[i] + 1).min(self.wait[i]);
            } else {
                s.a[i] = 0;
            }
        }
        s
    }

    /// Every successor of `s` with its probability, duplicates merged, into `out`.
    fn outcomes(&self, s: &State, out: &mut Vec<(State, f64)>) {
        out.clear();
        let (ticked, done) = count_down(*s);
        let rows = [
            self.handoff_row(0, &ticked, done[0]),
            self.handoff_row(1, &ticked, done[1]),
        ];
        for (j0, &p0) in rows[0].iter().enumerate() {
            if p0 <= 0.0 {
                continue;
            }
            for (j1, &p1) in rows[1].iter().enumerate() {
                if p1 <= 0.0 {
                    continue;
                }
                let handoffs = [j0 as u32, j1 as u32];
                out.push((self.start_idle(complete(&ticked, done, handoffs)), p0 * p1));
            }
        }
        merge_outcomes(out);
    }

    /// One random tick from `s`: the next state and the tokens written during the tick.
    fn sample_tick<R: Rng>(&self, s: &State, rng: &mut R) -> (State, u64) {
        let (ticked, done) = count_down(*s);
        let mut handoffs = [0u32; 2];
        let mut tokens = 0u64;
        for i in SUBSERVERS {
            if !done[i] {
                continue;
            }
            let batch = ticked.k[i];
            let moved = sample_index(&self.pmf[i][batch as usize], rng.random::<f64>()) as u32;
            handoffs[i] = moved;
            let dropped = if self.drop_on_handoff[i] { moved } else { 0 };
            tokens += u64::from(batch - dropped);
        }
        (self.start_idle(complete(&ticked, done, handoffs)), tokens)
    }
}

/// Phase 1a of a tick: running subservers count down; returns which ones complete.
fn count_down(mut s: State) -> (State, [bool; 2]) {
    let mut done = [false; 2];
    for i in SUBSERVERS {
        if s.k[i] > 0 {
            s.r[i] = s.r[i].saturating_sub(1);
            done[i] = s.r[i] == 0;
        }
    }
    (s, done)
}

/// Phase 1b of a tick: each completing subserver `i` sends `handoffs[i]` of its batch to the
/// other's queue and returns the rest to its own; both go idle.
fn complete(ticked: &State, done: [bool; 2], handoffs: [u32; 2]) -> State {
    let mut next = *ticked;
    for i in SUBSERVERS {
        if !done[i] {
            continue;
        }
        let moved = handoffs[i];
        next.q[i] += ticked.k[i] - moved;
        next.q[1 - i] += moved;
        next.k[i] = 0;
        next.r[i] = 0;
        next.a[i] = 0;
    }
    next
}

/// Sorts `out` by state and merges equal states, adding their probabilities.
fn merge_outcomes(out: &mut Vec<(State, f64)>) {
    out.sort_unstable_by_key(|&(state, _)| state);
    out.dedup_by(|later, kept| {
        if later.0 == kept.0 {
            kept.1 += later.1;
            true
        } else {
            false
        }
    });
}

/// Inverse-CDF sample of a probability row with the uniform `u` in `[0, 1)`; rounding that
/// leaves `u` above the total falls back to the last outcome with positive probability.
fn sample_index(row: &[f64], u: f64) -> usize {
    let mut acc = 0.0;
    let mut last = 0;
    for (j, &p) in row.iter().enumerate() {
        if p > 0.0 {
            acc += p;
            last = j;
            if u < acc {
                return j;
            }
        }
    }
    last
}

/// `max(1, ceil(ms / tick_ms))` ticks.
fn ticks_ceil(ms: f64, tick_ms: f64) -> u32 {
    (ms / tick_ms).ceil().max(1.0) as u32
}

/// `max(1, round(ms / tick_ms))` ticks.
fn ticks_round(ms: f64, tick_ms: f64) -> u32 {
    (ms / tick_ms).round().max(1.0) as u32
}

/// Step durations in ticks for batches `0..=cap` (batch 0 gets 0; it never runs).
fn durations(profile: &StepProfile, cap: u32, tick_ms: f64) -> Vec<u32> {
    std::iter::once(0)
        .chain((1..=cap).map(|k| ticks_round(profile.at(k), tick_ms)))
        .collect()
}

/// `ln(m!)` for `m` in `0..=n`.
fn ln_factorials(n: u32) -> Vec<f64> {
    let mut table = Vec::with_capacity(n as usize + 1);
    let mut acc = 0.0;
    table.push(acc);
    for m in 1..=n {
        acc += f64::from(m).ln();
        table.push(acc);
    }
    table
}

/// Binomial pmfs `Bin(n, p)` for `n` in `0..=max_n`.
fn binomial_table(max_n: u32, p: f64) -> Vec<Vec<f64>> {
    let ln_fact = ln_factorials(max_n);
    (0..=max_n).map(|n| binomial_row(n, p, &ln_fact)).collect()
}

/// The pmf of `Bin(n, p)`, computed in log space (no underflow of `(1 - p)^n` for large `n`)
/// and renormalized to sum to one. `ln_fact` must cover `0..=n`.
fn binomial_row(n: u32, p: f64, ln_fact: &[f64]) -> Vec<f64> {
    let len = n as usize + 1;
    if p <= 0.0 || p >= 1.0 {
        let mut row = vec![0.0; len];
        let certain = if p <= 0.0 { 0 } else { len - 1 };
        row[certain] = 1.0;
        return row;
    }
    let (ln_p, ln_q) = (p.ln(), (-p).ln_1p());
    let ln_n = ln_fact[n as usize];
    let mut row: Vec<f64> = (0..=n)
        .map(|j| {
            let ln_choose = ln_n - ln_fact[j as usize] - ln_fact[(n - j) as usize];
            (ln_choose + f64::from(j) * ln_p + f64::from(n - j) * ln_q).exp()
        })
        .collect();
    let total: f64 = row.iter().sum();
    row.iter_mut().for_each(|x| *x /= total);
    row
}

/// The reachable chain: states in discovery order and their transitions in compressed rows.
#[derive(Debug)]
struct Sparse {
    /// Reachable states; index 0 is the start.
    states: Vec<State>,
    /// Transitions of state `s` are `row_start[s]..row_start[s + 1]`.
    row_start: Vec<usize>,
    /// Destination state of each transition.
    dst: Vec<u32>,
    /// Probability of each transition.
    prob: Vec<f64>,
}

/// Enumerates the states reachable from the start, breadth first, with their transitions;
/// fails once more than `state_limit` states or `transition_limit` transitions turn up.
fn reachable(
    chain: &Chain,
    state_limit: usize,
    transition_limit: usize,
) -> Result<Sparse, PlanError> {
    let start = chain.initial();
    let mut index: HashMap<State, usize> = HashMap::from([(start, 0)]);
    let mut states = vec![start];
    let mut row_start = vec![0];
    let mut dst = Vec::new();
    let mut prob = Vec::new();
    let mut outcomes = Vec::new();
    let mut next = 0;
    while next < states.len() {
        let state = states[next];
        chain.outcomes(&state, &mut outcomes);
        for &(to, p) in &outcomes {
            let id = *index.entry(to).or_insert_with(|| {
                states.push(to);
                states.len() - 1
            });
            dst.push(id as u32);
            prob.push(p);
        }
        row_start.push(dst.len());
        if states.len() > state_limit {
            return Err(PlanError::TooManyStates {
                limit: state_limit,
                tick_ms: chain.tick_ms,
            });
        }
        if dst.len() > transition_limit {
            return Err(PlanError::TooManyTransitions {
                limit: transition_limit,
                tick_ms: chain.tick_ms,
            });
        }
        next += 1;
    }
    Ok(Sparse {
        states,
        row_start,
        dst,
        prob,
    })
}

/// Stationary distribution by Gauss-Seidel sweeps over `x = x P` (each state's mass recomputed
/// from its predecessors' latest values), from the uniform distribution; returns it with the
/// sweeps taken. Far fewer sweeps than power iteration on these slowly mixing chains (a step's
/// residual time counts down one tick per transition), and periodicity does not stall it. Falls
/// back to lazy power iteration should the sweeps not settle.
fn stationary(sparse: &Sparse) -> Result<(Vec<f64>, u32), PlanError> {
    let n = sparse.states.len();
    let incoming = Incoming::of(sparse);
    let mut x = vec![1.0 / n as f64; n];
    for sweep in 1..=MAX_ITERATIONS / 10 {
        let mut change = 0.0;
        for j in 0..n {
            let (mut inflow, mut stay) = (0.0, 0.0);
            for &(i, p) in incoming.of_state(j) {
                if i as usize == j {
                    stay += p;
                } else {
                    inflow += x[i as usize] * p;
                }
            }
            let new = if stay < 1.0 {
                inflow / (1.0 - stay)
            } else {
                x[j]
            };
            change += (new - x[j]).abs();
            x[j] = new;
        }
        let total: f64 = x.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            break;
        }
        x.iter_mut().for_each(|v| *v /= total);
        if change / total < TOLERANCE {
            return Ok((x, sweep));
        }
    }
    power_iteration(sparse)
}

/// Transitions by destination: `(source, probability)` of state `j` at `start[j]..start[j + 1]`.
struct Incoming {
    start: Vec<usize>,
    edges: Vec<(u32, f64)>,
}

impl Incoming {
    fn of(sparse: &Sparse) -> Self {
        let n = sparse.states.len();
        let mut start = vec![0usize; n + 1];
        for &d in &sparse.dst {
            start[d as usize + 1] += 1;
        }
        for j in 0..n {
            start[j + 1] += start[j];
        }
        let mut fill = start.clone();
        let mut edges = vec![(0u32, 0.0); sparse.dst.len()];
        for (i, bounds) in sparse.row_start.windows(2).enumerate() {
            for k in bounds[0]..bounds[1] {
                let d = sparse.dst[k] as usize;
                edges[fill[d]] = (i as u32, sparse.prob[k]);
                fill[d] += 1;
            }
        }
        Self { start, edges }
    }

    fn of_state(&self, j: usize) -> &[(u32, f64)] {
        &self.edges[self.start[j]..self.start[j + 1]]
    }
}

/// Stationary distribution by lazy power iteration from the uniform distribution; returns it
/// with the iterations taken.
fn power_iteration(sparse: &Sparse) -> Result<(Vec<f64>, u32), PlanError> {
    let n = sparse.states.len();
    let mut x = vec![1.0 / n as f64; n];
    let mut y = vec![0.0; n];
    let mut change = f64::INFINITY;
    for iteration in 1..=MAX_ITERATIONS {
        propagate(sparse, &x, &mut y);
        change = mix_and_normalize(&x, &mut y);
        std::mem::swap(&mut x, &mut y);
        if change < TOLERANCE {
            return Ok((x, iteration));
        }
    }
    Err(PlanError::NoConvergence {
        iterations: MAX_ITERATIONS,
        residual: change,
    })
}

/// `y = x P`.
fn propagate(sparse: &Sparse, x: &[f64], y: &mut [f64]) {
    y.iter_mut().for_each(|v| *v = 0.0);
    for (bounds, &mass) in sparse.row_start.windows(2).zip(x) {
        let (lo, hi) = (bounds[0], bounds[1]);
        for (&to, &p) in sparse.dst[lo..hi].iter().zip(&sparse.prob[lo..hi]) {
            y[to as usize] += mass * p;
        }
    }
}

/// `y = L x + (1 - L) y`, renormalized to sum to one; returns the L1 distance from `x`.
fn mix_and_normalize(x: &[f64], y: &mut [f64]) -> f64 {
    let mut total = 0.0;
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = LAZINESS * xv + (1.0 - LAZINESS) * *yv;
        total += *yv;
    }
    let mut change = 0.0;
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv /= total;
        change += (*yv - xv).abs();
    }
    change
}

/// Steady-state statistics from the stationary distribution `pi` over `states`.
///
/// A state with `r_i = 1` completes `i`'s step in the next tick, writing `k_i * kept_i` tokens
/// in expectation; a state with `r_i` equal to the full duration of its batch is the tick the
/// step started (durations count down from there), which gives the per-step mean batch.
fn summarize(chain: &Chain, states: &[State], pi: &[f64], iterations: u32) -> Prediction {
    let mut tokens = [0.0; 2];
    let mut busy = [0.0; 2];
    let mut starts = [0.0; 2];
    let mut started = [0.0; 2];
    for (s, &p) in states.iter().zip(pi) {
        for i in SUBSERVERS {
            let batch = s.k[i];
            if batch == 0 {
                continue;
            }
            let k = f64::from(batch);
            busy[i] += p;
            if s.r[i] == 1 {
                tokens[i] += p * k * chain.kept[i];
            }
            if s.r[i] == chain.duration[i][batch as usize] {
                starts[i] += p;
                started[i] += p * k;
            }
        }
    }
    let total = tokens[0] + tokens[1];
    Prediction {
        batch_wait: chain.batch_wait,
        tokens_per_s: total / chain.tick_ms * 1000.0,
        token_share: tokens.map(|t| ratio(t, total)),
        mean_batch: std::array::from_fn(|i| ratio(started[i], starts[i])),
        utilization: busy,
        states: states.len(),
        iterations,
    }
}

/// `num / den`, or 0 when `den` is not positive.
fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile `base + slope * (k - 1)` for batches `1..=n`.
    fn linear(base: f64, slope: f64, n: u32) -> StepProfile {
        StepProfile::new((0..n).map(|k| base + slope * f64::from(k)).collect())
    }

    /// The reference worker: small 8 ms + 0.2 ms per request, large 30 ms + 1 ms per request.
    fn spec(concurrency: u32) -> ChainSpec {
        ChainSpec {
            concurrency,
            profiles: [linear(8.0, 0.2, 8), linear(30.0, 1.0, 8)],
            handoff: [0.1, 0.75],
            drop_on_handoff: [true, false],
            max_wait_ms: [8.0, 30.0],
            max_batch: [None, None],
            tick_ms: 1.0,
        }
        .with_auto_tick()
    }

    fn assert_close(actual: f64, expected: f64, rel: f64) {
        let err = (actual - expected).abs() / expected.abs().max(f64::MIN_POSITIVE);
        assert!(
            err <= rel,
            "{actual} is not within {rel} of {expected} (relative error {err})"
        );
    }

    #[test]
    fn profile_extrapolates() {
        let two = StepProfile::new(vec![8.0, 8.5]);
        assert!(two.at(0).abs() < 1e-12);
        assert_close(two.at(1), 8.0, 1e-12);
        assert_close(two.at(2), 8.5, 1e-12);
        assert_close(two.at(4), 9.5, 1e-12);
        let one = StepProfile::new(vec![5.0]);
        assert_close(one.at(7), 5.0, 1e-12);
        assert!(StepProfile::new(Vec::new()).at(3).abs() < 1e-12);
    }

    #[test]
    fn binomial_rows_sum_to_one() {
        let table = binomial_table(2000, 0.75);
        for row in [&table[0], &table[1], &table[37], &table[2000]] {
            assert_close(row.iter().sum::<f64>(), 1.0, 1e-12);
        }
        let mean: f64 = table[2000]
            .iter()
            .enumerate()
            .map(|(j, p)| j as f64 * p)
            .sum();
        assert_close(mean, 1500.0, 1e-9);
        assert_close(binomial_table(3, 0.0)[3][0], 1.0, 1e-12);
        assert_close(binomial_table(3, 1.0)[3][3], 1.0, 1e-12);
    }

    fn check_against_simulation(batch_wait: [u32; 2]) {
        let spec = spec(8);
        let exact = predict(&spec, batch_wait).expect("valid spec");
        let sampled = simulate(&spec, batch_wait, 500_000, 7).expect("valid spec");
        assert!(exact.tokens_per_s > 0.0);
        assert_close(sampled, exact.tokens_per_s, 0.03);
    }

    #[test]
    fn predict_matches_simulation_without_delay() {
        check_against_simulation([1, 1]);
    }

    #[test]
    fn predict_matches_simulation_with_delay() {
        check_against_simulation([1, 2]);
    }

    #[test]
    fn statistics_are_consistent() {
        let p = predict(&spec(8), [2, 3]).expect("valid spec");
        assert_eq!(p.batch_wait, [2, 3]);
        assert_close(p.token_share[0] + p.token_share[1], 1.0, 1e-9);
        for i in SUBSERVERS {
            // Sums of probabilities: allow for rounding at the ends of the ranges.
            assert!((0.0..=1.0 + 1e-9).contains(&p.utilization[i]));
            assert!(
                (1.0 - 1e-9..=8.0 + 1e-9).contains(&p.mean_batch[i]),
                "{:?}",
                p.mean_batch
            );
        }
        assert!(p.states > 1 && p.iterations > 0);
    }

    #[test]
    fn no_handoff_matches_closed_form() {
        let mut spec = spec(8);
        spec.handoff = [0.0, 0.0];
        // A tick dividing the full-batch step exactly keeps the discretization exact.
        spec.tick_ms = spec.profiles[0].at(8) / 8.0;
        let p = predict(&spec, [1, 1]).expect("valid spec");
        assert_close(p.tokens_per_s, 8.0 / spec.profiles[0].at(8) * 1000.0, 0.01);
        assert_close(p.token_share[0], 1.0, 1e-9);
        assert_close(p.mean_batch[0], 8.0, 1e-9);
        assert!(p.utilization[1].abs() < 1e-12);
        let sampled = simulate(&spec, [1, 1], 10_000, 1).expect("valid spec");
        assert_close(sampled, p.tokens_per_s, 0.01);
    }

    #[test]
    fn wait_bound_prevents_deadlock() {
        let spec = spec(1);
        let p = predict(&spec, [2, 2]).expect("valid spec");
        assert!(p.tokens_per_s > 0.0);
        assert!(simulate(&spec, [2, 2], 20_000, 3).expect("valid spec") > 0.0);
        let mut capped = spec;
        capped.max_batch = [Some(1), Some(1)];
        assert!(predict(&capped, [3, 3]).expect("valid spec").tokens_per_s > 0.0);
    }

    #[test]
    fn invalid_specs_are_rejected() {
        let good = spec(4);
        let mut cases = Vec::new();
        let mut s = good.clone();
        s.concurrency = 0;
        cases.push(s);
        let mut s = good.clone();
        s.handoff[1] = 1.5;
        cases.push(s);
        let mut s = good.clone();
        s.handoff[0] = f64::NAN;
        cases.push(s);
        let mut s = good.clone();
        s.profiles[0].step_ms.clear();
        cases.push(s);
        let mut s = good.clone();
        s.profiles[1].step_ms[2] = -1.0;
        cases.push(s);
        let mut s = good.clone();
        s.tick_ms = 0.0;
        cases.push(s);
        let mut s = good.clone();
        s.max_wait_ms[0] = -1.0;
        cases.push(s);
        let mut s = good.clone();
        s.max_batch[1] = Some(0);
        cases.push(s);
        for case in &cases {
            assert!(
                matches!(predict(case, [1, 1]), Err(PlanError::InvalidSpec(_))),
                "{case:?}"
            );
            assert!(matches!(
                simulate(case, [1, 1], 10, 0),
                Err(PlanError::InvalidSpec(_))
            ));
        }
        assert!(matches!(
            predict(&good, [0, 1]),
            Err(PlanError::InvalidSpec(_))
        ));
        assert!(matches!(
            simulate(&good, [1, 1], 0, 0),
            Err(PlanError::InvalidSpec(_))
        ));
        assert!(matches!(plan(&good, 0), Err(PlanError::InvalidSpec(_))));
    }

    #[test]
    fn state_cap_is_enforced() {
        let chain = Chain::new(&spec(8), [1, 1]).expect("valid spec");
        let err = reachable(&chain, 10, MAX_TRANSITIONS).expect_err("more than 10 states");
        assert!(matches!(err, PlanError::TooManyStates { limit: 10, .. }));
        assert!(err.to_string().contains("raise tick_ms"));
    }

    #[test]
    fn plan_picks_the_best_candidate() {
        let spec = spec(3);
        let result = plan(&spec, 5).expect("valid spec");
        assert_eq!(result.candidates.len(), 9);
        let top = result
            .candidates
            .iter()
            .map(|p| p.tokens_per_s)
            .fold(0.0, f64::max);
        assert!(result.best.tokens_per_s >= top * (1.0 - 1e-6));
        assert!(result.candidates.contains(&result.best));
    }
}

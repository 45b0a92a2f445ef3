//! The search as a state machine: [`Learner::plan`] says what to measure next (a pure function
//! of the state and the round number, so replayed rounds can be checked against it) and
//! [`Learner::record`] takes the measurement in.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{Period, Phase, Round, SearchConfig, rewards};

/// A measured table must beat the best by more than this to replace it.
const TOLERANCE: f64 = 1e-9;

/// Where the search is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    /// Round 0: the initial bits.
    Initial,
    /// Scanning `cluster` with `bit`.
    Scan { cluster: usize, bit: u8 },
    /// Refinement.
    Refine,
}

/// The search state.
pub(super) struct Learner {
    cfg: SearchConfig,
    stage: Stage,
    next_round: u32,
    /// The scan's table: the initial bits, each scanned cluster at its kept bit.
    scan_bits: Vec<u8>,
    /// The scanned cluster's reward with bit 0, while its bit-1 round is pending.
    scan_local: Option<f64>,
    /// Per cluster and bit: requests and met, over every period measured.
    stats: Vec<[(u64, u64); 2]>,
    best_bits: Vec<u8>,
    /// Mean attainment of the measurements of `best_bits`.
    best_attainment: f64,
    /// How many measurements `best_attainment` averages (0 before round 0).
    best_measurements: u32,
    converged_round: u32,
    refine_rounds: u32,
    since_improvement: u32,
    /// Every bit vector measured so far: refinement prefers tables it has not measured.
    measured: std::collections::HashSet<Vec<u8>>,
}

impl Learner {
    pub(super) fn new(initial: &[u8], cfg: SearchConfig) -> Self {
        Learner {
            stage: Stage::Initial,
            next_round: 0,
            scan_bits: initial.to_vec(),
            scan_local: None,
            stats: vec![[(0, 0); 2]; cfg.k],
            best_bits: initial.to_vec(),
            best_attainment: f64::NEG_INFINITY,
            best_measurements: 0,
            converged_round: 0,
            refine_rounds: 0,
            since_improvement: 0,
            measured: std::collections::HashSet::new(),
            cfg,
        }
    }

    pub(super) fn next_round(&self) -> u32 {
        self.next_round
    }

    pub(super) fn best_bits(&self) -> &[u8] {
        &self.best_bits
    }

    pub(super) fn best_attainment(&self) -> f64 {
        self.best_attainment
    }

    pub(super) fn converged_round(&self) -> u32 {
        self.converged_round
    }

    /// The next round's phase and bits; `None` when the search is over.
    pub(super) fn plan(&self) -> Option<(Phase, Vec<u8>)> {
        if self.next_round >= self.cfg.max_rounds {
            return None;
        }
        match self.stage {
            Stage::Initial => Some((Phase::Refine, self.scan_bits.clone())),
            Stage::Scan { cluster, bit } => {
                let mut bits = self.scan_bits.clone();
                bits[cluster] = bit;
                Some((Phase::Scan { cluster, bit }, bits))
            }
            Stage::Refine if self.since_improvement >= self.cfg.patience => None,
            Stage::Refine => Some((Phase::Refine, self.refine_bits())),
        }
    }

    /// Epsilon-greedy bits for the next refinement round.
    fn refine_bits(&self) -> Vec<u8> {
        let mut rng = round_rng(self.cfg.seed, self.next_round);
        let epsilon = self.cfg.epsilon * self.cfg.epsilon_decay.powf(self.refine_rounds as f64);
        let mut bits: Vec<u8> = (0..self.cfg.k)
            .map(|c| {
                let greedy = self.best_known(c);
                if rng.random_bool(epsilon.clamp(0.0, 1.0)) {
                    1 - greedy
                } else {
                    greedy
                }
            })
            .collect();
        // A table measured before (the best one, or a greedy choice that keeps coming back)
        // teaches little: flip random clusters until it is new, a few tries at most.
        for _ in 0..4 * self.cfg.k {
            if !self.measured.contains(&bits) && bits != self.best_bits {
                break;
            }
            let c = rng.random_range(0..self.cfg.k);
            bits[c] = 1 - bits[c];
        }
        bits
    }

    /// The bit with the higher requests-weighted reward so far (unknown or tied: the best
    /// table's).
    fn best_known(&self, c: usize) -> u8 {
        let mean = |(n, met): (u64, u64)| (n > 0).then(|| met as f64 / n as f64);
        match (mean(self.stats[c][0]), mean(self.stats[c][1])) {
            (Some(local), Some(remote)) if remote > local => 1,
            (Some(local), Some(remote)) if local > remote => 0,
            _ => self.best_bits[c],
        }
    }

    /// Takes in the measurement of the planned round and moves on.
    pub(super) fn record(&mut self, phase: Phase, bits: Vec<u8>, p: &Period) -> Round {
        let round = self.next_round;
        self.next_round += 1;
        self.measured.insert(bits.clone());
        for (c, (&b, &(n, met))) in bits.iter().zip(&p.per_cluster).enumerate() {
            let s = &mut self.stats[c][usize::from(b)];
            s.0 += n;
            s.1 += met;
        }
        let per_cluster_reward = rewards(&p.per_cluster);
        // The scan measures the best table again now and then: that refines its estimate (a
        // lucky period is no improvement, and should not move `converged_round`).
        let again = self.best_measurements > 0 && bits == self.best_bits;
        let improved = !again && p.attainment > self.best_attainment + TOLERANCE;
        if again {
            let n = f64::from(self.best_measurements);
            self.best_attainment = (self.best_attainment * n + p.attainment) / (n + 1.0);
            self.best_measurements += 1;
        } else if improved {
            self.best_bits.clone_from(&bits);
            self.best_attainment = p.attainment;
            self.best_measurements = 1;
            self.converged_round = round;
        }
        self.stage = match self.stage {
            Stage::Initial if self.cfg.scan => Stage::Scan { cluster: 0, bit: 0 },
            Stage::Initial => Stage::Refine,
            Stage::Scan { cluster, bit: 0 } => {
                self.scan_local = per_cluster_reward[cluster];
                Stage::Scan { cluster, bit: 1 }
            }
            Stage::Scan { cluster, .. } => {
                // Every request the remote bit sent was prefilled locally by its decode worker
                // (it held the prompt): the bit changed no path, so nothing credits remote.
                let all_held = p
                    .per_cluster
                    .get(cluster)
                    .is_some_and(|&(n, _)| n > 0 && p.per_cluster_held.get(cluster) == Some(&n));
                if let (Some(local), Some(remote), false) = (
                    self.scan_local.take(),
                    per_cluster_reward[cluster],
                    all_held,
                ) {
                    if remote > local {
                        self.scan_bits[cluster] = 1;
                    } else if local > remote {
                        self.scan_bits[cluster] = 0;
                    }
                }
                if cluster + 1 < self.cfg.k {
                    Stage::Scan {
                        cluster: cluster + 1,
                        bit: 0,
                    }
                } else {
                    Stage::Refine
                }
            }
            Stage::Refine => {
                self.refine_rounds += 1;
                self.since_improvement = if improved {
                    0
                } else {
                    self.since_improvement + 1
                };
                Stage::Refine
            }
        };
        Round {
            round,
            phase,
            bits,
            per_cluster: p.per_cluster.clone(),
            per_cluster_held: p.per_cluster_held.clone(),
            per_cluster_reward,
            attainment: p.attainment,
            p90_ttft_ms: p.p90_ttft_ms,
            p90_tpot_ms: p.p90_tpot_ms,
            best_bits: self.best_bits.clone(),
            best_attainment: self.best_attainment,
            improved,
        }
    }
}

/// The generator of round `round`'s random choices: a function of the seed and the round alone,
/// so a resumed search draws what the uninterrupted one would have.
fn round_rng(seed: u64, round: u32) -> SmallRng {
    // splitmix64 finalizer over seed and round, so neighbouring rounds get unrelated streams.
    let mut z = seed ^ u64::from(round).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    SmallRng::seed_from_u64(z ^ (z >> 31))
}

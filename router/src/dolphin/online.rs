//! Online learning (issue 14 item 10): the router keeps measuring the two paths of every
//! cluster on live traffic, and flips a cluster's bit when the other path is significantly
//! better.
//!
//! - **Exploration.** On a bounded share of each cluster's requests ([`Explorer`]) the router
//!   takes the path the table does not give (`DecidedBy::Explored`). The schedule is a
//!   per-cluster counter, so the share is exact at any scale, never a coin that can run long.
//!   Local prefill is not explored for prompts longer than one step's worth of uncached tokens
//!   (`explore_local_max_tokens`): each such trial stalls every decode on its worker. Remote
//!   prefill is not explored onto a prefill worker with more than a step of prompt tokens
//!   waiting: near saturation one such trial can tip the pool into a queue it never leaves.
//!   The one exception to the length limit is the mirror of that guard: a cluster without
//!   evidence on this split (the fallback routes it) explores local prefill of a long prompt
//!   while its prefill worker has more than a step waiting, when remote is the costly path.
//!   Without it a new split never tries what its offline table finds there (long prompts on
//!   the decode workers): measured in `docs/results.md`, "Online learning".
//! - **Rewards that see the neighbours.** A request prefilled on its decode worker meets its
//!   own SLO easily while it stalls every decode beside it; crediting each request with its own
//!   outcome alone made the learner flip clusters to local prefill that cost the rest of the
//!   traffic far more (measured: `docs/results.md`, "Online learning"). So a finished request
//!   is credited with the attainment of every request that finished on its decode worker while
//!   it was in flight, itself included ([`Neighbourhood`]).
//! - **Estimates.** Every finished request of a cluster credits that reward to the path it was
//!   routed by ([`OnlineLearner::observe`]). Old outcomes fade with a half-life counted in the
//!   cluster's own requests, so the estimates follow traffic that changes.
//! - **Flips.** A bit flips only when both paths have enough outcomes and the other path's
//!   attainment beats the bit's by a one-sided two-proportion z-test at the configured
//!   confidence (Agresti-Caffo adjusted, so a path with no misses yet is not certain). A flip
//!   changes the load the cluster puts on each pool, so the cluster's estimates restart. A
//!   cluster whose bit the router does not trust (thin evidence: the fallback routes it) takes
//!   whichever path is significantly better, with that evidence, and is trusted from then on.
//! - **Settled clusters explore less.** Once a cluster's bit is significantly better than the
//!   other path, it explores at a fifth of the share ([`SETTLED_SHARE`]).
//! - **Tables.** Each flip makes a new table version ([`OnlineLearner::table`]): the bits, the
//!   evidence behind them (requests measured, the margin between the paths) and a provenance
//!   note. The router publishes it to its store (etcd), like an operator's `tables activate`.
//! - **New splits.** When the P/D split changes and no table exists for the new split, the
//!   router starts from the table of the nearest split ([`nearest_split`], [`seed_table`]): its
//!   clusters, and its bits as untested priors, since a table's bits do not carry across
//!   splits (measured: the Mooncake trace's 2p2d table on 3p1d meets almost nothing). The
//!   fallback routes each cluster until the learner has evidence for one of its paths. With no
//!   table at all, the fallback routes and nothing is learned.
//!
//! The router and the simulator share this module, so what the simulator shows about online
//! learning is what the router does.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::split::Split;
use super::table::{Reward, RoutingTable, TableSlo};
use super::trust::{ClusterEvidence, Distrust, TrustConfig};
use crate::policy::{DecidedBy, Decision, PoolState};
use crate::route::Route;

/// The online learner's settings (the router's `--online-*` flags; off by default).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OnlineConfig {
    /// Learn from live traffic at all.
    pub enabled: bool,
    /// Share of each cluster's requests sent by the other path (0 to 0.5).
    pub explore_share: f64,
    /// One-sided confidence a flip needs (0.5 to 0.9999).
    pub confidence: f64,
    /// Fewest (faded) outcomes on each path before a cluster's bit may flip.
    pub min_samples: u32,
    /// Outcomes of a cluster after which an old outcome weighs half.
    pub half_life: u32,
    /// Longest uncached prompt (on the decode worker) explored by local prefill. A long local
    /// prefill stalls every decode on its worker for several steps; exploring it at 5% of a
    /// decode-bound split's long prompts cost 23 points of attainment (`docs/results.md`).
    /// Not applied to a cluster without evidence while its prefill worker is busy (see
    /// [`explore`]).
    pub explore_local_max_tokens: u32,
}

impl Default for OnlineConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            explore_share: 0.1,
            confidence: 0.95,
            min_samples: 30,
            half_life: 2000,
            explore_local_max_tokens: 2048,
        }
    }
}

impl OnlineConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.explore_share.is_finite() && (0.0..=0.5).contains(&self.explore_share)) {
            return Err(format!(
                "explore share must be within [0, 0.5], got {}",
                self.explore_share
            ));
        }
        if !(self.confidence.is_finite() && (0.5..=0.9999).contains(&self.confidence)) {
            return Err(format!(
                "confidence must be within [0.5, 0.9999], got {}",
                self.confidence
            ));
        }
        if self.min_samples == 0 {
            return Err("min samples must be at least 1".into());
        }
        if self.half_life < self.min_samples.saturating_mul(2) {
            return Err(format!(
                "half life ({}) must be at least twice min samples ({})",
                self.half_life, self.min_samples
            ));
        }
        Ok(())
    }
}

/// Which requests the online learner may explore and learns from: those its table's bit
/// decided, those it explored, and those routed by the fallback because the bit's evidence is
/// thin (exactly where evidence is wanted). Requests beyond every cluster's range, forced ones
/// and the fallback's without a table are neither.
pub fn learns_from(decided_by: DecidedBy) -> bool {
    matches!(
        decided_by,
        DecidedBy::Table | DecidedBy::Explored | DecidedBy::Distrusted(_, Distrust::ThinEvidence)
    )
}

/// The exploration schedule: a counter per cluster; request `n` of a cluster explores when
/// `floor((n + 1) s + o) > floor(n s + o)` (share `s`, a per-cluster offset `o` so clusters do
/// not explore in lockstep). Lock-free: the request path calls [`Explorer::explore`].
#[derive(Debug)]
pub struct Explorer {
    local_max_tokens: u32,
    counters: Box<[AtomicU64]>,
    /// Per cluster, the share as `f64` bits (the learner lowers a settled cluster's).
    shares: Box<[AtomicU64]>,
}

/// A settled cluster's share of the configured exploration share.
pub const SETTLED_SHARE: f64 = 0.2;

impl Explorer {
    /// The schedule of `cfg` over `k` clusters.
    pub fn new(cfg: &OnlineConfig, k: usize) -> Self {
        let share = cfg.explore_share;
        Explorer {
            local_max_tokens: cfg.explore_local_max_tokens,
            counters: (0..k).map(|_| AtomicU64::new(0)).collect(),
            shares: (0..k).map(|_| AtomicU64::new(share.to_bits())).collect(),
        }
    }

    /// Clusters it schedules.
    pub fn k(&self) -> usize {
        self.counters.len()
    }

    /// Sets `cluster`'s share.
    pub fn set_share(&self, cluster: u32, share: f64) {
        if let Some(s) = self.shares.get(cluster as usize) {
            s.store(share.to_bits(), Ordering::Relaxed);
        }
    }

    /// `cluster`'s share.
    pub fn share(&self, cluster: u32) -> f64 {
        self.shares
            .get(cluster as usize)
            .map_or(0.0, |s| f64::from_bits(s.load(Ordering::Relaxed)))
    }

    /// Whether the next request of `cluster` explores.
    pub fn explore(&self, cluster: u32) -> bool {
        let Some(c) = self.counters.get(cluster as usize) else {
            return false;
        };
        let share = self.share(cluster);
        if share <= 0.0 {
            return false;
        }
        let n = c.fetch_add(1, Ordering::Relaxed) as f64;
        // The golden ratio spreads the clusters' offsets over [0, 1).
        let offset = (f64::from(cluster) * 0.618_033_988_749_895).fract();
        ((n + 1.0) * share + offset).floor() > (n * share + offset).floor()
    }
}

/// Completions per decode worker, for the neighbourhood reward: a finished request is credited
/// with the share of the requests that finished on its decode worker between its arrival and
/// its end (itself included) that met their SLO. Completions must be given in the order they
/// happen; each worker keeps the last [`Neighbourhood::KEEP`].
#[derive(Debug)]
pub struct Neighbourhood<K> {
    workers: HashMap<K, VecDeque<(f64, bool)>>,
}

impl<K> Default for Neighbourhood<K> {
    fn default() -> Self {
        Neighbourhood {
            workers: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> Neighbourhood<K> {
    /// Completions kept per worker.
    pub const KEEP: usize = 4096;

    /// Records a request that arrived at `arrived_ms`, finished on `worker` at `done_ms` and
    /// met its SLO or not; returns its neighbourhood reward.
    pub fn complete(&mut self, worker: K, arrived_ms: f64, done_ms: f64, met: bool) -> f64 {
        let log = self.workers.entry(worker).or_default();
        if log.len() == Self::KEEP {
            log.pop_front();
        }
        log.push_back((done_ms, met));
        let (mut n, mut m) = (0u32, 0u32);
        for &(t, ok) in log.iter().rev() {
            if t < arrived_ms {
                break;
            }
            n += 1;
            m += u32::from(ok);
        }
        f64::from(m) / f64::from(n.max(1))
    }

    /// Forgets a worker that left.
    pub fn forget(&mut self, worker: &K) {
        self.workers.remove(worker);
    }
}

/// Sends `route` by the other path when the schedule says so and the table's learner may: its
/// decision is flipped and it is marked [`DecidedBy::Explored`]. `pools`: the chosen workers'
/// load; remote is explored only when a prefill worker was chosen and it has at most one step
/// of prompt tokens waiting ([`EXPLORE_BUSY_STEPS`]), local only for prompts of at most
/// `explore_local_max_tokens` uncached tokens on the decode worker, or longer ones of a cluster
/// the fallback routes for thin evidence while that prefill worker has more than a step
/// waiting. Returns whether it explored.
pub fn explore(route: &mut Route, pools: PoolState, explorer: &Explorer) -> bool {
    let Some(cluster) = route.cluster else {
        return false;
    };
    if !learns_from(route.decided_by) || route.decided_by == DecidedBy::Explored || !pools.available
    {
        return false;
    }
    let prefill_busy = pools.prefill_busy(EXPLORE_BUSY_STEPS);
    let untested = matches!(
        route.decided_by,
        DecidedBy::Distrusted(_, Distrust::ThinEvidence)
    );
    let too_long =
        route.features.eff_isl_decode > explorer.local_max_tokens && !(untested && prefill_busy);
    match route.decision {
        Decision::Remote if too_long => return false,
        // Never onto a prefill worker with more than a step of work waiting.
        Decision::Local if prefill_busy => return false,
        _ => {}
    }
    if !explorer.explore(cluster) {
        return false;
    }
    route.decision = other(route.decision);
    route.decided_by = DecidedBy::Explored;
    true
}

/// Steps of prompt tokens waiting on the chosen prefill worker beyond which it is busy for
/// exploration: remote is not explored onto it, and an untested cluster's long prompts may be
/// explored locally instead (Dynamo's `prefill_load` default, `ThresholdConfig`).
pub const EXPLORE_BUSY_STEPS: f64 = 1.0;

/// The other path.
pub fn other(d: Decision) -> Decision {
    match d {
        Decision::Local => Decision::Remote,
        Decision::Remote => Decision::Local,
    }
}

/// Whether a finished request met `slo` under `reward` (the criteria the table was learned
/// with): `e2e <= TTFT + (n - 1) x TPOT` targets, or TTFT and TPOT each within target.
pub fn met(slo: TableSlo, reward: Reward, ttft_ms: f64, tpot_ms: f64, e2e_ms: f64, n: u32) -> bool {
    match reward {
        Reward::E2e => e2e_ms <= slo.ttft_ms + f64::from(n.saturating_sub(1)) * slo.tpot_ms,
        Reward::PerMetric => ttft_ms <= slo.ttft_ms && tpot_ms <= slo.tpot_ms,
    }
}

/// One path's outcomes in one cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PathStats {
    /// Faded count of outcomes.
    pub weight: f64,
    /// Faded sum of their rewards (each in [0, 1]).
    pub met: f64,
    /// Outcomes ever credited (not faded).
    pub outcomes: u64,
}

impl PathStats {
    /// Attainment, Agresti-Caffo adjusted: `(met + 1) / (weight + 2)`.
    pub fn adjusted(&self) -> f64 {
        (self.met + 1.0) / (self.weight + 2.0)
    }

    /// Plain attainment (`None` before any outcome).
    pub fn attainment(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.met / self.weight)
    }
}

/// A bit the learner changed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Flip {
    /// The cluster.
    pub cluster: u32,
    /// Its new path.
    pub to: Decision,
    /// The new path's attainment minus the other's (adjusted estimates).
    pub gain: f64,
    /// The test statistic.
    pub z: f64,
    /// The cluster's bit was not trusted (the fallback routed it) and now is, with this path:
    /// the bit may be unchanged.
    pub adopted: bool,
}

/// The online learner of one table: per-cluster estimates of both paths, and the table as it
/// has learned it.
#[derive(Clone, Debug)]
pub struct OnlineLearner {
    cfg: OnlineConfig,
    trust: TrustConfig,
    table: RoutingTable,
    stats: Vec<[PathStats; 2]>,
    decay: f64,
    z_crit: f64,
    flips: u64,
}

fn index(d: Decision) -> usize {
    match d {
        Decision::Local => 0,
        Decision::Remote => 1,
    }
}

fn decision(bit: u8) -> Decision {
    if bit == 0 {
        Decision::Local
    } else {
        Decision::Remote
    }
}

impl OnlineLearner {
    /// A learner starting from `table`, whose bits the router takes under `trust`.
    pub fn new(cfg: OnlineConfig, trust: TrustConfig, table: RoutingTable) -> Self {
        let k = table.k;
        OnlineLearner {
            decay: 0.5_f64.powf(1.0 / f64::from(cfg.half_life.max(1))),
            z_crit: normal_quantile(cfg.confidence),
            cfg,
            trust,
            table,
            stats: vec![[PathStats::default(); 2]; k],
            flips: 0,
        }
    }

    /// The table as learned so far.
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    /// Bits flipped so far.
    pub fn flips(&self) -> u64 {
        self.flips
    }

    /// The estimates of `cluster`'s paths (local, remote) since its last flip.
    pub fn stats(&self, cluster: u32) -> Option<[PathStats; 2]> {
        self.stats.get(cluster as usize).copied()
    }

    /// Whether the router takes `cluster`'s bit (its evidence is enough under the trust
    /// settings; a table without evidence is always taken).
    pub fn trusted(&self, cluster: u32) -> bool {
        !self.trust.enabled
            || self
                .table
                .evidence
                .get(cluster as usize)
                .is_none_or(|e| self.trust.enough(e))
    }

    /// The share `cluster` explores at now: the configured one, a fifth of it once the bit is
    /// significantly better than the other path.
    pub fn share(&self, cluster: u32) -> f64 {
        match self.test(cluster) {
            Some(z) if z < -self.z_crit && self.trusted(cluster) => {
                self.cfg.explore_share * SETTLED_SHARE
            }
            _ => self.cfg.explore_share,
        }
    }

    /// The z statistic of the other path against the bit (`None`: too few outcomes).
    fn test(&self, cluster: u32) -> Option<f64> {
        let stats = self.stats.get(cluster as usize)?;
        let bit = decision(self.table.bits[cluster as usize]);
        let (cur, alt) = (stats[index(bit)], stats[index(other(bit))]);
        let min = f64::from(self.cfg.min_samples);
        if cur.weight < min || alt.weight < min {
            return None;
        }
        let (pc, pa) = (cur.adjusted(), alt.adjusted());
        let se = (pc * (1.0 - pc) / (cur.weight + 2.0) + pa * (1.0 - pa) / (alt.weight + 2.0))
            .sqrt()
            .max(1e-9);
        Some((pa - pc) / se)
    }

    /// Credits one finished request of `cluster`, routed by `path`, with `reward` (in [0, 1]:
    /// 1 or 0 for its own SLO, or its [`Neighbourhood`] reward); returns the change of bit it
    /// caused, if any (the table then has it).
    pub fn observe(&mut self, cluster: u32, path: Decision, reward: f64) -> Option<Flip> {
        let decay = self.decay;
        let stats = self.stats.get_mut(cluster as usize)?;
        for s in stats.iter_mut() {
            s.weight *= decay;
            s.met *= decay;
        }
        let s = &mut stats[index(path)];
        s.weight += 1.0;
        s.met += reward.clamp(0.0, 1.0);
        s.outcomes += 1;
        let z = self.test(cluster)?;
        let trusted = self.trusted(cluster);
        let bit = decision(self.table.bits[cluster as usize]);
        let to = if z > self.z_crit {
            other(bit)
        } else if z < -self.z_crit && !trusted {
            bit
        } else {
            return None;
        };
        let stats = self.stats[cluster as usize];
        let flip = Flip {
            cluster,
            to,
            gain: stats[index(to)].adjusted() - stats[index(other(to))].adjusted(),
            z: z.abs(),
            adopted: !trusted,
        };
        self.apply(flip, stats[0].outcomes + stats[1].outcomes);
        Some(flip)
    }

    fn apply(&mut self, flip: Flip, measured: u64) {
        let c = flip.cluster as usize;
        let changed = decision(self.table.bits[c]) != flip.to;
        self.table.bits[c] = u8::from(flip.to == Decision::Remote);
        if let Some(e) = self.table.evidence.get_mut(c) {
            e.requests = e.requests.max(measured).max(self.trust.min_requests);
            e.margin = Some(flip.gain.max(self.trust.min_margin));
        }
        // The cluster's load on each pool changes with its path: measure afresh.
        if changed {
            self.stats[c] = [PathStats::default(); 2];
        }
        self.flips += 1;
        self.table.provenance.date = crate::request_log::rfc3339_now();
        let p = &mut self.table.provenance;
        if !p.notes.is_empty() {
            p.notes.push_str("; ");
        }
        let _ = write!(
            p.notes,
            "online: cluster {} {} {} (+{:.3}, z {:.2}, {measured} requests)",
            flip.cluster,
            if flip.adopted { "adopted" } else { "to" },
            flip.to.as_str(),
            flip.gain,
            flip.z
        );
        // Keep the note bounded however long the router runs.
        const MAX_NOTES: usize = 4096;
        if p.notes.len() > MAX_NOTES {
            let cut = p.notes.len() - MAX_NOTES;
            let at = (cut..p.notes.len())
                .find(|&i| p.notes.is_char_boundary(i))
                .unwrap_or(p.notes.len());
            p.notes.drain(..at);
        }
    }
}

/// The split nearest `target` among `available` (fewest workers moved between or added to the
/// pools; ties go to the split with the closer prefill share, then the smaller one).
pub fn nearest_split(target: Split, available: impl IntoIterator<Item = Split>) -> Option<Split> {
    let share = |s: Split| f64::from(s.prefill) / f64::from((s.prefill + s.decode).max(1));
    available
        .into_iter()
        .filter(|s| *s != target)
        .min_by(|a, b| {
            let dist =
                |s: &Split| s.prefill.abs_diff(target.prefill) + s.decode.abs_diff(target.decode);
            dist(a)
                .cmp(&dist(b))
                .then_with(|| {
                    (share(*a) - share(target))
                        .abs()
                        .total_cmp(&(share(*b) - share(target)).abs())
                })
                .then_with(|| a.cmp(b))
        })
}

/// The table a new split starts from: `from` (the table of split `from_split`, version
/// `from_version`) under the new split's name, with its clusters and their ranges, its bits as
/// untested priors (no evidence on this split: the fallback routes each cluster until the
/// online learner adopts a path for it), and no ranges where `from` recorded none.
pub fn seed_table(from: &RoutingTable, split: Split, from_version: &str) -> RoutingTable {
    let mut t = from.clone();
    let from_split = t.split;
    t.split = split;
    let range = |c: usize| from.evidence.get(c).map_or(UNKNOWN_RANGE, |e| e.range);
    t.evidence = (0..t.k)
        .map(|c| ClusterEvidence {
            requests: 0,
            margin: None,
            range: range(c),
        })
        .collect();
    t.provenance.date = crate::request_log::rfc3339_now();
    t.provenance.notes =
        format!("online: seeded from {from_split}/{from_version}, the nearest split with a table");
    t
}

/// The range a seeded cluster gets when its table recorded none: no request is out of it.
pub const UNKNOWN_RANGE: f64 = 1e9;

/// The standard normal quantile (Acklam's rational approximation, relative error below
/// 1.2e-9 over (0, 1)).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
#[path = "online_tests.rs"]
mod tests;

//! Searches against a synthetic system where each cluster has a known better bit.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Cluster `c` meets its SLO with probability `base + gain[c]` on its better bit `opt[c]`, else
/// `base`, minus a weak contention term (`interaction` times the share of the other clusters on
/// the same path). Interactions are too weak to move the optimum away from `opt`. Counts are
/// drawn around their means (normal approximation) from a generator seeded by the call index,
/// so a resumed search can be given the same measurements by starting at the same call.
struct Synthetic {
    opt: Vec<u8>,
    gain: Vec<f64>,
    requests: Vec<u64>,
    interaction: f64,
    noise: bool,
    /// Clusters whose decode workers hold every prompt: sent remote, all are held.
    held: Vec<bool>,
    seed: u64,
    calls: u64,
}

impl Synthetic {
    fn new(k: usize, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        Synthetic {
            opt: (0..k).map(|_| rng.random_range(0..2)).collect(),
            gain: (0..k).map(|_| rng.random_range(0.2..0.4)).collect(),
            requests: (0..k).map(|_| rng.random_range(2000..4000)).collect(),
            interaction: 0.02,
            noise: true,
            held: vec![false; k],
            seed,
            calls: 0,
        }
    }

    fn expected(&self, bits: &[u8], c: usize) -> f64 {
        let k = bits.len();
        let same = bits.iter().filter(|b| **b == bits[c]).count() - 1;
        let contention = if k > 1 {
            same as f64 / (k - 1) as f64
        } else {
            0.0
        };
        let hit = if bits[c] == self.opt[c] {
            self.gain[c]
        } else {
            0.0
        };
        0.5 + hit - self.interaction * contention
    }
}

impl Evaluator for Synthetic {
    fn evaluate(&mut self, bits: &[u8]) -> Result<Period, LearnError> {
        let mut rng = SmallRng::seed_from_u64(self.seed.wrapping_mul(1_000_003) ^ self.calls);
        self.calls += 1;
        let per_cluster: Vec<(u64, u64)> = (0..bits.len())
            .map(|c| {
                let n = self.requests[c];
                let p = self.expected(bits, c);
                let mut met = n as f64 * p;
                if self.noise {
                    // Box-Muller.
                    let (u1, u2): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
                    let g = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                    met += g * (n as f64 * p * (1.0 - p)).sqrt();
                }
                (n, met.round().clamp(0.0, n as f64) as u64)
            })
            .collect();
        let (n, met) = per_cluster
            .iter()
            .fold((0, 0), |(a, b), (n, m)| (a + n, b + m));
        let attainment = met as f64 / n as f64;
        let per_cluster_held = (0..bits.len())
            .map(|c| {
                if self.held[c] && bits[c] == 1 {
                    per_cluster[c].0
                } else {
                    0
                }
            })
            .collect();
        Ok(Period {
            per_cluster,
            per_cluster_held,
            attainment,
            p90_ttft_ms: 4000.0 * (1.5 - attainment),
            p90_tpot_ms: 200.0 * (1.5 - attainment),
        })
    }
}

fn run(initial: &[u8], cfg: &SearchConfig, eval: &mut Synthetic) -> SearchResult {
    search(initial, cfg, eval, &[], &mut |_| {}).expect("search")
}

#[test]
fn the_scan_does_not_credit_remote_with_requests_their_decode_worker_held() {
    let cfg = SearchConfig {
        scan: true,
        max_rounds: 4,
        ..SearchConfig::new(2)
    };
    // Remote measures far better in cluster 0; the round after its scan shows the bit kept.
    let scanned = |held: bool| {
        let mut eval = Synthetic::new(2, 3);
        eval.opt[0] = 1;
        eval.held[0] = held;
        run(&[0, 0], &cfg, &mut eval).history[3].bits[0]
    };
    assert_eq!(
        scanned(false),
        1,
        "an ordinary cluster takes the better bit"
    );
    assert_eq!(
        scanned(true),
        0,
        "every remote request was held: the path never changed"
    );
}

#[test]
fn finds_the_optimum() {
    for k in [1, 2, 4, 8] {
        for seed in 0..6 {
            for scan in [true, false] {
                let mut eval = Synthetic::new(k, seed);
                eval.noise = seed % 2 == 0;
                // Without the scan, exploration is by random flips: give it the patience to
                // try every cluster (with patience 8 it sometimes stops short).
                let cfg = SearchConfig {
                    scan,
                    seed,
                    max_rounds: 200,
                    patience: if scan { 8 } else { 60 },
                    ..SearchConfig::new(k)
                };
                // From the worst table: every cluster on its worse bit.
                let worst: Vec<u8> = eval.opt.iter().map(|b| 1 - b).collect();
                let r = run(&worst, &cfg, &mut eval);
                assert_eq!(r.bits, eval.opt, "k {k} seed {seed} scan {scan}");
                assert_eq!(r.rounds as usize, r.history.len());
                assert_eq!(r.history[r.converged_round as usize].bits, r.bits);
                assert_eq!(r.history.last().map(|h| &h.best_bits), Some(&r.bits));
                if scan {
                    for (c, round) in r.history[1..=2 * k].iter().enumerate() {
                        let bit = (c % 2) as u8;
                        assert_eq!(
                            round.phase,
                            Phase::Scan {
                                cluster: c / 2,
                                bit
                            }
                        );
                        assert_eq!(round.bits[c / 2], bit);
                    }
                }
            }
        }
    }
}

/// Over `seeds` systems with K clusters, starting all local: the mean converged round, the
/// mean first round whose best table is the optimum (a search that stops without finding it
/// counts as `max_rounds`: it would take at least that long), and how often it was found.
fn converge_stats(k: usize, scan: bool, seeds: u64) -> (f64, f64, u64) {
    let (mut converged, mut to_optimum, mut found) = (0.0, 0.0, 0);
    for seed in 0..seeds {
        let mut eval = Synthetic::new(k, 100 + seed);
        let cfg = SearchConfig {
            scan,
            seed,
            ..SearchConfig::new(k)
        };
        let r = run(&vec![0; k], &cfg, &mut eval);
        converged += f64::from(r.converged_round);
        let first = r.history.iter().find(|h| h.best_bits == eval.opt);
        to_optimum += f64::from(first.map_or(cfg.max_rounds, |h| h.round));
        found += u64::from(r.bits == eval.opt);
    }
    let n = seeds as f64;
    (converged / n, to_optimum / n, found)
}

#[test]
fn k8_converges_within_30_rounds_and_the_scan_is_reliable() {
    let seeds = 40;
    let (conv_scan, opt_scan, found_scan) = converge_stats(8, true, seeds);
    let (conv_no, opt_no, found_no) = converge_stats(8, false, seeds);
    println!(
        "K=8 over {seeds} seeds, rounds to the optimum (not found: 60) / converged round / \
         optimum found: with scan {opt_scan:.1} / {conv_scan:.1} / {found_scan}; \
         without scan {opt_no:.1} / {conv_no:.1} / {found_no}"
    );
    for seed in 0..10 {
        let mut eval = Synthetic::new(8, 100 + seed);
        let r = run(&[0; 8], &SearchConfig::new(8), &mut eval);
        assert!(
            r.converged_round <= 30,
            "seed {seed}: {}",
            r.converged_round
        );
        assert!(r.rounds <= 60);
    }
    assert_eq!(found_scan, seeds);
    // Refinement never re-measures a table when it can help it, so without the scan it often
    // reaches the optimum about as fast; what the scan buys is reliability: it always finds
    // it, while refinement alone sometimes stops early on a worse table.
    assert!(found_scan >= found_no, "{found_scan} vs {found_no}");
    assert!(opt_scan <= 30.0, "{opt_scan}");
}

#[test]
fn resume_gives_the_identical_result() {
    let k = 6;
    let cfg = SearchConfig {
        seed: 7,
        ..SearchConfig::new(k)
    };
    let initial = vec![0, 1, 0, 1, 0, 1];
    let mut eval = Synthetic::new(k, 3);
    let mut seen = Vec::new();
    let full = search(&initial, &cfg, &mut eval, &[], &mut |r| {
        seen.push(r.clone())
    })
    .unwrap();
    assert_eq!(seen, full.history);
    assert!(full.history.len() > 2 * k + 2, "refinement ran");
    // The log as JSON lines, read back.
    let lines: Vec<String> = full
        .history
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    assert!(lines[1].contains(r#""phase":{"kind":"scan","cluster":0,"bit":0}"#));
    for cut in [0, 1, 5, 2 * k + 1, 2 * k + 3, full.history.len()] {
        let logged: Vec<Round> = lines[..cut]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // The system goes on from where the interrupted run left it.
        let mut eval = Synthetic::new(k, 3);
        eval.calls = cut as u64;
        let mut new = Vec::new();
        let r = search(&initial, &cfg, &mut eval, &logged, &mut |r| {
            new.push(r.round)
        })
        .unwrap();
        assert_eq!(r.bits, full.bits, "cut {cut}");
        assert_eq!(r.converged_round, full.converged_round);
        assert_eq!(r.rounds, full.rounds);
        let bits: Vec<_> = r.history.iter().map(|h| &h.bits).collect();
        let full_bits: Vec<_> = full.history.iter().map(|h| &h.bits).collect();
        assert_eq!(bits, full_bits);
        assert_eq!(
            eval.calls,
            u64::from(full.rounds),
            "replayed rounds not measured"
        );
        assert_eq!(new, (cut as u32..full.rounds).collect::<Vec<_>>());
        // In memory (no JSON float rounding) the result is identical field for field.
        let mut eval = Synthetic::new(k, 3);
        eval.calls = cut as u64;
        let r = search(&initial, &cfg, &mut eval, &full.history[..cut], &mut |_| {}).unwrap();
        assert_eq!(r, full);
    }
}

#[test]
fn resume_refuses_foreign_logs() {
    let k = 4;
    let cfg = SearchConfig::new(k);
    let mut eval = Synthetic::new(k, 5);
    let full = run(&[0; 4], &cfg, &mut eval);
    let resume = |initial: &[u8], cfg: &SearchConfig, log: &[Round]| {
        search(initial, cfg, &mut Synthetic::new(k, 5), log, &mut |_| {})
    };
    // Other initial bits: round 0 measured something else.
    let e = resume(&[1; 4], &cfg, &full.history[..3]).unwrap_err();
    assert!(matches!(e, LearnError::Resume(_)), "{e}");
    // Another configuration: no scan.
    let no_scan = SearchConfig {
        scan: false,
        ..cfg.clone()
    };
    assert!(matches!(
        resume(&[0; 4], &no_scan, &full.history[..3]),
        Err(LearnError::Resume(_))
    ));
    // Wrong lengths, missing counts, rounds out of order.
    let mut bad = full.history[..2].to_vec();
    bad[1].per_cluster.clear();
    assert!(matches!(
        resume(&[0; 4], &cfg, &bad),
        Err(LearnError::Resume(_))
    ));
    let mut bad = full.history[..2].to_vec();
    bad.swap(0, 1);
    assert!(matches!(
        resume(&[0; 4], &cfg, &bad),
        Err(LearnError::Resume(_))
    ));
    // More rounds than this search runs.
    let short = SearchConfig {
        max_rounds: 3,
        ..cfg.clone()
    };
    assert!(matches!(
        resume(&[0; 4], &short, &full.history),
        Err(LearnError::Resume(_))
    ));
}

#[test]
fn k_mismatches_and_bad_periods_are_errors() {
    let cfg = SearchConfig::new(4);
    let mut eval = Synthetic::new(4, 1);
    let e = search(&[0; 3], &cfg, &mut eval, &[], &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            e,
            LearnError::KMismatch {
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{e}"
    );
    // An evaluator that measures 3 clusters.
    struct Short;
    impl Evaluator for Short {
        fn evaluate(&mut self, _: &[u8]) -> Result<Period, LearnError> {
            Ok(Period {
                per_cluster: vec![(10, 5); 3],
                per_cluster_held: Vec::new(),
                attainment: 0.5,
                p90_ttft_ms: 1.0,
                p90_tpot_ms: 1.0,
            })
        }
    }
    let e = search(&[0; 4], &cfg, &mut Short, &[], &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            e,
            LearnError::KMismatch {
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(search(&[0, 2, 0, 0], &cfg, &mut Short, &[], &mut |_| {}).is_err());
    let bad = SearchConfig {
        epsilon: 1.5,
        ..cfg.clone()
    };
    assert!(search(&[0; 4], &bad, &mut Short, &[], &mut |_| {}).is_err());
}

#[test]
fn empty_clusters_keep_their_bit_and_the_limits_hold() {
    // Cluster 1 never gets requests: the scan keeps its bit, rewards say None.
    let mut eval = Synthetic::new(3, 9);
    eval.requests[1] = 0;
    let cfg = SearchConfig {
        max_rounds: 7,
        ..SearchConfig::new(3)
    };
    let r = run(&[0, 1, 0], &cfg, &mut eval);
    assert_eq!(r.rounds, 7, "exactly the scan: round 0 and 2K = 6");
    assert_eq!(r.bits[1], 1);
    assert!(r.history.iter().all(|h| h.per_cluster_reward[1].is_none()));
    // Patience 0: no refinement at all.
    let cfg = SearchConfig {
        patience: 0,
        ..SearchConfig::new(3)
    };
    let r = run(&[0, 1, 0], &cfg, &mut Synthetic::new(3, 9));
    assert_eq!(r.rounds, 7);
}

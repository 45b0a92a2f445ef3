use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dolphin::table::tests::kmeans_table;
use crate::policy::{FallbackKind, Features, PoolState};

fn reward(met: bool) -> f64 {
    if met { 1.0 } else { 0.0 }
}

fn share(explore_share: f64) -> OnlineConfig {
    OnlineConfig {
        explore_share,
        ..cfg()
    }
}

fn cfg() -> OnlineConfig {
    OnlineConfig {
        enabled: true,
        ..OnlineConfig::default()
    }
}

#[test]
fn exploration_takes_exactly_its_share_of_each_cluster() {
    for share in [0.0, 0.01, 0.05, 0.2, 0.5] {
        let e = Explorer::new(&self::share(share), 3);
        for cluster in 0..3 {
            let n = (0..10_000).filter(|_| e.explore(cluster)).count();
            let want = (10_000.0 * share) as usize;
            assert!(n.abs_diff(want) <= 1, "share {share}: {n} of 10000");
        }
        assert!(!e.explore(3), "a cluster the table does not have");
    }
}

#[test]
fn explore_flips_only_what_the_table_decided() {
    let e = Explorer::new(&share(0.5), 2);
    let route = |decided_by| Route {
        features: Features::default(),
        decision: Decision::Local,
        decided_by,
        cluster: Some(0),
        table_version: None,
    };
    let mut flipped = 0;
    for _ in 0..4 {
        let mut r = route(DecidedBy::Table);
        if explore(&mut r, PoolState::IDLE, &e) {
            assert_eq!(
                (r.decision, r.decided_by),
                (Decision::Remote, DecidedBy::Explored)
            );
            flipped += 1;
        }
    }
    assert_eq!(flipped, 2);
    // Nor what the table's load rule decided: the bit did not, so the learner neither
    // explores nor learns from it.
    for by in [
        DecidedBy::Forced,
        DecidedBy::Fallback(FallbackKind::Threshold),
        DecidedBy::Distrusted(FallbackKind::Threshold, Distrust::OutOfRange),
        DecidedBy::TableLoad,
    ] {
        for _ in 0..4 {
            let mut r = route(by);
            assert!(!explore(&mut r, PoolState::IDLE, &e), "{by:?}");
            assert_eq!(r.decision, Decision::Local);
        }
    }
    assert!(!learns_from(DecidedBy::TableLoad));
    assert!(learns_from(DecidedBy::Table));
    // Never remote without a prefill worker, nor onto one with more than a step waiting.
    let unavailable = PoolState {
        available: false,
        ..PoolState::IDLE
    };
    let busy = PoolState {
        pending_tokens: 4097,
        max_batched_tokens: 4096,
        ..PoolState::IDLE
    };
    for _ in 0..4 {
        assert!(!explore(&mut route(DecidedBy::Table), busy, &e));
    }
    for _ in 0..4 {
        assert!(!explore(&mut route(DecidedBy::Table), unavailable, &e));
    }
    // Never local for a prompt of more uncached tokens than the limit.
    let long = |uncached| Route {
        decision: Decision::Remote,
        features: Features {
            eff_isl_decode: uncached,
            ..Features::default()
        },
        ..route(DecidedBy::Table)
    };
    assert_eq!(
        (0..4)
            .filter(|_| explore(&mut long(2049), PoolState::IDLE, &e))
            .count(),
        0
    );
    assert_eq!(
        (0..4)
            .filter(|_| explore(&mut long(2048), PoolState::IDLE, &e))
            .count(),
        2
    );
    // Except for a cluster without evidence while its prefill worker is busy: remote is then
    // the costly path, and the one its learner must compare against.
    let untested = |uncached| Route {
        decided_by: DecidedBy::Distrusted(FallbackKind::Threshold, Distrust::ThinEvidence),
        ..long(uncached)
    };
    let trials =
        |r: &dyn Fn() -> Route, pools| (0..4).filter(|_| explore(&mut r(), pools, &e)).count();
    assert_eq!(trials(&|| untested(8192), busy), 2);
    assert_eq!(trials(&|| untested(8192), PoolState::IDLE), 0);
    assert_eq!(
        trials(&|| long(8192), busy),
        0,
        "a trusted bit's long prompts stay remote"
    );
    let explored = {
        let mut r = untested(8192);
        while !explore(&mut r, busy, &e) {}
        r
    };
    assert_eq!(
        (explored.decision, explored.decided_by),
        (Decision::Local, DecidedBy::Explored)
    );
}

#[test]
fn a_significantly_better_path_flips_the_bit_and_noise_does_not() {
    let mut rng = SmallRng::seed_from_u64(7);
    // Cluster 0: local (its bit) meets 60%, remote 90%. Cluster 1: both 80%.
    let mut l = OnlineLearner::new(
        cfg(),
        TrustConfig::default(),
        kmeans_table(Split::new(2, 2), [0, 0]),
    );
    let e = Explorer::new(&share(0.05), 2);
    let mut flips = Vec::new();
    for i in 0..20_000 {
        let cluster = i % 2;
        let bit = l.table().bits[cluster as usize];
        let path = if e.explore(cluster) {
            other(decision(bit))
        } else {
            decision(bit)
        };
        let p = match (cluster, path) {
            (0, Decision::Local) => 0.6,
            (0, Decision::Remote) => 0.9,
            _ => 0.8,
        };
        if let Some(f) = l.observe(cluster, path, reward(rng.random_bool(p))) {
            flips.push((i, f));
        }
    }
    assert_eq!(flips.len(), 1, "{flips:?}");
    let (at, f) = flips[0];
    assert_eq!((f.cluster, f.to), (0, Decision::Remote));
    assert!(f.gain > 0.1 && f.z > normal_quantile(0.95), "{f:?}");
    // 30 explored outcomes at 5% of cluster 0's requests: about 1200 requests of it.
    assert!(at < 4000, "flipped after {at} requests");
    assert_eq!(l.table().bits, vec![1, 0]);
    assert!(l.table().provenance.notes.contains("cluster 0 to remote"));
    assert_eq!(l.flips(), 1);
}

#[test]
fn a_flip_records_its_evidence_and_restarts_the_estimates() {
    let mut t = kmeans_table(Split::new(3, 1), [1, 0]);
    t.evidence = vec![
        ClusterEvidence {
            requests: 50,
            margin: Some(0.05),
            range: 1.0,
        };
        2
    ];
    let mut l = OnlineLearner::new(cfg(), TrustConfig::default(), t);
    let mut flip = None;
    for i in 0..200 {
        // Remote (the bit) always misses, local always meets.
        flip = flip.or(l.observe(0, Decision::Remote, 0.0));
        if i % 2 == 0 {
            flip = flip.or(l.observe(0, Decision::Local, 1.0));
        }
        if flip.is_some() {
            break;
        }
    }
    let f = flip.expect("flipped");
    assert_eq!((f.to, f.adopted), (Decision::Local, false));
    let e = l.table().evidence[0];
    assert!(e.requests >= 60 && e.margin == Some(f.gain), "{e:?}");
    assert_eq!(
        l.table().evidence[1].margin,
        Some(0.05),
        "other clusters untouched"
    );
    let s = l.stats(0).expect("cluster 0");
    assert_eq!(s, [PathStats::default(); 2], "restarted at the flip");
    // The learned table is a valid table.
    let json = serde_json::to_string(l.table()).expect("json");
    RoutingTable::from_json(&json).expect("valid");
}

#[test]
fn old_outcomes_fade() {
    let c = OnlineConfig {
        half_life: 100,
        min_samples: 10,
        ..cfg()
    };
    let mut l = OnlineLearner::new(
        c,
        TrustConfig::default(),
        kmeans_table(Split::new(1, 1), [0, 0]),
    );
    for _ in 0..100 {
        l.observe(1, Decision::Local, 1.0);
    }
    let w = l.stats(1).expect("stats")[0].weight;
    // Sum of 0.5^(i/100) for i < 100: about 72.
    assert!((70.0..75.0).contains(&w), "{w}");
    assert_eq!(l.stats(1).expect("stats")[0].outcomes, 100);
    assert!(
        l.observe(9, Decision::Local, 1.0).is_none(),
        "no such cluster"
    );
}

#[test]
fn met_follows_the_tables_reward() {
    let slo = TableSlo {
        ttft_ms: 1000.0,
        tpot_ms: 100.0,
    };
    // A slow first token made up by fast decoding meets e2e, not per-metric.
    assert!(met(slo, Reward::E2e, 1500.0, 40.0, 1500.0 + 9.0 * 40.0, 10));
    assert!(!met(slo, Reward::PerMetric, 1500.0, 40.0, 1860.0, 10));
    assert!(met(slo, Reward::PerMetric, 900.0, 99.0, 1791.0, 10));
    assert!(!met(
        slo,
        Reward::E2e,
        900.0,
        120.0,
        900.0 + 9.0 * 120.0,
        10
    ));
}

#[test]
fn the_nearest_split_seeds_a_new_one() {
    let have = [Split::new(2, 2), Split::new(1, 3), Split::new(4, 4)];
    assert_eq!(
        nearest_split(Split::new(3, 1), have),
        Some(Split::new(2, 2))
    );
    assert_eq!(
        nearest_split(Split::new(1, 2), have),
        Some(Split::new(1, 3))
    );
    // 2p3d is one worker from 2p2d and from 1p3d: 2p2d's prefill share (0.5) is nearer 0.4.
    assert_eq!(
        nearest_split(Split::new(2, 3), have),
        Some(Split::new(2, 2))
    );
    assert_eq!(nearest_split(Split::new(2, 2), [Split::new(2, 2)]), None);
    // Equal distance: the closer prefill share wins (3p3d: 2p2d and 4p4d are both 2 away).
    assert_eq!(
        nearest_split(Split::new(3, 3), [Split::new(4, 4), Split::new(2, 4)]),
        Some(Split::new(4, 4))
    );
    let t = kmeans_table(Split::new(2, 2), [1, 0]);
    let s = seed_table(&t, Split::new(3, 1), "v4");
    assert_eq!(
        (s.split, s.bits.clone()),
        (Split::new(3, 1), t.bits.clone())
    );
    assert!(s.provenance.notes.contains("seeded from 2p2d/v4"));
}

#[test]
fn normal_quantiles() {
    for (p, z) in [
        (0.5, 0.0),
        (0.95, 1.644_853_6),
        (0.975, 1.959_964),
        (0.01, -2.326_347_9),
    ] {
        assert!((normal_quantile(p) - z).abs() < 1e-6, "{p}");
    }
}

#[test]
fn settings_are_checked() {
    assert!(OnlineConfig::default().validate().is_ok());
    let bad = |f: fn(&mut OnlineConfig)| {
        let mut c = OnlineConfig::default();
        f(&mut c);
        c.validate().is_err()
    };
    assert!(bad(|c| c.explore_share = 0.6));
    assert!(bad(|c| c.explore_share = f64::NAN));
    assert!(bad(|c| c.confidence = 0.3));
    assert!(bad(|c| c.min_samples = 0));
    assert!(bad(|c| c.half_life = 10));
}

#[test]
fn a_cluster_the_fallback_routes_adopts_the_path_with_evidence_and_is_trusted() {
    // Seeded from another split: no evidence, so the fallback routes both clusters.
    let t = seed_table(
        &kmeans_table(Split::new(2, 2), [0, 0]),
        Split::new(3, 1),
        "v1",
    );
    assert!(
        t.evidence
            .iter()
            .all(|e| e.requests == 0 && e.range == UNKNOWN_RANGE)
    );
    let mut l = OnlineLearner::new(cfg(), TrustConfig::default(), t);
    assert!(!l.trusted(0) && !l.trusted(1));
    // Cluster 0: local (the prior bit) is the better path; cluster 1: remote is.
    let mut adopted = Vec::new();
    for i in 0..400 {
        let met = i % 4 != 0;
        adopted.extend(l.observe(0, Decision::Local, reward(met)));
        adopted.extend(l.observe(0, Decision::Remote, reward(i % 4 == 0)));
        adopted.extend(l.observe(1, Decision::Local, reward(i % 4 == 0)));
        adopted.extend(l.observe(1, Decision::Remote, reward(met)));
    }
    assert_eq!(adopted.len(), 2, "{adopted:?}");
    assert!(adopted.iter().all(|f| f.adopted));
    assert_eq!(l.table().bits, vec![0, 1]);
    assert!(l.trusted(0) && l.trusted(1));
    let e = l.table().evidence[1];
    assert!(
        e.requests >= 20 && e.margin.is_some_and(|m| m > 0.3),
        "{e:?}"
    );
    assert!(
        l.table()
            .provenance
            .notes
            .contains("cluster 0 adopted local")
    );
    // A settled cluster explores at a fifth of the share.
    assert_eq!(l.share(0), cfg().explore_share * SETTLED_SHARE);
    let fresh = OnlineLearner::new(
        cfg(),
        TrustConfig::default(),
        kmeans_table(Split::new(1, 1), [0, 0]),
    );
    assert_eq!(fresh.share(0), cfg().explore_share);
    let e = Explorer::new(&share(0.5), 1);
    e.set_share(0, 0.25);
    assert_eq!((0..100).filter(|_| e.explore(0)).count(), 25);
}

#[test]
fn the_neighbourhood_reward_counts_what_finished_beside_a_request() {
    let mut n = Neighbourhood::default();
    // Worker 0: three requests finish, two met; worker 1 has its own.
    assert_eq!(n.complete(0, 0.0, 10.0, true), 1.0);
    assert_eq!(n.complete(0, 0.0, 20.0, false), 0.5);
    assert_eq!(n.complete(1, 0.0, 25.0, false), 0.0);
    // In flight from 15 to 30: the one that finished at 20 (missed) and itself (met).
    assert_eq!(n.complete(0, 15.0, 30.0, true), 0.5);
    // In flight from 25 to 40: the one that finished at 30 (met) and itself (missed).
    assert_eq!(n.complete(0, 25.0, 40.0, false), 0.5);
    // In flight from 35: only itself.
    assert_eq!(n.complete(0, 35.0, 45.0, false), 0.0);
    n.forget(&0);
    assert_eq!(n.complete(0, 0.0, 50.0, true), 1.0);
    // Bounded.
    for i in 0..(Neighbourhood::<u32>::KEEP + 10) {
        n.complete(2, 0.0, i as f64, true);
    }
    assert_eq!(n.workers[&2].len(), Neighbourhood::<u32>::KEEP);
}

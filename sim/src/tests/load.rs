//! Load as the router sees it: periodic reports, plus its own in-flight count on decode
//! workers only.

use dolphin_router::policy::Policy;

use super::*;

/// Two remote requests of 4000 tokens, the second `gap_ms` after the first, on two prefill
/// workers; which prefill workers they got, for tie-breaking seeds 1..=20.
fn prefill_workers(load_interval_ms: f64, gap_ms: f64) -> Vec<(Option<u32>, Option<u32>)> {
    (1..=20)
        .map(|seed| {
            let mut cfg = SimClusterConfig::new(2, 1, profile());
            cfg.policy = Policy::AlwaysRemote;
            cfg.load_interval_ms = load_interval_ms;
            cfg.seed = seed;
            let mut sim = SimCluster::new(cfg).expect("valid");
            let reqs = [
                req(0.0, &tokens(1, 4000), 4),
                req(gap_ms, &tokens(2, 4000), 4),
            ];
            let r = run(&mut sim, &reqs);
            (r.records[0].prefill_worker, r.records[1].prefill_worker)
        })
        .collect()
}

#[test]
fn instant_reports_spread_a_burst_over_prefill_workers() {
    for (a, b) in prefill_workers(0.0, 1.0) {
        assert_ne!(a, b, "the second request sees the first one's load");
    }
}

#[test]
fn between_reports_the_router_does_not_see_prefill_load() {
    // The router counts no in-flight prompts on prefill workers: until the next report both
    // look idle, so the tie-break alone decides (20 seeds all splitting: chance 2^-19).
    let picks = prefill_workers(100.0, 1.0);
    assert!(picks.iter().any(|(a, b)| a == b), "{picks:?}");
    // After a report (at 100 ms; the first prefill takes over a second) it does.
    for (a, b) in prefill_workers(100.0, 150.0) {
        assert_ne!(a, b);
    }
}

#[test]
fn the_router_counts_its_own_prompts_on_decode_workers_between_reports() {
    for seed in 1..=20 {
        let mut cfg = SimClusterConfig::new(0, 2, profile());
        cfg.seed = seed;
        let mut sim = SimCluster::new(cfg).expect("valid");
        let reqs = [req(0.0, &tokens(1, 4000), 4), req(1.0, &tokens(2, 4000), 4)];
        let r = run(&mut sim, &reqs);
        assert_ne!(r.records[0].decode_worker, r.records[1].decode_worker);
    }
}

#[test]
fn reports_do_not_extend_the_run_and_bad_intervals_are_refused() {
    let p = profile();
    let mut sim = cluster(1, 1, Policy::AlwaysLocal);
    let r = run(&mut sim, &[req(0.0, &tokens(1, 1000), 1)]);
    // One local step: the run ends with it, not at the next load report (100 ms).
    assert!(close(r.records[0].e2e_ms, p.prefill_ms(1000)));
    assert!(
        close(r.makespan_ms, p.prefill_ms(1000)),
        "{}",
        r.makespan_ms
    );
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let mut cfg = SimClusterConfig::new(1, 1, p.clone());
        cfg.load_interval_ms = bad;
        assert!(SimCluster::new(cfg).is_err(), "{bad}");
    }
}

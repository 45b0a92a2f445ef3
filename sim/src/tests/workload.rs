//! Workloads from `dolphin_workload`: hash-id prompts, closed-loop arrivals, and outcomes that
//! summarise like the report.

use std::path::Path;

use dolphin_workload::{
    Arrivals, RequestKind, Summary, Workload, WorkloadRequest, synthetic, trace,
};

use super::*;

fn mooncake_like() -> Workload {
    let row = |arrival_ms: f64, ids: &[u64], prompt_len: u32| WorkloadRequest {
        arrival_ms,
        hash_ids: ids.to_vec(),
        prompt_len,
        output_len: 4,
        kind: RequestKind::Mooncake,
    };
    Workload {
        skipped_rows: 0,
        name: "mooncake-like".into(),
        tokens_per_id: 512,
        requests: vec![
            // A conversation: the second turn extends the first; the third request shares
            // only the system prompt (id 0).
            row(0.0, &[0, 1, 2], 1400),
            row(60_000.0, &[0, 1, 2, 3], 1800),
            row(120_000.0, &[0, 4], 700),
        ],
    }
}

/// Leading equal elements.
fn common<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn from_workload_shares_prefixes_as_the_hash_ids_do() {
    let w = mooncake_like();
    let reqs = SimRequest::from_workload(&w, SLO, BS);
    assert_eq!(reqs.len(), 3);
    for (r, wr) in reqs.iter().zip(&w.requests) {
        assert_eq!(
            (r.arrival_ms, r.prompt_len, r.output_len),
            (wr.arrival_ms, wr.prompt_len, 4)
        );
        assert_eq!((r.kind, r.slo), (RequestKind::Mooncake, SLO));
        assert_eq!(r.hashes.len() as u32, wr.prompt_len / BS);
    }
    // 1400 tokens: 87 full blocks, all inside the shared ids.
    assert_eq!(common(&reqs[0].hashes, &reqs[1].hashes), 87);
    // One shared id: 512 tokens, 32 blocks.
    assert_eq!(common(&reqs[0].hashes, &reqs[2].hashes), 32);

    // The simulated caches see it: each request prefills only what it does not share.
    let r = run(&mut cluster(0, 1, Policy::AlwaysLocal), &reqs);
    let uncached: Vec<u32> = r
        .records
        .iter()
        .map(|x| x.features.eff_isl_decode)
        .collect();
    assert_eq!(uncached, [1400, 1800 - 87 * BS, 700 - 32 * BS]);
    assert!(r.records.iter().all(|x| x.kind == RequestKind::Mooncake));
}

#[test]
fn the_real_mooncake_trace_shares_blocks_exactly_where_it_shares_ids() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces/mooncake-conversation.jsonl");
    if !path.exists() {
        eprintln!("skipping: {} is absent", path.display());
        return;
    }
    let mut w = trace::mooncake(&path).expect("loads");
    w.truncate(1000);
    let reqs = SimRequest::from_workload(&w, SLO, BS);
    let per_id = (w.tokens_per_id / BS) as usize;
    // Compare each request with the one before it and with the last one that began with the
    // same two ids (an earlier turn of its conversation).
    let mut last_by_head = std::collections::HashMap::new();
    let mut shared_pairs = 0;
    for i in 1..reqs.len() {
        let a = &w.requests[i];
        let head = last_by_head.insert(a.hash_ids.get(..2).map(<[u64]>::to_vec), i);
        for j in [Some(i - 1), head.filter(|_| a.hash_ids.len() >= 2)]
            .into_iter()
            .flatten()
        {
            let b = &w.requests[j];
            let ids = common(&a.hash_ids, &b.hash_ids);
            let blocks = common(&reqs[i].hashes, &reqs[j].hashes);
            let expect = (ids * per_id)
                .min(reqs[i].hashes.len())
                .min(reqs[j].hashes.len());
            assert_eq!(blocks, expect, "requests {j} and {i} share {ids} ids");
            shared_pairs += usize::from(ids > 1);
        }
    }
    assert!(
        shared_pairs > 150,
        "{shared_pairs} pairs share more than the first id"
    );
}

/// Hybrid requests with an SLO, for the runs below.
fn hybrid(n: usize, seed: u64) -> Vec<SimRequest> {
    SimRequest::from_workload(&synthetic::hybrid(n, seed), SLO, BS)
}

#[test]
fn closed_loop_keeps_concurrency_in_flight_and_finishes_everything() {
    const C: usize = 4;
    let reqs = hybrid(60, 1);
    let mut sim = cluster(1, 2, Policy::Threshold(Default::default()));
    let r = sim.run_closed(&reqs, C as u32).expect("runs");
    assert_eq!(r.records.len(), reqs.len());
    for x in &r.records {
        assert!(
            x.ttft_ms > 0.0 && x.e2e_ms >= x.ttft_ms && x.e2e_ms.is_finite(),
            "{x:?}"
        );
    }
    let start: Vec<f64> = r.records.iter().map(|x| x.arrival_ms).collect();
    assert!(start[..C].iter().all(|&t| t == 0.0));
    assert!(start[C] > 0.0);
    // Released in input order, each when an earlier request completes: the k-th completion
    // releases request C + k.
    assert!(start.windows(2).all(|p| p[0] <= p[1]));
    let mut done: Vec<f64> = r.records.iter().map(|x| x.arrival_ms + x.e2e_ms).collect();
    done.sort_by(f64::total_cmp);
    for (k, &t) in start[C..].iter().enumerate() {
        assert!(
            close(t, done[k]),
            "request {} released at {t}, completion {k} at {}",
            C + k,
            done[k]
        );
    }
    // Sweep the intervals: never more than C in flight (a completion at t frees its slot
    // before a release at t takes it), and C at the start.
    let mut edges: Vec<(f64, i32)> = start
        .iter()
        .map(|&t| (t, 1))
        .chain(done.iter().map(|&t| (t, -1)))
        .collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    assert_eq!((most, now), (C as i32, 0));
    // Arrival times in the input are ignored; a concurrency of everything is an open run
    // with every arrival at 0.
    let mut late = reqs.clone();
    late.iter_mut().for_each(|x| x.arrival_ms = 1e9);
    assert_eq!(sim.run_closed(&late, C as u32).expect("runs"), r);
    let mut zero = reqs.clone();
    zero.iter_mut().for_each(|x| x.arrival_ms = 0.0);
    let all = sim.run_closed(&reqs, 1000).expect("runs");
    assert_eq!(all, sim.run(&zero).expect("runs"));
    // Saturated: more in flight, a longer wait for the first token.
    assert!(all.ttft.mean > r.ttft.mean);
    assert!(sim.run_closed(&reqs, 0).is_err());
    assert_eq!(sim.run_closed(&[], 3).expect("runs").records.len(), 0);
}

#[test]
fn outcomes_summarise_like_the_report() {
    let mut w = synthetic::hybrid(90, 2);
    Arrivals::parse("poisson:0.5:3")
        .expect("valid")
        .apply(&mut w);
    let reqs = SimRequest::from_workload(&w, Slo::new(3000.0, 100.0), BS);
    let mut sim = cluster(1, 2, Policy::Threshold(Default::default()));
    let r = run(&mut sim, &reqs);
    let outcomes = r.outcomes();
    assert_eq!(outcomes.len(), reqs.len());
    assert!(
        outcomes
            .iter()
            .enumerate()
            .all(|(i, o)| o.index as usize == i && o.kind == w.requests[i].kind)
    );
    let s = Summary::of(&outcomes);
    assert_eq!((s.ttft, s.tpot, s.e2e), (r.ttft, r.tpot, r.e2e));
    assert_eq!(
        (s.attainment, s.attainment_each),
        (r.attainment, r.attainment_each)
    );
    // The SLO is tight enough that some requests miss it.
    assert!(r.attainment > 0.0 && r.attainment < 1.0, "{}", r.attainment);
    assert_eq!(s.per_cluster, r.per_cluster);
    assert_eq!((s.remote, s.completed, s.requests), (r.remote, 90, 90));
    // The first request arrives at 0, so the makespans agree too.
    assert!(
        close(s.makespan_ms, r.makespan_ms),
        "{} vs {}",
        s.makespan_ms,
        r.makespan_ms
    );
    let kinds: Vec<(RequestKind, u64)> = s.per_kind.iter().map(|k| (k.kind, k.requests)).collect();
    assert_eq!(
        kinds,
        [
            (RequestKind::Arxiv, 30),
            (RequestKind::Leval, 30),
            (RequestKind::Humaneval, 30)
        ]
    );
    let o = outcomes[5];
    let rec = r.records[5];
    assert_eq!(
        o.features,
        [
            rec.features.isl,
            rec.features.eff_isl_prefill,
            rec.features.eff_isl_decode,
            rec.features.output_len_hint
        ]
    );
    assert_eq!(
        (o.sent_ms, o.prompt_tokens, o.remote),
        (
            rec.arrival_ms,
            reqs[5].prompt_len,
            rec.decision == Decision::Remote
        )
    );
}

//! Behaviour of the whole simulator against closed-form numbers of the profile.

use dolphin_engine::SimProfile;
use dolphin_router::dolphin::CompiledTable;
use dolphin_router::policy::{Decision, DolphinConfig, Policy, PrefillPath};

use crate::{
    PrefixLookup, SchedulerModel, SimCluster, SimClusterConfig, SimReport, SimRequest, Slo,
};

mod load;
mod taichi;
mod workload;

const BS: u32 = 16;
const SLO: Slo = Slo::new(5000.0, 250.0);

fn profile() -> SimProfile {
    SimProfile::builtin("qwen72b-h20").expect("shipped profile")
}

fn cluster(prefill: u32, decode: u32, policy: Policy) -> SimCluster {
    let mut cfg = SimClusterConfig::new(prefill, decode, profile());
    cfg.policy = policy;
    SimCluster::new(cfg).expect("valid config")
}

/// `len` tokens unique to `seed` (distinct seeds share no block).
fn tokens(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| seed * 1_000_003 + i).collect()
}

fn req(arrival_ms: f64, prompt: &[u32], output: u32) -> SimRequest {
    SimRequest::from_tokens(arrival_ms, prompt, output, SLO, BS)
}

fn run(sim: &mut SimCluster, reqs: &[SimRequest]) -> SimReport {
    sim.run(reqs).expect("runs")
}

/// Decode time of steps 1..output of a lone sequence with a `prompt`-token prompt: step i
/// computes position prompt + i - 1, so its table covers prompt + i tokens.
fn lone_decode_ms(p: &SimProfile, total_blocks: u32, prompt: u32, output: u32) -> f64 {
    (1..output)
        .map(|i| {
            let blocks = (prompt + i).div_ceil(BS);
            p.decode_ms(1, f64::from(blocks) / f64::from(total_blocks))
        })
        .sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn a_lone_local_request_takes_the_profile_closed_form_time() {
    let p = profile();
    let mut sim = cluster(1, 1, Policy::AlwaysLocal);
    let r = run(&mut sim, &[req(100.0, &tokens(1, 1000), 10)]);
    let rec = r.records[0];
    assert_eq!(rec.decision, Decision::Local);
    assert!(
        close(rec.ttft_ms, p.prefill_ms(1000)),
        "{} vs {}",
        rec.ttft_ms,
        p.prefill_ms(1000)
    );
    let decode = lone_decode_ms(&p, 8192, 1000, 10);
    assert!(close(rec.tpot_ms, decode / 9.0));
    assert!(close(rec.e2e_ms, p.prefill_ms(1000) + decode));
    assert!(rec.met);
    assert_eq!(r.attainment, 1.0);
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_of_the_step_budget() {
    let p = profile();
    let mut sim = cluster(0, 1, Policy::AlwaysLocal);
    let r = run(&mut sim, &[req(0.0, &tokens(1, 5000), 2)]);
    let expect = 2.0 * p.prefill_ms(2048) + p.prefill_ms(5000 - 4096);
    assert!(close(r.records[0].ttft_ms, expect));
}

#[test]
fn a_lone_remote_request_adds_prefill_queue_and_transfer() {
    let p = profile();
    let mut sim = cluster(1, 1, Policy::AlwaysRemote);
    let r = run(&mut sim, &[req(0.0, &tokens(1, 1000), 10)]);
    let rec = r.records[0];
    assert_eq!(rec.decision, Decision::Remote);
    assert_eq!(rec.prefill_worker, Some(0));
    let transfer_ms = p.transfer_time(1000 * p.kv_bytes_per_token).as_secs_f64() * 1e3;
    assert!(transfer_ms > 10.0, "{transfer_ms}");
    assert!(close(rec.ttft_ms, p.prefill_ms(1000) + transfer_ms));
    assert!(close(rec.tpot_ms, lone_decode_ms(&p, 8192, 1000, 10) / 9.0));

    // Half the bandwidth: the transfer, and only it, takes twice as long.
    let mut cfg = SimClusterConfig::new(1, 1, profile());
    cfg.policy = Policy::AlwaysRemote;
    cfg.link_gbps = p.link_gbps / 2.0;
    let slow = SimCluster::new(cfg)
        .expect("valid")
        .run(&[req(0.0, &tokens(1, 1000), 10)])
        .expect("runs");
    assert!(close(slow.records[0].ttft_ms - rec.ttft_ms, transfer_ms));
}

#[test]
fn local_prefill_slows_the_decodes_it_shares_steps_with() {
    let short = req(0.0, &tokens(1, 100), 200);
    let long = req(500.0, &tokens(2, 8000), 2);
    let alone = run(
        &mut cluster(1, 1, Policy::AlwaysLocal),
        std::slice::from_ref(&short),
    );
    let local = run(
        &mut cluster(1, 1, Policy::AlwaysLocal),
        &[short.clone(), long.clone()],
    );
    let remote = run(&mut cluster(1, 1, Policy::AlwaysRemote), &[short, long]);
    let (a, l, r) = (
        alone.records[0].tpot_ms,
        local.records[0].tpot_ms,
        remote.records[0].tpot_ms,
    );
    // Four chunks of ~650 ms each land inside the short request's 200 decode steps of ~30 ms.
    assert!(l > a + 10.0, "alone {a} ms, beside a local prefill {l} ms");
    assert!(r < l, "beside a remote prefill {r} ms, a local one {l} ms");
    assert!(r >= a, "a second decode never speeds a step up: {r} < {a}");
}

#[test]
fn a_shared_prefix_lowers_the_second_requests_ttft() {
    let p = profile();
    let first = tokens(1, 4096);
    let mut second = first.clone();
    second.extend(tokens(2, 104));
    let mut sim = cluster(1, 1, Policy::AlwaysLocal);
    let r = run(&mut sim, &[req(0.0, &first, 4), req(60_000.0, &second, 4)]);
    let (a, b) = (r.records[0], r.records[1]);
    assert!(close(a.ttft_ms, 2.0 * p.prefill_ms(2048)));
    // All 256 blocks of the first prompt are cached: only the 104 new tokens are computed.
    assert_eq!(b.features.eff_isl_decode, 104);
    assert!(close(b.ttft_ms, p.prefill_ms(104)), "{}", b.ttft_ms);
}

#[test]
fn the_remote_path_sends_only_what_the_decode_worker_lacks() {
    let p = profile();
    let first = tokens(1, 4096);
    let mut second = first.clone();
    second.extend(tokens(2, 104));
    let mut sim = cluster(1, 1, Policy::AlwaysRemote);
    let r = run(&mut sim, &[req(0.0, &first, 4), req(60_000.0, &second, 4)]);
    let b = r.records[1];
    // Both caches hold the first prompt: the prefill worker computes 104 tokens and 104 tokens
    // of KV cross the link.
    assert_eq!(b.features.eff_isl_prefill, 104);
    assert_eq!(b.features.eff_isl_decode, 104);
    let transfer_ms = p.transfer_time(104 * p.kv_bytes_per_token).as_secs_f64() * 1e3;
    assert!(close(b.ttft_ms, p.prefill_ms(104) + transfer_ms));
}

#[test]
fn a_chunk_after_a_cached_prefix_pays_the_profiles_context_term() {
    let mut p = profile();
    p.prefill_ms.tc = 2e-5;
    let mut sim = SimCluster::new(SimClusterConfig::new(0, 1, p.clone())).expect("valid");
    let a = tokens(1, 1000);
    let r = run(&mut sim, &[req(0.0, &a, 8), req(60_000.0, &a, 8)]);
    let (first, second) = (r.records[0], r.records[1]);
    // The first prompt is one chunk from position 0: no context before it.
    assert!(
        close(first.ttft_ms, p.prefill_ms(1000)),
        "{}",
        first.ttft_ms
    );
    // The second finds 62 blocks cached and computes the rest after them.
    let cached = 62 * BS;
    let new = 1000 - cached;
    let want = p.prefill_ms(new) + p.prefill_context_ms(u64::from(new) * u64::from(cached));
    assert!(
        close(second.ttft_ms, want),
        "{} against {want}",
        second.ttft_ms
    );
}

#[test]
fn a_full_pool_makes_requests_wait_for_admission_and_evicts_lru() {
    let p = profile();
    let mut cfg = SimClusterConfig::new(0, 1, profile());
    cfg.total_blocks = 100; // 1600 tokens: one 1000-token request at a time
    let mut sim = SimCluster::new(cfg).expect("valid");
    let a = tokens(1, 1000);
    let reqs = [
        req(0.0, &a, 8),
        req(1.0, &tokens(2, 1000), 8),
        req(60_000.0, &a, 8),
    ];
    let r = run(&mut sim, &reqs);
    let (x, y, z) = (r.records[0], r.records[1], r.records[2]);
    // The second waits for the first to finish and free its blocks.
    assert!(y.arrival_ms + y.ttft_ms >= x.arrival_ms + x.e2e_ms);
    // The first left 62 full blocks cached and 38 blocks free; the second's 63 blocks took the
    // free ones and evicted 25 cached ones, least recently used first, which is the first
    // prompt's tail (released last block first): its head of 37 blocks is still cached.
    assert_eq!(z.features.eff_isl_decode, 1000 - 37 * BS);
    assert!(close(z.ttft_ms, p.prefill_ms(1000 - 37 * BS)));
}

#[test]
fn the_dolphin_policy_reads_the_bit_of_each_requests_cluster() {
    // Two clusters split on prompt length: short prompts local, long ones remote.
    let json = r#"{"schema_version": 1, "split": "1p1d", "slo": {"ttft_ms": 5000, "tpot_ms": 250},
      "k": 2, "method": "kmeans",
      "standardizer": {"transform": "log1p", "mean": [0, 0, 0, 0], "std": [1, 1, 1, 1]},
      "model": {"centroids": [[5, 5, 5, 2], [9, 9, 9, 2]]},
      "bits": [0, 1],
      "provenance": {"workload": "test", "date": "2026-11-29T12:00:00Z", "rounds": 0}}"#;
    let table = CompiledTable::from_json(json).expect("valid table");
    let mut cfg = SimClusterConfig::new(1, 1, profile());
    cfg.policy = Policy::Dolphin(DolphinConfig::default());
    cfg.table = Some(table.clone());
    let reqs = [req(0.0, &tokens(1, 100), 4), req(10.0, &tokens(2, 8000), 4)];
    let r = SimCluster::new(cfg)
        .expect("valid")
        .run(&reqs)
        .expect("runs");
    assert_eq!(r.records[0].cluster, Some(0));
    assert_eq!(r.records[0].decision, Decision::Local);
    assert_eq!(r.records[1].cluster, Some(1));
    assert_eq!(r.records[1].decision, Decision::Remote);
    assert_eq!(r.per_cluster.len(), 2);
    assert_eq!(r.remote, 1);

    // Any other policy decides, but the records still name the clusters.
    let mut sim = cluster(1, 1, Policy::AlwaysLocal);
    sim.set_policy(Policy::AlwaysLocal, Some(table));
    let r = run(&mut sim, &reqs);
    assert_eq!(r.records[1].cluster, Some(1));
    assert_eq!(r.records[1].decision, Decision::Local);
}

#[test]
fn a_remote_request_whose_prompt_the_decode_worker_holds_is_prefilled_there() {
    let p = profile();
    let mut sim = cluster(1, 1, Policy::AlwaysRemote);
    // The same 1000-token prompt twice: the second finds 62 of its 63 blocks cached on the
    // decode worker (the remote first left them there), so only the last block is left.
    let prompt = tokens(1, 1000);
    let r = run(&mut sim, &[req(0.0, &prompt, 4), req(5000.0, &prompt, 4)]);
    let (first, second) = (r.records[0], r.records[1]);
    assert_eq!(
        (first.decision, first.path),
        (Decision::Remote, PrefillPath::Remote)
    );
    assert_eq!(
        (second.decision, second.path),
        (Decision::Remote, PrefillPath::LocalHeld)
    );
    assert_eq!(second.prefill_worker, None);
    assert_eq!(second.features.eff_isl_decode, 1000 - 62 * BS);
    // The decode worker computed the 8 tokens after its 62 cached blocks: no prefill worker,
    // no transfer.
    assert!(
        close(second.ttft_ms, p.prefill_ms(1000 - 62 * BS)),
        "{second:?}"
    );
    let outcomes = r.outcomes();
    assert!(outcomes[0].prefilled_remotely() && !outcomes[0].held);
    assert!(outcomes[1].remote && outcomes[1].held && !outcomes[1].prefilled_remotely());
}

#[test]
fn a_burst_of_unique_prompts_finishes_its_prefills_in_waves_as_vllm_packs_them() {
    // vLLM's scheduler (and ours): first come, first served into each step's token budget,
    // the prompt that does not fit chunked into what is left. Sixteen unique 2011-token
    // prompts at once in 8192-token steps: the first starts a step alone on arrival (the
    // engine was idle), then four prompts complete per step.
    let mut cfg = SimClusterConfig::new(0, 1, SimProfile::builtin("dynamo-mocker").expect("p"));
    cfg.max_batched_tokens = 8192;
    let reqs: Vec<SimRequest> = (0..16).map(|i| req(0.0, &tokens(i + 1, 2011), 2)).collect();
    let r = SimCluster::new(cfg)
        .expect("valid")
        .run(&reqs)
        .expect("runs");
    let mut waves: Vec<(f64, usize)> = Vec::new();
    for rec in &r.records {
        match waves.last_mut() {
            Some((ttft, n)) if close(*ttft, rec.ttft_ms) => *n += 1,
            _ => waves.push((rec.ttft_ms, 1)),
        }
    }
    let sizes: Vec<usize> = waves.iter().map(|w| w.1).collect();
    assert_eq!(sizes, [1, 4, 4, 4, 3], "{waves:?}");
}

/// Sizes of the groups of requests whose first tokens come at one instant, in input order.
fn waves(r: &SimReport) -> Vec<usize> {
    let mut waves: Vec<(f64, usize)> = Vec::new();
    for rec in &r.records {
        let first = rec.arrival_ms + rec.ttft_ms;
        match waves.last_mut() {
            Some((t, n)) if close(*t, first) => *n += 1,
            _ => waves.push((first, 1)),
        }
    }
    waves.into_iter().map(|w| w.1).collect()
}

fn mocker_like(scheduler: SchedulerModel, max_batched_tokens: u32) -> SimCluster {
    let mut cfg = SimClusterConfig::new(0, 1, SimProfile::builtin("dynamo-mocker").expect("p"));
    cfg.max_batched_tokens = max_batched_tokens;
    cfg.scheduler = scheduler;
    SimCluster::new(cfg).expect("valid")
}

#[test]
fn under_vllm_arrivals_a_burst_at_one_instant_enters_one_step() {
    // vLLM's engine (and Dynamo's mocker) schedules everything that arrived at one instant
    // together: four 2011-token prompts per 8192-token step from the first step on.
    let reqs: Vec<SimRequest> = (0..16).map(|i| req(0.0, &tokens(i + 1, 2011), 2)).collect();
    let r = run(&mut mocker_like(SchedulerModel::Vllm, 8192), &reqs);
    assert_eq!(waves(&r), [4, 4, 4, 4]);
}

#[test]
fn prompts_share_a_prefix_from_the_step_that_schedules_it() {
    // Sixteen prompts at once over one new 2000-token prefix. Blocks are cached when they are
    // scheduled, so a prompt scheduled after the first in the same step (vLLM's arrivals, all
    // in the first step) or admitted while that step runs (Dolphin's engine, which starts the
    // step on the first arrival) finds the prefix and computes its own 11 tokens alone.
    let prefix = tokens(1000, 2000);
    let reqs: Vec<SimRequest> = (0..16)
        .map(|i| {
            let mut t = prefix.clone();
            t.extend(tokens(i + 1, 11));
            req(0.0, &t, 4)
        })
        .collect();
    let p = SimProfile::builtin("dynamo-mocker").expect("p");
    let vllm = run(&mut mocker_like(SchedulerModel::Vllm, 8192), &reqs);
    assert_eq!(waves(&vllm), [16]);
    let ttft = vllm.records[0].ttft_ms;
    assert!(close(ttft, p.prefill_ms(2011 + 15 * 11)), "{ttft}");
    assert!(
        vllm.records
            .iter()
            .all(|r| r.features.eff_isl_decode == 2011),
        "the router saw nothing cached"
    );
    let own = run(&mut mocker_like(SchedulerModel::Dolphin, 8192), &reqs);
    assert_eq!(waves(&own), [1, 15]);
    assert!(close(own.records[0].ttft_ms, p.prefill_ms(2011)));
}

#[test]
fn a_prompt_takes_blocks_scheduled_since_it_was_admitted_before_its_first_chunk() {
    // A 6000-token prompt spreads over three 2048-token steps. A second prompt sharing its first
    // 4096 tokens arrives during the first step: admitted then, it finds the 128 blocks that
    // step is computing; it enters the third step, after the first prompt's last chunk, finds
    // 128 more (scheduled by the second step) and computes its own 100 tokens there.
    let long = tokens(7, 6000);
    let mut second = long[..4096].to_vec();
    second.extend(tokens(8, 100));
    let reqs = [req(0.0, &long, 2), req(1.0, &second, 2)];
    let r = run(&mut mocker_like(SchedulerModel::Dolphin, 2048), &reqs);
    assert_eq!(
        waves(&r),
        [2],
        "both first tokens at the end of the third step"
    );
    assert_eq!(r.records[1].features.eff_isl_decode, 4196 - 2048);
}

#[test]
fn runs_are_deterministic_and_every_request_finishes() {
    let reqs: Vec<SimRequest> = (0..200)
        .map(|i| {
            // Four prompt families sharing 1024-token prefixes, arriving every 50 ms.
            let mut t = tokens(1000 + i % 4, 1024);
            t.extend(tokens(i + 1, 200 + 37 * (i % 11)));
            req(50.0 * f64::from(i), &t, 16 + i % 50)
        })
        .collect();
    let mut sim = cluster(2, 2, Policy::Threshold(Default::default()));
    let a = run(&mut sim, &reqs);
    let b = run(&mut sim, &reqs);
    assert_eq!(a, b);
    for r in &a.records {
        assert!(r.ttft_ms > 0.0 && r.e2e_ms >= r.ttft_ms, "{r:?}");
    }
    // Shared prefixes are found: many requests reuse most of their prompt on the decode side.
    let reused = a
        .records
        .iter()
        .filter(|r| r.features.eff_isl_decode < r.features.isl - 512)
        .count();
    assert!(reused > 100, "{reused} of 200 reused a prefix");
}

#[test]
fn reading_the_pools_routes_exactly_as_the_routers_index_does() {
    // Seven prompt families whose members share prefixes of 256 to 1280 tokens, a prompt in
    // ten shared with nobody, arrivals in threes at one instant, pools small enough to evict:
    // every lookup's counts feed the worker choice and the features, so any difference shows
    // in the records. The pools' path caches the blocks no other request has without
    // indexing them and stops its lookups before them; the router's index path indexes all.
    let reqs: Vec<SimRequest> = (0..300)
        .map(|i| {
            let mut t = if i % 10 == 9 {
                tokens(3000 + i, 300 + 17 * (i % 11))
            } else {
                tokens(2000 + i % 7, 256 * (1 + i % 5))
            };
            t.extend(tokens(i + 1, 100 + 53 * (i % 13)));
            req(40.0 * f64::from(i / 3), &t, 8 + i % 40)
        })
        .collect();
    let policies = [
        Policy::Threshold(Default::default()),
        Policy::AlwaysRemote,
        Policy::AlwaysLocal,
    ];
    for policy in policies {
        for (prefill, decode) in [(2, 2), (3, 1), (1, 3)] {
            let sim = |lookup| {
                let mut cfg = SimClusterConfig::new(prefill, decode, profile());
                cfg.policy = policy;
                cfg.total_blocks = 512;
                cfg.prefix_lookup = lookup;
                SimCluster::new(cfg).expect("valid config")
            };
            let (mut pools, mut index) = (sim(PrefixLookup::Pools), sim(PrefixLookup::RouterIndex));
            let open = run(&mut pools, &reqs);
            assert_eq!(
                open,
                run(&mut index, &reqs),
                "{policy:?} {prefill}p{decode}d"
            );
            let closed = pools.run_closed(&reqs, 24).expect("runs");
            assert_eq!(
                closed,
                index.run_closed(&reqs, 24).expect("runs"),
                "{policy:?} {prefill}p{decode}d, closed loop"
            );
            // The workload does share: on the decode side, and on the prefill side when every
            // prompt goes there.
            let shared =
                |f: fn(&crate::RequestRecord) -> bool| open.records.iter().filter(|r| f(r)).count();
            assert!(shared(|r| r.features.eff_isl_decode + 256 <= r.features.isl) > 50);
            if policy == Policy::AlwaysRemote {
                assert!(shared(|r| r.features.eff_isl_prefill + 256 <= r.features.isl) > 50);
            }
        }
    }
}

#[test]
fn bad_inputs_are_refused() {
    let mut cfg = SimClusterConfig::new(1, 0, profile());
    assert!(SimCluster::new(cfg.clone()).is_err());
    cfg.decode = 1;
    cfg.link_gbps = 0.0;
    assert!(SimCluster::new(cfg.clone()).is_err());
    cfg.link_gbps = 100.0;
    cfg.total_blocks = 10;
    let mut sim = SimCluster::new(cfg).expect("valid");
    let err = sim
        .run(&[req(0.0, &tokens(1, 1000), 4)])
        .expect_err("does not fit");
    assert!(err.to_string().contains("KV blocks"), "{err}");
}

#[test]
fn the_online_learner_flips_a_bad_bit_and_the_run_follows_it() {
    // One cluster, bit remote; a TTFT target the transfer misses and local prefill meets.
    let p = profile();
    let json = r#"{"schema_version": 1, "split": "1p1d", "slo": {"ttft_ms": 5000, "tpot_ms": 250},
      "k": 1, "method": "kmeans",
      "standardizer": {"transform": "log1p", "mean": [0, 0, 0, 0], "std": [1, 1, 1, 1]},
      "model": {"centroids": [[7, 7, 7, 2]]},
      "bits": [1],
      "provenance": {"workload": "test", "date": "2026-11-29T12:00:00Z", "rounds": 0,
                     "reward": "per-metric"}}"#;
    let table = CompiledTable::from_json(json).expect("valid table");
    let slo = Slo::new(p.prefill_ms(1000) + 5.0, 250.0);
    let reqs: Vec<SimRequest> = (0..400)
        .map(|i| SimRequest::from_tokens(f64::from(i) * 2000.0, &tokens(i + 1, 1000), 4, slo, BS))
        .collect();
    let online = dolphin_router::dolphin::OnlineConfig {
        enabled: true,
        explore_share: 0.1,
        min_samples: 10,
        ..Default::default()
    };
    let run_with = |online| {
        let mut cfg = SimClusterConfig::new(1, 1, profile());
        cfg.policy = Policy::Dolphin(DolphinConfig {
            online,
            ..DolphinConfig::default()
        });
        cfg.table = Some(table.clone());
        SimCluster::new(cfg)
            .expect("valid")
            .run(&reqs)
            .expect("runs")
    };
    let off = run_with(dolphin_router::dolphin::OnlineConfig::default());
    assert_eq!(off.remote, 400);
    assert_eq!(off.attainment_each, 0.0);
    assert!(off.online.is_none());

    let on = run_with(online);
    let o = on.online.as_ref().expect("learned");
    assert_eq!(o.flips.len(), 1, "{:?}", o.flips);
    let flip = o.flips[0];
    assert_eq!((flip.cluster, flip.to), (0, Decision::Local));
    assert_eq!(o.table.bits, vec![0]);
    // Ten explored (local) outcomes at a tenth of the traffic: about a hundred requests.
    let at = on
        .records
        .iter()
        .position(|r| r.arrival_ms > flip.at_ms)
        .expect("requests after the flip");
    assert!((90..=140).contains(&at), "flipped before request {at}");
    // Afterwards the bit is local, and only the explored tenth goes remote.
    let after = &on.records[at..];
    let remote = after
        .iter()
        .filter(|r| r.decision == Decision::Remote)
        .count();
    assert!(
        after
            .iter()
            .all(|r| r.explored == (r.decision == Decision::Remote))
    );
    // A tenth at most: once local is significantly better the cluster settles and explores
    // at a fifth of the share.
    let n = after.len();
    assert!(
        remote <= n / 10 + 1 && remote + 1 >= n / 50,
        "{remote} of {n}"
    );
    assert_eq!(
        o.explored,
        on.records.iter().filter(|r| r.explored).count() as u64
    );
    // Every local request meets the target, every remote one misses it.
    assert!(after.iter().all(|r| r.met_each != r.explored));
}

#[test]
fn a_shared_prefix_is_what_some_other_request_also_has() {
    let doc = tokens(1, 64); // four blocks of 16
    let with = |tail: u32, len: u32| {
        let mut t = doc.clone();
        t.extend(tokens(tail, len));
        req(0.0, &t, 1)
    };
    let reqs = [
        with(10, 32),                 // the document, then two blocks of its own
        with(11, 40),                 // the document, then two and a half of its own
        req(0.0, &tokens(12, 48), 1), // shared with nobody
        with(10, 48),                 // request 0's prompt and one block more
        req(0.0, &tokens(12, 48), 1), // request 2 again
    ];
    let shared = crate::cluster::shared_prefixes(&reqs);
    assert_eq!(shared, vec![6, 4, 3, 6, 3]);
    assert_eq!(crate::cluster::shared_prefixes(&reqs[2..3]), vec![0]);
    assert!(crate::cluster::shared_prefixes(&[]).is_empty());
}

//! Unit tests of the live driver's pieces: outcomes from what the client saw, the wire request.

use dolphin_proto::v1::RoutingFeatures;
use dolphin_workload::RequestKind;

use super::*;

fn request() -> WorkloadRequest {
    WorkloadRequest {
        arrival_ms: 0.0,
        hash_ids: vec![1, 2],
        prompt_len: 700,
        output_len: 11,
        kind: RequestKind::Humaneval,
    }
}

#[test]
fn latencies_come_from_the_first_and_last_token() {
    let m = Measured {
        index: 3,
        sent_ms: 50.0,
        first_ms: Some(400.0),
        last_ms: Some(900.0),
        tokens: 11,
        routing: Some(RoutingInfo {
            mode: PrefillMode::Remote as i32,
            cluster: 2,
            features: Some(RoutingFeatures {
                isl: 700,
                eff_isl_prefill: 200,
                eff_isl_decode: 700,
                output_len_hint: 64,
            }),
            ..RoutingInfo::default()
        }),
        error: None,
    };
    let o = m.outcome(&request(), &Slo::new(500.0, 60.0));
    assert_eq!((o.index, o.sent_ms, o.prompt_tokens), (3, 50.0, 700));
    assert_eq!((o.ttft_ms, o.tpot_ms, o.e2e_ms), (400.0, 50.0, 900.0));
    assert_eq!(o.features, [700, 200, 700, 64]);
    assert!(o.remote && !o.fell_back && o.ok);
    assert_eq!(o.cluster, Some(2));
    // Budget 500 + 10 x 60 = 1100 ms: met; TTFT and TPOT each within target too.
    assert!(o.met && o.met_each);
    let strict = m.outcome(&request(), &Slo::new(300.0, 60.0));
    assert!(strict.met && !strict.met_each);
}

#[test]
fn a_failure_is_an_unmet_outcome_without_routing() {
    let m = Measured {
        index: 0,
        error: Some(("Unavailable".into(), "down".into())),
        ..Measured::default()
    };
    let o = m.outcome(&request(), &Slo::new(5000.0, 250.0));
    assert!(!o.ok && !o.met && !o.met_each);
    assert_eq!((o.cluster, o.features, o.output_tokens), (None, [0; 4], 0));
    let one = Measured {
        first_ms: Some(10.0),
        last_ms: Some(10.0),
        tokens: 1,
        ..Measured::default()
    };
    assert_eq!(
        one.outcome(&request(), &Slo::new(5000.0, 250.0)).tpot_ms,
        0.0
    );
}

/// One request's workload, and the wire shape of model "m" with 99 ids.
fn one_request(context: u32, cap_max_tokens: bool) -> (Workload, WireShape) {
    let w = Workload {
        skipped_rows: 0,
        name: "t".into(),
        tokens_per_id: 512,
        requests: vec![request()],
    };
    let shape = WireShape {
        model: "m".into(),
        vocab: 99,
        context,
        cap_max_tokens,
    };
    (w, shape)
}

#[test]
fn the_wire_request_asks_for_exactly_the_output() {
    let (w, shape) = one_request(0, false);
    let req = generate_request(&w, 0, &shape, &Slo::new(5000.0, 250.0));
    let Some(Input::TokenIds(ids)) = &req.input else {
        panic!("no token ids")
    };
    assert_eq!(ids.ids.len(), 700);
    assert!(ids.ids.iter().all(|&t| t < 99));
    assert_eq!(ids.ids, w.prompt_tokens(0, 0..99));
    let s = req.sampling.unwrap();
    assert_eq!((s.max_tokens, s.ignore_eos, s.temperature), (11, true, 0.0));
    assert_eq!(s.replay_output_tokens, None);
    let slo = req.slo.unwrap();
    assert_eq!((slo.ttft_ms, slo.tpot_ms), (5000, 250));
    assert_eq!(req.model, "m");
}

#[test]
fn a_capped_wire_request_hides_the_output_length_from_max_tokens() {
    let slo = Slo::new(5000.0, 250.0);
    let sampling = |context| {
        let (w, shape) = one_request(context, true);
        generate_request(&w, 0, &shape, &slo).sampling.unwrap()
    };
    let cap = request().kind.max_tokens_cap();
    let s = sampling(0);
    assert_eq!((s.max_tokens, s.replay_output_tokens), (cap, Some(11)));
    // Within the context the 700-token prompt leaves, never below the output.
    let s = sampling(900);
    assert_eq!((s.max_tokens, s.replay_output_tokens), (200, Some(11)));
    let s = sampling(705);
    assert_eq!(s.max_tokens, 11);
}

#[test]
fn failures_summarize_by_code() {
    let f = BTreeMap::from([("Unavailable".to_owned(), 20), ("Internal".to_owned(), 1)]);
    assert_eq!(failure_summary(&f), "Internal x 1, Unavailable x 20");
}

#[test]
fn requests_beyond_the_context_are_counted() {
    // The 700-token prompt with its 11 output tokens needs 711.
    let (w, _) = one_request(0, false);
    assert_eq!(beyond_context(&w, 0), 0, "unknown context");
    assert_eq!(beyond_context(&w, 711), 0);
    assert_eq!(beyond_context(&w, 710), 1);
}

//! The pure routing decision: features, forcing, the table under `dolphin`, its fallback, and
//! the other policies.

use super::*;
use crate::dolphin::Split;
use crate::dolphin::table::tests::kmeans_table;
use crate::policy::{FallbackKind, PolicyKind, ThresholdConfig};

/// Cluster 0 holds short requests (local in [`table`]), cluster 1 long ones (remote).
fn table() -> CompiledTable {
    CompiledTable::compile(kmeans_table(Split::new(1, 1), [0, 1])).expect("compiles")
}

fn input(isl: u32, prefill: Option<PrefillChoice>) -> RouteInput {
    RouteInput {
        isl,
        block_size: 16,
        decode_cached_blocks: 0,
        prefill,
        output_len_hint: isl,
        decode_kv_usage: None,
    }
}

const IDLE: Option<PrefillChoice> = Some(PrefillChoice {
    cached_blocks: 0,
    queue: 0,
    pending_tokens: 0,
    max_batched_tokens: 0,
});

#[test]
fn features_subtract_each_workers_cached_prefix() {
    let i = RouteInput {
        isl: 100,
        block_size: 16,
        decode_cached_blocks: 2,
        prefill: Some(PrefillChoice {
            cached_blocks: 5,
            queue: 3,
            pending_tokens: 9000,
            max_batched_tokens: 4096,
        }),
        output_len_hint: 7,
        decode_kv_usage: Some(0.25),
    };
    let f = i.features();
    assert_eq!(
        (
            f.isl,
            f.eff_isl_prefill,
            f.eff_isl_decode,
            f.output_len_hint
        ),
        (100, 20, 68, 7)
    );
    let pools = i.pool_state();
    assert_eq!(
        (
            pools.queue,
            pools.pending_tokens,
            pools.max_batched_tokens,
            pools.decode_kv_usage
        ),
        (3, 9000, 4096, Some(0.25))
    );
    assert!(pools.prefill_busy(2.0) && !pools.prefill_busy(3.0));
    // More cached than the prompt (a full-prompt hit): nothing left, not an underflow.
    let all = RouteInput {
        decode_cached_blocks: 10,
        prefill: None,
        ..i
    };
    let f = all.features();
    assert_eq!((f.eff_isl_prefill, f.eff_isl_decode), (100, 0));
}

#[test]
fn the_table_decides_under_dolphin_with_its_version_and_cluster() {
    let t = table();
    let version: Arc<str> = Arc::from("v7");
    let tref = Some(TableRef {
        table: &t,
        version: Some(&version),
    });
    let dolphin = Policy::Dolphin(DolphinConfig::default());
    let long = route(&input(5000, IDLE), &dolphin, tref, None).expect("routes");
    assert_eq!(long.decision, Decision::Remote);
    assert_eq!(long.decided_by, DecidedBy::Table);
    assert_eq!(long.cluster, Some(1));
    assert_eq!(long.table_version.as_deref(), Some("v7"));
    let short = route(&input(10, IDLE), &dolphin, tref, None).expect("routes");
    assert_eq!((short.decision, short.cluster), (Decision::Local, Some(0)));
    // No prefill worker: local, and the cluster is still reported.
    let alone = route(&input(5000, None), &dolphin, tref, None).expect("routes");
    assert_eq!(
        (alone.decision, alone.decided_by, alone.cluster),
        (Decision::Local, DecidedBy::Table, Some(1))
    );
}

#[test]
fn bits_without_evidence_and_requests_out_of_range_go_to_the_fallback() {
    use crate::dolphin::trust::{ClusterEvidence, Distrust, TrustConfig};
    // Short requests (cluster 0) lie 3.2 from its centroid, long ones (cluster 1) 5.0.
    let with = |evidence: [(u64, f64); 2]| {
        let mut t = kmeans_table(Split::new(1, 1), [0, 1]);
        t.evidence = evidence
            .iter()
            .map(|&(requests, range)| ClusterEvidence {
                requests,
                margin: Some(0.1),
                range,
            })
            .collect();
        CompiledTable::compile(t).expect("compiles")
    };
    let cfg = DolphinConfig {
        fallback: FallbackKind::AlwaysLocal,
        ..DolphinConfig::default()
    };
    let dolphin = Policy::Dolphin(cfg);
    let decide = |t: &CompiledTable, isl: u32, policy: &Policy| {
        let r = route(
            &input(isl, IDLE),
            policy,
            Some(TableRef {
                table: t,
                version: None,
            }),
            None,
        )
        .expect("routes");
        (r.decision, r.decided_by, r.cluster)
    };
    // Cluster 1 has 5 training requests: its remote bit is not taken.
    let t = with([(100, 4.0), (5, 6.0)]);
    assert_eq!(
        decide(&t, 5000, &dolphin),
        (
            Decision::Local,
            DecidedBy::Distrusted(FallbackKind::AlwaysLocal, Distrust::ThinEvidence),
            Some(1)
        )
    );
    assert_eq!(
        decide(&t, 10, &dolphin),
        (Decision::Local, DecidedBy::Table, Some(0))
    );
    // Cluster 0 trained within 1.0 of its centroid: 3.2 is beyond 1.5 times that.
    let t = with([(100, 1.0), (100, 6.0)]);
    assert_eq!(
        decide(&t, 10, &dolphin).1,
        DecidedBy::Distrusted(FallbackKind::AlwaysLocal, Distrust::OutOfRange)
    );
    assert_eq!(
        decide(&t, 5000, &dolphin),
        (Decision::Remote, DecidedBy::Table, Some(1))
    );
    // Checks off: every bit is taken.
    let all = Policy::Dolphin(DolphinConfig {
        trust: TrustConfig {
            enabled: false,
            ..TrustConfig::default()
        },
        ..cfg
    });
    assert_eq!(decide(&t, 10, &all).1, DecidedBy::Table);
    // Another policy never distrusts: the table only names the cluster.
    assert_eq!(
        decide(&t, 10, &Policy::AlwaysRemote).1,
        DecidedBy::Policy(PolicyKind::AlwaysRemote)
    );
}

#[test]
fn without_a_table_dolphin_falls_back() {
    let cfg = DolphinConfig {
        fallback: FallbackKind::AlwaysRemote,
        ..DolphinConfig::default()
    };
    let r = route(&input(10, IDLE), &Policy::Dolphin(cfg), None, None).expect("routes");
    assert_eq!(r.decision, Decision::Remote);
    assert_eq!(
        r.decided_by,
        DecidedBy::Fallback(FallbackKind::AlwaysRemote)
    );
    assert_eq!((r.cluster, r.table_version), (None, None));
}

#[test]
fn other_policies_decide_and_a_table_only_names_the_cluster() {
    let t = table();
    let tref = Some(TableRef {
        table: &t,
        version: None,
    });
    let threshold = Policy::Threshold(ThresholdConfig::default());
    let r = route(&input(10, IDLE), &threshold, tref, None).expect("routes");
    assert_eq!(r.decided_by, DecidedBy::Policy(PolicyKind::Threshold));
    assert_eq!(r.decision, threshold.decide(&r.features, PoolState::IDLE));
    assert_eq!((r.cluster, r.table_version), (Some(0), None));
    let remote = route(&input(10, IDLE), &Policy::AlwaysRemote, None, None).expect("routes");
    assert_eq!((remote.decision, remote.cluster), (Decision::Remote, None));
    let nowhere = route(&input(10, None), &Policy::AlwaysRemote, None, None).expect("routes");
    assert_eq!(nowhere.decision, Decision::Local);
}

#[test]
fn force_wins_but_remote_needs_a_prefill_worker() {
    let t = table();
    let tref = Some(TableRef {
        table: &t,
        version: None,
    });
    let dolphin = Policy::Dolphin(DolphinConfig::default());
    let r = route(&input(5000, IDLE), &dolphin, tref, Some(Decision::Local)).expect("routes");
    assert_eq!(
        (r.decision, r.decided_by),
        (Decision::Local, DecidedBy::Forced)
    );
    assert_eq!(r.cluster, Some(1));
    let err = route(&input(10, None), &dolphin, tref, Some(Decision::Remote)).unwrap_err();
    assert_eq!(err, RouteError::NoPrefillWorker);
    let r = route(
        &input(10, IDLE),
        &Policy::AlwaysLocal,
        None,
        Some(Decision::Remote),
    )
    .expect("routes");
    assert_eq!(
        (r.decision, r.decided_by),
        (Decision::Remote, DecidedBy::Forced)
    );
}

#[test]
fn a_tables_load_rule_turns_remote_bits_local_while_the_prefill_worker_is_busy() {
    let mut doc = kmeans_table(Split::new(1, 1), [0, 1]);
    doc.load_rule = Some(crate::dolphin::table::LoadRule {
        prefill_busy_threshold: 1.0,
    });
    let t = CompiledTable::compile(doc).expect("compiles");
    let tref = Some(TableRef {
        table: &t,
        version: None,
    });
    let dolphin = Policy::Dolphin(DolphinConfig::default());
    let pending = |pending_tokens| {
        Some(PrefillChoice {
            cached_blocks: 0,
            queue: 1,
            pending_tokens,
            max_batched_tokens: 2048,
        })
    };
    let at = |isl, prefill| {
        let r = route(&input(isl, prefill), &dolphin, tref, None).expect("routes");
        (r.decision, r.decided_by, r.cluster)
    };
    // Busy: more than one step (2048 tokens) pending. A remote bit goes local...
    assert_eq!(
        at(5000, pending(2049)),
        (Decision::Local, DecidedBy::TableLoad, Some(1))
    );
    assert_eq!(DecidedBy::TableLoad.label(), "dolphin-load");
    // ... but not at the threshold, nor when the worker does not report its step size.
    assert_eq!(
        at(5000, pending(2048)),
        (Decision::Remote, DecidedBy::Table, Some(1))
    );
    assert_eq!(
        at(5000, IDLE),
        (Decision::Remote, DecidedBy::Table, Some(1))
    );
    // A local bit stays local, decided by the table.
    assert_eq!(
        at(10, pending(1 << 20)),
        (Decision::Local, DecidedBy::Table, Some(0))
    );
    // Forcing still wins, and the same table without the rule takes its bit.
    let r = route(
        &input(5000, pending(1 << 20)),
        &dolphin,
        tref,
        Some(Decision::Remote),
    )
    .expect("routes");
    assert_eq!(r.decided_by, DecidedBy::Forced);
    let plain = table();
    let r = route(
        &input(5000, pending(1 << 20)),
        &dolphin,
        Some(TableRef {
            table: &plain,
            version: None,
        }),
        None,
    )
    .expect("routes");
    assert_eq!(
        (r.decision, r.decided_by),
        (Decision::Remote, DecidedBy::Table)
    );
}

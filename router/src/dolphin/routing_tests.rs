//! Unit tests of DolphinRouting's state: table per split, fallback, refusals, classifier swaps.

use super::*;
use crate::dolphin::store::{ActivePointer, SplitEntry};
use crate::dolphin::table::tests::kmeans_table;
use crate::policy::{
    DecidedBy, Decision, DolphinConfig, FallbackKind, Features, Policy, PoolState,
};
use crate::route::{self, Route};

const IDLE: PoolState = PoolState::IDLE;

fn big() -> Features {
    Features {
        isl: 5000,
        eff_isl_prefill: 5000,
        eff_isl_decode: 5000,
        output_len_hint: 5000,
    }
}

fn small() -> Features {
    Features {
        isl: 10,
        eff_isl_prefill: 10,
        eff_isl_decode: 10,
        output_len_hint: 10,
    }
}

/// The `dolphin` policy's decision with `r`'s table of `split`, `fallback` without one.
fn decide(
    r: &DolphinRouting,
    f: &Features,
    prefill: PoolState,
    split: Split,
    fallback: &DolphinConfig,
) -> Route {
    let policy = Policy::Dolphin(*fallback);
    r.with_table(split, |t| route::decide(*f, prefill, &policy, t, None))
        .expect("not forced")
}

fn json(split: Split, bits: [u8; 2]) -> String {
    kmeans_table(split, bits).to_json_pretty()
}

fn snapshot(entries: &[(Split, &str, &str, bool)]) -> StoreSnapshot {
    let mut snap = StoreSnapshot::default();
    for (split, version, json, active) in entries {
        let e: &mut SplitEntry = snap.splits.entry(*split).or_default();
        e.versions.insert((*version).to_owned(), (*json).to_owned());
        if *active {
            e.active = Some(ActivePointer::activate(e.active.as_ref(), version));
        }
    }
    snap
}

#[test]
fn table_of_the_live_split_decides_else_the_fallback() {
    let r = DolphinRouting::new();
    let fallback = DolphinConfig::default();
    let s31 = Split::new(3, 1);
    let o = decide(&r, &big(), IDLE, s31, &fallback);
    assert_eq!(
        (o.cluster, o.decided_by.label(), o.table_version),
        (None, "dolphin-fallback/threshold", None)
    );
    assert_eq!(o.decision, Decision::Remote, "threshold: nothing cached");
    // Cluster 0 (small requests) remote, cluster 1 (large) local: the opposite of the rule.
    r.install(s31, "v1", &json(s31, [1, 0])).expect("install");
    let o = decide(&r, &big(), IDLE, s31, &fallback);
    assert_eq!(
        (o.decision, o.cluster, o.decided_by),
        (Decision::Local, Some(1), DecidedBy::Table)
    );
    assert_eq!(o.table_version.as_deref(), Some("v1"));
    let o = decide(&r, &small(), IDLE, s31, &fallback);
    assert_eq!((o.decision, o.cluster), (Decision::Remote, Some(0)));
    // No prefill worker: local, the cluster is still reported.
    let none = PoolState {
        available: false,
        ..PoolState::IDLE
    };
    let o = decide(&r, &small(), none, s31, &fallback);
    assert_eq!((o.decision, o.cluster), (Decision::Local, Some(0)));
    // Another split has no table.
    let o = decide(&r, &small(), IDLE, Split::new(2, 1), &fallback);
    assert_eq!(o.cluster, None);
    // A new version replaces the old for the next decision.
    r.install(s31, "v2", &json(s31, [0, 0])).expect("install");
    let o = decide(&r, &small(), IDLE, s31, &fallback);
    assert_eq!(
        (o.decision, o.table_version.as_deref()),
        (Decision::Local, Some("v2"))
    );
}

#[test]
fn invalid_tables_are_refused_and_the_old_one_stays() {
    let r = DolphinRouting::new();
    let s = Split::new(1, 1);
    let fb = DolphinConfig {
        fallback: FallbackKind::AlwaysLocal,
        ..DolphinConfig::default()
    };
    r.install(s, "v1", &json(s, [1, 1])).expect("install");
    let bad = json(s, [1, 1]).replace("\"bits\": [", "\"bits\": [7, ");
    assert!(r.install(s, "v2", &bad).is_err());
    let wrong_split = json(Split::new(9, 9), [0, 0]);
    assert!(matches!(
        r.install(s, "v3", &wrong_split),
        Err(TableError::SplitMismatch { .. })
    ));
    let o = decide(&r, &small(), IDLE, s, &fb);
    assert_eq!(o.table_version.as_deref(), Some("v1"));
    assert!(r.status()[&s].refused.contains("v3"));
    // The same through a snapshot: the pointer moves to a broken version.
    let v1 = json(s, [1, 1]);
    r.apply_snapshot(&snapshot(&[(s, "v1", &v1, true), (s, "v4", "{}", true)]));
    let o = decide(&r, &small(), IDLE, s, &fb);
    assert_eq!(o.table_version.as_deref(), Some("v1"));
    assert!(r.status()[&s].refused.contains("v4"));
    // A valid version then loads and clears the refusal.
    let v5 = json(s, [0, 0]);
    r.apply_snapshot(&snapshot(&[(s, "v5", &v5, true)]));
    let o = decide(&r, &small(), IDLE, s, &fb);
    assert_eq!(
        (o.table_version.as_deref(), o.decision),
        (Some("v5"), Decision::Local)
    );
    assert_eq!(r.status()[&s].refused, "");
    // Dropping the pointer drops the table.
    r.apply_snapshot(&StoreSnapshot::default());
    assert!(r.table(s).is_none());
    assert_eq!(decide(&r, &small(), IDLE, s, &fb).cluster, None);
}

#[test]
fn unchanged_snapshots_keep_the_loaded_table() {
    let r = DolphinRouting::new();
    let s = Split::new(1, 1);
    let v1 = json(s, [0, 1]);
    let snap = snapshot(&[(s, "v1", &v1, true)]);
    r.apply_snapshot(&snap);
    let first = r.table(s).expect("loaded");
    r.apply_snapshot(&snap);
    assert!(Arc::ptr_eq(&first, &r.table(s).expect("loaded")));
}

#[test]
fn classifier_swaps_and_refusals() {
    let r = DolphinRouting::new();
    assert!(r.classifier().is_prior());
    let mut c = OutputClassifier::prior();
    c.representative = [1, 2, 3];
    c.provenance.source = "test.jsonl".into();
    r.apply_classifier(Some(&c.to_json_pretty()));
    assert_eq!(r.classifier().representative, [1, 2, 3]);
    r.apply_classifier(Some("{\"schema_version\": 1}"));
    assert_eq!(r.classifier().representative, [1, 2, 3], "bad one refused");
    let a = Admission::new(&[1, 2, 3], 100_000);
    assert_eq!(r.classify(&a).length, 3);
    r.apply_classifier(None);
    assert!(r.classifier().is_prior());
}

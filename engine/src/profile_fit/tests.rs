//! The fit against a backend whose timing is known: the sim engine must give back its profile.

use super::*;
use crate::sim::{SimConfig, SimProfile, sim_backend};

/// A sim profile with every decode term non-zero, so each must be recovered.
fn known() -> SimProfile {
    let mut p = SimProfile::builtin("dynamo-mocker").expect("shipped");
    p.decode_ms.per_seq = 0.4;
    p.prefill_ms.tc = 2e-5;
    p
}

fn measured(profile: SimProfile, grid: &FitGrid) -> (Vec<StepSample>, u32) {
    let mut cfg = SimConfig::new(profile);
    cfg.total_blocks = 2048;
    let mut backend = sim_backend(&cfg).expect("valid");
    let mut seen = 0;
    let samples = measure(&mut backend, grid, |_| seen += 1).expect("measured");
    assert_eq!(seen, samples.len(), "progress is told of every shape");
    (samples, cfg.total_blocks)
}

#[test]
fn the_sim_engine_measured_and_fitted_gives_back_its_own_profile() {
    let truth = known();
    let grid = FitGrid {
        reps: 2,
        ..FitGrid::default()
    };
    let (samples, total) = measured(truth.clone(), &grid);
    let decodes = samples
        .iter()
        .filter(|s| matches!(s.shape, StepShape::Decode { .. }))
        .count();
    assert_eq!(decodes, 25, "5 batches x 5 occupancies fit the pool");
    let fit = fit_profile(truth.clone(), &samples, total).expect("fit");
    for r in &fit.residuals {
        let tolerance = if r.fitted { 0.01 } else { 0.05 };
        assert!(
            r.rel_error.abs() < tolerance,
            "{:?}: measured {} ms, predicted {} ms",
            r.shape,
            r.measured_ms,
            r.predicted_ms
        );
    }
    let (p, q) = (&fit.profile.prefill_ms, &truth.prefill_ms);
    assert!((p.t1 - q.t1).abs() / q.t1 < 0.01, "{p:?} against {q:?}");
    assert!((p.tc - q.tc).abs() / q.tc < 0.02, "{p:?} against {q:?}");
    assert!(fit.prefill_after_context.steps == 4 && fit.prefill_after_context.max_abs < 0.01);
    let (d, e) = (&fit.profile.decode_ms, &truth.decode_ms);
    assert!((d.per_seq - e.per_seq).abs() < 0.02, "{d:?} against {e:?}");
    assert!((d.a1 - e.a1).abs() / e.a1 < 0.02, "{d:?} against {e:?}");
    // The sum model is exact on the sim engine: mixed steps are predicted too.
    assert_eq!(fit.mixed.steps, 4);
    assert!(fit.mixed.max_abs < 0.05, "{:?}", fit.mixed);
}

#[test]
fn occupancy_is_what_the_decode_steps_read_over_the_pool() {
    let grid = FitGrid {
        prefill_tokens: vec![],
        prefill_context: vec![],
        decode_batches: vec![4],
        occupancies: vec![0.5],
        mixed: vec![],
        reps: 1,
        warmup: 0,
        ..FitGrid::default()
    };
    let (samples, total) = measured(known(), &grid);
    let [s] = samples.as_slice() else {
        panic!("one shape: {samples:?}")
    };
    let StepShape::Decode {
        batch,
        context,
        blocks_read,
    } = s.shape
    else {
        panic!("{s:?}")
    };
    assert_eq!(batch, 4);
    assert_eq!(blocks_read, total / 2, "4 sequences read half the pool");
    assert_eq!((context + 1) % 16, 0, "each context fills its blocks");
    let expect = known().decode_ms(4, 0.5);
    assert!(
        (s.ms - expect).abs() / expect < 0.01,
        "{} against {expect}",
        s.ms
    );
}

#[test]
fn shapes_beyond_the_pool_or_the_context_are_skipped() {
    let grid = FitGrid {
        prefill_tokens: vec![64, 40_000],
        prefill_context: vec![40_000],
        decode_batches: vec![4096],
        occupancies: vec![0.5],
        mixed: vec![],
        reps: 1,
        warmup: 0,
        ..FitGrid::default()
    };
    let (samples, _) = measured(known(), &grid);
    assert_eq!(
        samples.iter().map(|s| s.shape).collect::<Vec<_>>(),
        vec![StepShape::Prefill {
            tokens: 64,
            context: 0
        }],
        "a 40k prompt passes the 32k context; 4096 sequences of one block each pass half the pool"
    );
}

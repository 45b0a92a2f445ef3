//! Unit tests of `dolphinctl replay`'s argument parsing and validation.

use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

fn args(extra: &[&str]) -> Result<ReplayArgs, clap::Error> {
    let cli = Cli::try_parse_from(["dolphinctl", "replay"].iter().chain(extra))?;
    let Command::Replay(args) = cli.command else {
        panic!("not replay")
    };
    Ok(*args)
}

fn plan(extra: &[&str]) -> Result<ReplayPlan, ReplayError> {
    args(extra).expect("parses").plan()
}

#[test]
fn defaults_for_a_synthetic_workload() {
    let p = plan(&["--workload", "humaneval", "--requests", "40"]).unwrap();
    assert_eq!(p.slo, Slo::new(5000.0, 250.0));
    assert_eq!(p.arrivals, Arrivals::ClosedLoop { concurrency: 16 });
    assert_eq!(p.spec.requests, Some(40));
    let TargetPlan::Live(live) = &p.target else {
        panic!("not live")
    };
    assert_eq!(live.max_in_flight, 256);
    assert_eq!(live.router_grpc, DEFAULT_ROUTER_GRPC);
    assert!(live.progress);
    assert_eq!(p.record.arrivals, "closed:16");
    assert_eq!(p.record.max_in_flight, Some(16));
    assert!(p.warnings.is_empty());
}

#[test]
fn traces_default_to_their_own_timestamps() {
    let p = plan(&["--workload", "mooncake:/x.jsonl", "--slo-tpot", "60ms"]).unwrap();
    assert_eq!(p.arrivals, Arrivals::Trace { time_scale: 1.0 });
    assert_eq!(p.slo.tpot_ms, 60.0);
    let p = plan(&["--workload", "azure:/x.csv", "--arrivals", "poisson:3"]).unwrap();
    assert!(matches!(p.arrivals, Arrivals::Poisson { .. }));
    for w in [
        "bailian:/qwen_traceA_blksz_16.jsonl",
        "burstgpt:/BurstGPT_1.csv",
    ] {
        let p = plan(&["--workload", w]).unwrap();
        assert_eq!(p.arrivals, Arrivals::Trace { time_scale: 1.0 }, "{w}");
    }
}

#[test]
fn synthetic_workloads_have_no_trace_times() {
    let err = plan(&["--workload", "hybrid", "--arrivals", "trace:0.5"]).unwrap_err();
    assert!(err.to_string().contains("no timestamps"), "{err}");
    assert_eq!(err.exit_code(), 64);
}

#[test]
fn bad_values_are_refused_by_the_parser() {
    for bad in [
        &["--workload", "nope"][..],
        &["--workload", "humaneval", "--slo-ttft", "5"],
        &["--workload", "humaneval", "--slo-tpot", "fast"],
        &["--workload", "humaneval", "--arrivals", "closed:0"],
        &["--workload", "humaneval", "--target", "cloud"],
        &["--workload", "humaneval", "--max-in-flight", "0"],
        &["--workload", "humaneval", "--split", "2x2"],
        &["--workload", "humaneval", "--policy", "random"],
        &["--requests", "3"],
    ] {
        assert!(args(bad).is_err(), "{bad:?}");
    }
    let msg = args(&["--workload", "humaneval", "--slo-ttft", "5"])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no unit"), "{msg}");
}

#[test]
fn flags_of_the_other_target_are_refused() {
    for (flags, needle) in [
        (
            &["--split", "1p1d"][..],
            "--split only applies to --target sim",
        ),
        (&["--policy", "threshold"], "--policy only applies"),
        (&["--total-blocks", "10"], "--total-blocks only applies"),
        (&["--sim-profile", "dynamo-mocker"], "--sim-profile only"),
        (&["--target", "sim", "--model", "m"], "--model only applies"),
        (
            &["--target", "sim", "--vocab-size", "99"],
            "--vocab-size only applies",
        ),
        (&["--target", "sim"], "needs --split"),
        (
            &["--target", "sim", "--split", "1p1d", "--policy", "dolphin"],
            "needs --table",
        ),
        (&["--requests", "0"], "at least 1"),
        (&["--slo-ttft", "0s"], "above zero"),
    ] {
        let mut all = vec!["--workload", "humaneval"];
        all.extend_from_slice(flags);
        let err = plan(&all).expect_err(needle);
        assert!(err.to_string().contains(needle), "{flags:?}: {err}");
        assert_eq!(err.exit_code(), 64);
    }
}

#[test]
fn sim_target_resolves_profile_policy_and_blocks() {
    let p = plan(&[
        "--workload",
        "arxiv",
        "--target",
        "sim",
        "--split",
        "2p2d",
        "--arrivals",
        "poisson:2.5",
    ])
    .unwrap();
    let TargetPlan::Sim(sim) = &p.target else {
        panic!("not sim")
    };
    assert_eq!(sim.split, Split::new(2, 2));
    assert_eq!(sim.profile.name, DEFAULT_SIM_PROFILE);
    assert_eq!(sim.policy.name(), "threshold");
    assert_eq!(sim.total_blocks, DEFAULT_TOTAL_BLOCKS);
    assert_eq!(p.record.split.as_deref(), Some("2p2d"));
    assert_eq!(p.record.router_grpc, None);

    let err = plan(&[
        "--workload",
        "arxiv",
        "--target",
        "sim",
        "--split",
        "1p1d",
        "--sim-profile",
        "/no/such/profile.json",
    ])
    .unwrap_err();
    assert!(matches!(err, ReplayError::Profile { .. }), "{err}");
    assert_eq!(err.exit_code(), 64);
}

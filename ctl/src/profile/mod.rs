//! `dolphinctl profile fit`: measure an engine step by step over a grid of prefill sizes, batch
//! sizes and KV occupancies, fit a timing profile to it, and write the profile (the JSON the sim
//! engine and the simulator load with `--sim-profile FILE`) and a report of every measured step
//! against it. The engine is either built here with the workers' own flags, so the profile
//! describes the engine exactly as a worker would run it (its threads, weights and KV pool), or
//! a running decode worker measured over gRPC (`--worker`, [`live`]).

pub mod live;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use dolphin_engine::profile_fit::{
    FitError, FitGrid, ProfileFit, StepSample, fit_profile, measure,
};
use dolphin_engine::sim::{DecodeCost, PrefillCost};
use dolphin_engine::{Backend, EngineInfo, SimProfile, candle_backend, sim_backend};
use dolphin_worker_common::EngineKind;
use dolphin_worker_common::args::EngineArgs;
use dolphin_worker_common::engine::{candle_config, sim_config};
use serde::Serialize;

use crate::machine::{cpu_flags, cpu_name};

/// `dolphinctl profile`.
#[derive(Clone, Debug, Args)]
pub struct ProfileArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ProfileCommand,
}

/// The profile subcommands.
#[derive(Clone, Debug, Subcommand)]
pub enum ProfileCommand {
    /// Measure an engine over a grid of step shapes and fit a timing profile to it.
    Fit(Box<FitArgs>),
}

/// `dolphinctl profile fit`.
#[derive(Clone, Debug, Args)]
pub struct FitArgs {
    /// The engine, as a worker would run it (`--engine candle --threads 1 --kv-bytes 256MiB`).
    /// Not used with `--worker`.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Measure this running decode worker over gRPC (`host:port`, or `https://host:port` with
    /// the `--tls-*` flags) instead of an engine built here: prefill steps from the TTFT of
    /// single requests, decode steps from the TPOT of concurrent ones, as the worker reports
    /// them. The worker must be otherwise idle.
    #[arg(long)]
    pub worker: Option<String>,
    /// With `--worker`: tokens each decode request generates (its TPOT covers all but the
    /// first).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(3..))]
    pub decode_tokens: u32,
    /// With `--worker`: the longest cached prefix prefilled (once) for the context and decode
    /// shapes; contexts beyond it are skipped. Its prefill takes a while on a CPU engine.
    #[arg(long, default_value_t = 2048)]
    pub max_prefix: u32,
    /// Where to write the profile JSON.
    #[arg(long)]
    pub out: PathBuf,
    /// Where to write every measured step against the profile (default: beside the profile,
    /// `<out stem>.fit.json`).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The profile's name (default: `<model>-<engine>-t<threads>`, `<model>-<engine>-live` for
    /// a worker).
    #[arg(long)]
    pub name: Option<String>,
    /// Bandwidth between prefill and decode workers the profile assumes, Gb/s (default: 27.3,
    /// loopback TCP as the kv_transfer benchmark measured it on a 2-core machine).
    #[arg(long, default_value_t = 27.3)]
    pub link_gbps: f64,
    /// Prompt tokens of the prefill steps, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = FitGrid::default().prefill_tokens)]
    pub prefill_tokens: Vec<u32>,
    /// Cached context before a 256-token chunk, comma-separated (fits the context term).
    #[arg(long, value_delimiter = ',', default_values_t = FitGrid::default().prefill_context)]
    pub prefill_context: Vec<u32>,
    /// Sequences of the decode steps, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = FitGrid::default().decode_batches)]
    pub batches: Vec<u32>,
    /// KV occupancies of the decode steps (blocks read over the pool), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = FitGrid::default().occupancies)]
    pub occupancies: Vec<f64>,
    /// Timed runs per shape (the median is kept).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
}

/// What `profile fit` can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The flags describe no engine that can start.
    #[error("engine: {0}")]
    Config(String),
    /// A measured step failed.
    #[error("measuring a step")]
    Step(#[source] dolphin_engine::BackendError),
    /// The worker to measure cannot be reached.
    #[error("connecting to the worker")]
    Connect(#[source] crate::CtlError),
    /// The worker refused or failed a call.
    #[error("the worker's {call}: {code:?}: {message}")]
    Worker {
        /// The RPC.
        call: &'static str,
        /// Its status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// A measured request did not give what a measurement needs.
    #[error("measuring: {0}")]
    Measure(String),
    /// The measurements do not determine a profile.
    #[error("fitting the profile")]
    Fit(#[source] FitError),
    /// A flag is out of range.
    #[error("{0}")]
    Invalid(String),
    /// The profile or report could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ProfileError {
    fn worker(call: &'static str, status: &tonic::Status) -> Self {
        ProfileError::Worker {
            call,
            code: status.code(),
            message: status.message().to_owned(),
        }
    }

    /// The process exit code: 64 for bad flags or configuration, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ProfileError::Config(_) | ProfileError::Invalid(_) => 64,
            _ => 1,
        }
    }
}

/// The report written beside the profile.
#[derive(Debug, Serialize)]
struct Report<'a> {
    /// The CPU of the machine that measured: the engine's own with an in-process fit.
    cpu: String,
    cpu_flags: Vec<&'static str>,
    engine: &'a str,
    /// The worker measured over gRPC (`--worker`), if one was.
    worker: Option<&'a str>,
    threads: Option<usize>,
    total_blocks: u32,
    block_size: u32,
    grid: &'a FitGrid,
    fit: &'a ProfileFit,
    /// Every shape with each timed run.
    samples: &'a [StepSample],
}

/// Runs `dolphinctl profile`.
pub async fn run(args: ProfileArgs, out: &mut impl Write) -> Result<(), ProfileError> {
    match args.command {
        ProfileCommand::Fit(a) => {
            check(&a)?;
            let measured = match &a.worker {
                Some(url) => measure_worker(url, &a).await?,
                None => {
                    // Model steps take seconds: off the async runtime's threads.
                    let b = a.clone();
                    tokio::task::spawn_blocking(move || measure_here(&b))
                        .await
                        .map_err(|e| ProfileError::Config(e.to_string()))??
                }
            };
            let fit = fit_and_write(&a, measured)?;
            print_fit(&fit, &a.out, out);
            Ok(())
        }
    }
}

/// The flags' ranges, before anything runs.
fn check(a: &FitArgs) -> Result<(), ProfileError> {
    if !(a.link_gbps.is_finite() && a.link_gbps > 0.0) {
        return Err(ProfileError::Invalid("--link-gbps must be positive".into()));
    }
    if let Some(o) = a.occupancies.iter().find(|o| !(**o > 0.0 && **o <= 1.0)) {
        return Err(ProfileError::Invalid(format!(
            "occupancy {o} is outside (0, 1]"
        )));
    }
    Ok(())
}

fn grid(a: &FitArgs) -> FitGrid {
    FitGrid {
        prefill_tokens: a.prefill_tokens.clone(),
        prefill_context: a.prefill_context.clone(),
        decode_batches: a.batches.clone(),
        occupancies: a.occupancies.clone(),
        reps: a.reps,
        ..FitGrid::default()
    }
}

/// The measured steps and what the profile says about the engine that ran them.
struct Measured {
    samples: Vec<StepSample>,
    engine: String,
    model: String,
    total_blocks: u32,
    block_size: u32,
    kv_bytes_per_token: u64,
    /// The engine's step caps (prefill chunk, mixed prefill), which the profile carries.
    caps: (u32, u32),
    /// The default profile name's tail: `t<threads>` here, `live` for a worker.
    how: String,
    /// The first note: what was measured, where.
    source: String,
    grid: FitGrid,
}

/// Builds the engine per the flags and times the grid on it.
fn measure_here(a: &FitArgs) -> Result<Measured, ProfileError> {
    let grid = grid(a);
    let e = &a.engine;
    let config = |err: &dyn std::fmt::Display| ProfileError::Config(err.to_string());
    // (engine, samples, backend facts, the engine's step caps the profile carries).
    let (engine, (samples, info), caps) = match e.engine {
        EngineKind::Candle => {
            let cfg = candle_config(e).map_err(|err| config(&err))?;
            let backend = candle_backend(&cfg).map_err(|err| config(&err))?;
            let caps = (cfg.prefill_chunk_tokens, cfg.mixed_prefill_tokens);
            ("candle", time_grid(backend, &grid)?, caps)
        }
        EngineKind::Sim => {
            let cfg = sim_config(e).map_err(|err| config(&err))?;
            let backend = sim_backend(&cfg).map_err(|err| config(&err))?;
            let caps = (cfg.prefill_chunk_tokens, cfg.mixed_prefill_tokens);
            ("sim", time_grid(backend, &grid)?, caps)
        }
    };
    let threads = e
        .threads
        .map_or_else(|| "default".into(), |t| t.to_string());
    let source = format!(
        "Measured by `dolphinctl profile fit` on {} ({}), engine {engine}, model {}, {} compute thread(s), weights {}.",
        cpu_name(),
        cpu_flags().join(" "),
        info.model,
        threads,
        e.weights
    );
    Ok(Measured {
        samples,
        engine: engine.into(),
        model: info.model.clone(),
        total_blocks: info.total_blocks,
        block_size: info.block_size,
        kv_bytes_per_token: info.kv_bytes_per_token,
        caps,
        how: format!("t{threads}"),
        source,
        grid,
    })
}

/// Times the grid on the decode worker at `url`.
async fn measure_worker(url: &str, a: &FitArgs) -> Result<Measured, ProfileError> {
    let grid = grid(a);
    let opts = live::LiveOptions {
        decode_tokens: a.decode_tokens,
        max_prefix: a.max_prefix,
    };
    let progress = |s: &StepSample| eprintln!("profile fit: {:?}: {:.2} ms", s.shape, s.ms);
    let live::Measured { info, samples } = live::measure(url, &grid, opts, progress).await?;
    let source = format!(
        "Measured by `dolphinctl profile fit --worker {url}` over gRPC from the timings the worker reports (prefill: TTFT of one request with nothing cached or a cached prefix; decode: TPOT of concurrent requests over a cached prefix): worker {}, engine {}, model {}, version {}.",
        info.worker_id, info.engine, info.model, info.version
    );
    Ok(Measured {
        samples,
        engine: info.engine.clone(),
        model: info.model.clone(),
        total_blocks: info.total_blocks,
        block_size: info.block_size,
        kv_bytes_per_token: info.kv_bytes_per_token,
        caps: (info.prefill_chunk_tokens, info.mixed_prefill_tokens),
        how: "live".into(),
        source,
        grid,
    })
}

/// Fits the profile to `m`, writes it and the report; returns the fit.
fn fit_and_write(a: &FitArgs, m: Measured) -> Result<ProfileFit, ProfileError> {
    let (prefill_chunk, mixed_prefill) = m.caps;
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{}-{}", m.model, m.engine, m.how));
    let base = SimProfile {
        name,
        notes: vec![
            m.source.clone(),
            format!(
                "Occupancy a = KV blocks a step reads / {} blocks of {} tokens (the engine's pool): run the simulator with --total-blocks {} and --block-size {}.",
                m.total_blocks, m.block_size, m.total_blocks, m.block_size
            ),
            "prefill ms = t2 t^2 + t1 t + t0 + tc t c (c: tokens computed before the chunk); decode ms = a2 a^2 + a1 a + a0 + per_seq b; a mixed step is charged the sum. Both fitted by least relative squares; the fit report gives each measured step's error.".into(),
            format!(
                "kv_bytes_per_token: the engine's exported KV ({} B); link_gbps: {} Gb/s as given to --link-gbps.",
                m.kv_bytes_per_token, a.link_gbps
            ),
        ],
        // Placeholders: the fit sets every coefficient.
        prefill_ms: PrefillCost {
            t2: 0.0,
            t1: 0.0,
            t0: 0.0,
            tc: 0.0,
        },
        decode_ms: DecodeCost {
            a2: 0.0,
            a1: 0.0,
            a0: 0.0,
            per_seq: 0.0,
            floor: 0.0,
        },
        kv_bytes_per_token: m.kv_bytes_per_token,
        link_gbps: a.link_gbps,
        eos_probability: 0.0,
        prefill_chunk_tokens: prefill_chunk,
        mixed_prefill_tokens: mixed_prefill,
    };
    let fit = fit_profile(base, &m.samples, m.total_blocks).map_err(ProfileError::Fit)?;
    write_json(&a.out, &fit.profile)?;
    let report_path = a.report.clone().unwrap_or_else(|| report_path(&a.out));
    let report = Report {
        cpu: cpu_name(),
        cpu_flags: cpu_flags(),
        engine: &m.engine,
        worker: a.worker.as_deref(),
        threads: a.worker.is_none().then_some(a.engine.threads).flatten(),
        total_blocks: m.total_blocks,
        block_size: m.block_size,
        grid: &m.grid,
        fit: &fit,
        samples: &m.samples,
    };
    write_json(&report_path, &report)?;
    Ok(fit)
}

/// Times `grid` on `backend`, printing each shape as it is measured; the samples and the
/// backend's facts.
fn time_grid<B: Backend>(
    mut backend: B,
    grid: &FitGrid,
) -> Result<(Vec<StepSample>, EngineInfo), ProfileError> {
    let progress = |s: &StepSample| eprintln!("profile fit: {:?}: {:.2} ms", s.shape, s.ms);
    let samples = measure(&mut backend, grid, progress).map_err(ProfileError::Step)?;
    Ok((samples, backend.info().clone()))
}

/// `<dir>/<stem>.fit.json` for a profile at `<dir>/<stem>.json`.
fn report_path(profile: &Path) -> PathBuf {
    let stem = profile
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "profile".into());
    profile.with_file_name(format!("{stem}.fit.json"))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), ProfileError> {
    let json = serde_json::to_string_pretty(value).map_err(|e| ProfileError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, json + "\n").map_err(|source| ProfileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn print_fit(fit: &ProfileFit, path: &Path, out: &mut impl Write) {
    let p = &fit.profile;
    let (pf, d) = (&p.prefill_ms, &p.decode_ms);
    let _ = writeln!(out, "wrote {} ({})", path.display(), p.name);
    let _ = writeln!(
        out,
        "prefill ms = {:.4e} t^2 + {:.4e} t + {:.3} + {:.4e} t c",
        pf.t2, pf.t1, pf.t0, pf.tc
    );
    let _ = writeln!(
        out,
        "decode ms  = {:.3} a^2 + {:.3} a + {:.3} + {:.3} b (floor {:.3})",
        d.a2, d.a1, d.a0, d.per_seq, d.floor
    );
    for (what, s) in [
        ("prefill", &fit.prefill),
        ("decode", &fit.decode),
        ("prefill after context", &fit.prefill_after_context),
        ("mixed (not fitted)", &fit.mixed),
    ] {
        let _ = writeln!(
            out,
            "{what}: {} steps, |error| median {:.1}%, max {:.1}%",
            s.steps,
            100.0 * s.median_abs,
            100.0 * s.max_abs
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        p: ProfileArgs,
    }

    #[tokio::test]
    async fn fitting_the_sim_engine_writes_its_profile_and_a_report() {
        let dir = tempfile::tempdir().expect("tmp");
        let out = dir.path().join("p.json");
        let cli = Cli::parse_from([
            "x",
            "fit",
            "--engine=sim",
            "--sim-profile=dynamo-mocker",
            "--total-blocks=1024",
            "--reps=1",
            &format!("--out={}", out.display()),
        ]);
        let mut printed = Vec::new();
        run(cli.p, &mut printed).await.expect("fit");
        let profile = SimProfile::load(out.to_str().expect("utf-8")).expect("a loadable profile");
        let truth = SimProfile::builtin("dynamo-mocker").expect("shipped");
        for t in [16, 512, 2048] {
            let (got, want) = (profile.prefill_ms(t), truth.prefill_ms(t));
            assert!(
                (got - want).abs() / want < 0.01,
                "{t}: {got} against {want}"
            );
        }
        assert!(
            profile
                .notes
                .iter()
                .any(|n| n.contains("--total-blocks 1024"))
        );
        let report: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("p.fit.json")).expect("report"),
        )
        .expect("json");
        assert_eq!(report["total_blocks"], 1024);
        assert!(
            report["fit"]["residuals"]
                .as_array()
                .is_some_and(|r| r.len() > 30)
        );
        let text = String::from_utf8(printed).expect("utf-8");
        assert!(text.contains("decode ms"), "{text}");
    }

    #[tokio::test]
    async fn bad_flags_are_refused_before_anything_runs() {
        let cli = Cli::parse_from([
            "x",
            "fit",
            "--engine=sim",
            "--occupancies=0.5,1.5",
            "--out=/nonexistent/p.json",
        ]);
        let err = run(cli.p, &mut Vec::new()).await.expect_err("1.5");
        assert!(err.to_string().contains("outside (0, 1]"), "{err}");
        let cli = Cli::parse_from([
            "x",
            "fit",
            "--engine=candle",
            "--model-path=/nonexistent.gguf",
            "--out=/tmp/p.json",
        ]);
        let err = run(cli.p, &mut Vec::new()).await.expect_err("no model");
        assert!(err.to_string().contains("not a file"), "{err}");
    }
}

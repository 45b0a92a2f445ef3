//! `dolphinctl learn`: learn the routing table for one prefill/decode split by measurement
//! (DESIGN.md sections 1 and 8).
//!
//! 1. Gather: replay the workload once (the simulator under the Dynamo 1.6 rule, or one period
//!    on the live router under its fallback) and keep every request's four features.
//! 2. Fit: log-transform, standardize and cluster them (k-means or a Gaussian mixture) into K
//!    clusters, starting each cluster's bit at the Dynamo rule's majority.
//! 3. Search: per-cluster scan (2K periods), then epsilon-greedy refinement until it stops
//!    improving ([`dolphin_learn::search`]). Each period is the whole workload in the
//!    simulator, or the next `--period-requests` requests on the live router with the
//!    candidate bits installed as a new table version.
//! 4. Keep: the best bits with their provenance, to a file and/or the router's table store.
//!    A live run that does not activate them puts back the table active before learning.
//!
//! Every round is printed and appended to `--log`; an existing log resumes the run.

mod args;
mod live;
mod log;

use std::io::Write;
use std::path::PathBuf;

use dolphin_engine::SimProfile;
use dolphin_learn::fit::{FitConfig, InitBits, fit_table};
use dolphin_learn::load_rule::learn_rule_on_sim;
use dolphin_learn::measure::{learned_table, records_from_outcomes};
use dolphin_learn::search::{Evaluator, Phase, Round, SearchConfig, SearchResult, search};
use dolphin_learn::sim_target::{SimEvaluator, SimTarget};
use dolphin_proto::v1;
use dolphin_router::dolphin::RoutingTable;
use dolphin_router::dolphin::table::{ClusterMethod, LoadRule, TableSlo};
use dolphin_router::policy::{Policy, ThresholdConfig};
use dolphin_sim::SimClusterConfig;
use dolphin_workload::{RequestOutcome, Slo, Workload, WorkloadSpec};

pub use args::{LearnArgs, Method};
pub use live::{LiveEvaluator, LiveTarget};

use crate::error::CtlError;
use crate::replay::{ReplayError, Target, duration::millis};

/// Why `dolphinctl learn` failed.
#[derive(Debug, thiserror::Error)]
pub enum LearnCmdError {
    /// Arguments that do not fit together.
    #[error("{0}")]
    Usage(String),
    /// Loading the workload or replaying a period failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// Fitting or searching failed.
    #[error("learning failed")]
    Learn(#[from] dolphin_learn::LearnError),
    /// Talking to the router failed.
    #[error(transparent)]
    Router(#[from] CtlError),
    /// The live cluster is not in a state to learn on.
    #[error("{0}")]
    Live(String),
    /// A file could not be read or written.
    #[error("cannot access {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A round log line that does not parse.
    #[error("{}:{line}: {reason}", path.display())]
    Log {
        /// The log.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The log was written for other settings.
    #[error(
        "the round log {} was written for other settings; use another --log or the same settings\n  log: {found}\n  now: {expected}",
        path.display()
    )]
    LogMismatch {
        /// The log.
        path: PathBuf,
        /// The settings in the log.
        found: String,
        /// This run's settings.
        expected: String,
    },
}

impl LearnCmdError {
    /// The process exit code (64 for usage errors, as `EX_USAGE`).
    pub fn exit_code(&self) -> u8 {
        match self {
            LearnCmdError::Usage(_) | LearnCmdError::LogMismatch { .. } => 64,
            LearnCmdError::Replay(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// Where periods are measured.
enum Measure {
    Sim(Box<SimTarget>),
    Live(Box<LiveTarget>),
}

/// Runs `dolphinctl learn`; the learned table goes to `--out`, the router (`--activate`), or
/// `out` when neither is given. Progress goes to stderr.
pub async fn run(args: &LearnArgs, out: &mut impl Write) -> Result<(), LearnCmdError> {
    let usage = |m: String| Err(LearnCmdError::Usage(m));
    if !(0.0..=1.0).contains(&args.epsilon) || !(0.0..=1.0).contains(&args.epsilon_decay) {
        return usage("--epsilon and --epsilon-decay must be in [0, 1]".into());
    }
    let k = args.k as usize;
    let slo = Slo::new(millis(args.slo_ttft), millis(args.slo_tpot));
    let mut spec = args.workload.clone();
    if args.requests.is_some() {
        spec.requests = args.requests;
    }
    if let Some(seed) = args.seed {
        spec.seed = seed;
    }
    // `--choose-load-rule` on a trace validates on the rows after the training ones: both
    // are read here, in one pass (`validation_split` divides them).
    let workload = match spec.requests {
        Some(n) if args.choose_load_rule && spec.source.is_trace() => WorkloadSpec {
            requests: Some(n.saturating_mul(2)),
            ..spec.clone()
        }
        .load(),
        _ => spec.load(),
    }
    .map_err(ReplayError::from)?;
    crate::replay::warn_skipped(&workload);
    let method = match args.method {
        Method::Kmeans => ClusterMethod::Kmeans,
        Method::Gmm => ClusterMethod::Gmm,
    };
    let fit_cfg = FitConfig {
        split: args.split,
        k,
        method,
        slo: TableSlo {
            ttft_ms: slo.ttft_ms,
            tpot_ms: slo.tpot_ms,
        },
        workload: format!(
            "{spec} ({} requests, {})",
            workload.requests.len(),
            args.arrivals
        ),
        bits: InitBits::Threshold(ThresholdConfig::default()),
        seed: args.learn_seed,
        features: [true, true, true, !args.no_output_feature],
        reward: args.reward,
        load_rule: args.load_rule(),
    };
    let search_cfg = SearchConfig {
        k,
        scan: !args.no_scan,
        epsilon: args.epsilon,
        epsilon_decay: args.epsilon_decay,
        max_rounds: args.max_rounds,
        patience: args.patience,
        seed: args.learn_seed,
    };
    let settings = settings(args, &fit_cfg, &search_cfg);
    if args.choose_load_rule {
        return choose_load_rule(args, &spec, workload, slo, &fit_cfg, &search_cfg, out).await;
    }

    let mut measure = match args.target {
        Target::Sim => Measure::Sim(Box::new(sim_target(args, &workload, slo)?)),
        Target::Live => {
            if args.classifier.is_some() {
                return Err(ReplayError::Usage(
                    "--classifier only applies to --target sim (the live router uses its own classifier)".into(),
                )
                .into());
            }
            Measure::Live(Box::new(LiveTarget::connect(args, &workload, slo).await?))
        }
    };

    // Resume, or gather and fit.
    let resumed = match &args.log {
        Some(path) => log::read(path)?,
        None => None,
    };
    let (base, rounds, log_text) = match resumed {
        Some(r) if r.header.settings != settings => {
            return Err(LearnCmdError::LogMismatch {
                path: args.log.clone().unwrap_or_default(),
                found: r.header.settings,
                expected: settings,
            });
        }
        Some(r) => {
            eprintln!(
                "resuming from {} rounds in {}",
                r.rounds.len(),
                args.log
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
            (r.header.table, r.rounds, r.kept)
        }
        None => {
            let gathered = gather(&mut measure).await?;
            let fit = fit_table(&records_from_outcomes(&gathered), &fit_cfg)?;
            eprintln!(
                "fitted {} {} clusters on {} requests: sizes {:?}, initial bits {:?} (the Dynamo 1.6 rule's majority)",
                k,
                method.as_str(),
                fit.samples,
                fit.cluster_sizes,
                fit.table.bits
            );
            // Measure the table as its log header reads back, which is what a resumed run
            // will measure (see the `log` module).
            let line = log::Header {
                settings: settings.clone(),
                table: fit.table,
            }
            .line()?;
            let header = log::Header::from_line(&line).map_err(|e| {
                LearnCmdError::Learn(dolphin_learn::LearnError::Invalid(format!(
                    "the fitted table does not read back from JSON: {e}"
                )))
            })?;
            (header.table, Vec::new(), line)
        }
    };
    let writer = match &args.log {
        Some(path) => Some(log::Writer::create(path, &log_text)?),
        None => None,
    };

    let result = match measure {
        Measure::Sim(mut target) => {
            let mut eval = SimEvaluator::new(&mut target, base.clone());
            search_logged(&base.bits, &search_cfg, &mut eval, &rounds, writer)?
        }
        Measure::Live(mut target) => {
            // The search is synchronous and each live period async: run the search on a
            // blocking thread whose evaluator enters the runtime, which this thread keeps
            // driving while it waits.
            let handle = tokio::runtime::Handle::current();
            let table = base.clone();
            let cfg = search_cfg.clone();
            let (result, target) = tokio::task::spawn_blocking(move || {
                let bits = table.bits.clone();
                let mut eval = LiveEvaluator {
                    target: &mut target,
                    table,
                    handle,
                };
                let result = search_logged(&bits, &cfg, &mut eval, &rounds, writer);
                (result, target)
            })
            .await
            .map_err(|e| LearnCmdError::Live(format!("the learning task failed: {e}")))?;
            // Every round activated its table; unless the learned one is to be activated,
            // the router goes back to the table it had.
            if args.activate && result.is_ok() {
                result?
            } else {
                match (result, target.restore().await) {
                    (Ok(r), Ok(())) => r,
                    (Ok(_), Err(e)) => return Err(e),
                    (Err(e), restored) => {
                        if let Err(r) = restored {
                            eprintln!("cannot re-activate the table active before learning: {r}");
                        }
                        return Err(e);
                    }
                }
            }
        }
    };
    let how = match args.target {
        Target::Sim => format!("simulator, profile {}", args.sim_profile),
        Target::Live => format!("live router {}", args.router_grpc),
    };
    let table = learned_table(base, &result, &how);
    eprintln!(
        "learned bits {:?} (attainment {:.4}), found in round {} of {}",
        table.bits, result.attainment, result.converged_round, result.rounds
    );
    keep(args, &table, out).await
}

/// `workload` on the simulated cluster of `args`.
fn sim_target(args: &LearnArgs, workload: &Workload, slo: Slo) -> Result<SimTarget, LearnCmdError> {
    let profile = SimProfile::load(&args.sim_profile).map_err(|source| ReplayError::Profile {
        name: args.sim_profile.clone(),
        source,
    })?;
    let mut cluster = SimClusterConfig::new(args.split.prefill, args.split.decode, profile);
    cluster.total_blocks = args.total_blocks;
    let mut target = SimTarget::new(cluster, workload, args.arrivals, slo)?;
    if args.max_tokens_cap {
        target.cap_max_tokens();
    }
    if let Some(path) = &args.classifier {
        target.set_classifier(crate::replay::load_classifier(path)?);
    }
    Ok(target)
}

/// `--choose-load-rule`: the table learned under each candidate rule on `workload`, judged on
/// a validation sample, the best kept.
async fn choose_load_rule(
    args: &LearnArgs,
    spec: &WorkloadSpec,
    workload: Workload,
    slo: Slo,
    fit: &FitConfig,
    search: &SearchConfig,
    out: &mut impl Write,
) -> Result<(), LearnCmdError> {
    let usage = |m: &str| Err(LearnCmdError::Usage(m.into()));
    if args.target != Target::Sim {
        return usage("--choose-load-rule learns on the simulator (--target sim)");
    }
    if args.log.is_some() {
        return usage(
            "--choose-load-rule runs one search per rule and writes no round log; drop --log",
        );
    }
    let (train, validate) = validation_split(spec, workload)?;
    eprintln!(
        "choosing a load rule: learning on {} requests, validating on {}",
        train.requests.len(),
        validate.requests.len()
    );
    let mut train_target = sim_target(args, &train, slo)?;
    let mut validate_target = sim_target(args, &validate, slo)?;
    // The provenance names the sample the bits were learned on, and the one that chose.
    let fit = FitConfig {
        workload: format!(
            "{spec} ({} requests, {}; rule chosen on {} more)",
            train.requests.len(),
            args.arrivals,
            validate.requests.len()
        ),
        ..fit.clone()
    };
    let rules: Vec<Option<LoadRule>> = args.load_rule_candidates.iter().map(|c| c.0).collect();
    let (learned, candidates) = learn_rule_on_sim(
        &mut train_target,
        Some(&mut validate_target),
        &fit,
        search,
        &rules,
    )?;
    for c in &candidates {
        eprintln!(
            "load rule {:<32} training attainment {:.4}, validation {:.4}",
            rule_name(c.rule),
            c.attainment,
            c.validation.unwrap_or(f64::NAN)
        );
    }
    let table = &learned.table;
    eprintln!(
        "chose load rule {}: bits {:?}, found in round {} of {}",
        rule_name(table.load_rule),
        table.bits,
        learned.search.converged_round,
        learned.search.rounds
    );
    keep(args, table, out).await
}

/// "none" or the rule as every command names it.
fn rule_name(rule: Option<LoadRule>) -> String {
    rule.map_or("none".into(), |r| r.to_string())
}

/// The training and validation samples of `--choose-load-rule`: a synthetic mix is
/// regenerated with the next seed; a trace's next rows validate (its second half when no
/// `--requests` was given). `workload` holds a trace's rows of both (`learn` reads twice
/// `--requests`).
fn validation_split(
    spec: &WorkloadSpec,
    workload: Workload,
) -> Result<(Workload, Workload), LearnCmdError> {
    if !spec.source.is_trace() {
        let next = WorkloadSpec {
            seed: spec.seed.wrapping_add(1),
            ..spec.clone()
        };
        return Ok((workload, next.load().map_err(ReplayError::from)?));
    }
    let all = workload;
    let n = spec.requests.unwrap_or(all.requests.len() / 2);
    if n == 0 || all.requests.len() < 2 * n {
        return Err(LearnCmdError::Usage(format!(
            "--choose-load-rule validates on the trace's next {n} rows, but {spec} has {} in all",
            all.requests.len()
        )));
    }
    let (mut train, mut validate) = (all.clone(), all);
    train.requests.truncate(n);
    validate.requests.drain(..n);
    validate.requests.truncate(n);
    Ok((train, validate))
}

/// Runs the search, printing every round and appending it to the log.
fn search_logged(
    initial: &[u8],
    cfg: &SearchConfig,
    eval: &mut dyn Evaluator,
    resume: &[Round],
    mut writer: Option<log::Writer>,
) -> Result<SearchResult, LearnCmdError> {
    let mut log_error = None;
    let mut on_round = |r: &Round| {
        eprintln!("{}", describe(r));
        if let Some(w) = writer.as_mut()
            && let Err(e) = w.append(r)
            && log_error.is_none()
        {
            log_error = Some(e);
        }
    };
    let result = search(
        initial,
        cfg,
        &mut log::AsLogged(eval),
        resume,
        &mut on_round,
    )?;
    match log_error {
        Some(e) => Err(e),
        None => Ok(result),
    }
}

/// The settings a round log must match to be resumed.
fn settings(args: &LearnArgs, fit: &FitConfig, search: &SearchConfig) -> String {
    // Logs from before load rules read back with the same settings when no rule is set; the
    // rule keeps its spelling here (not `LoadRule`'s `Display`) so existing logs still resume.
    let rule = fit.load_rule.map_or(String::new(), |r| {
        format!(" load_rule busy {}", r.prefill_busy_threshold)
    });
    format!(
        "split {} k {} method {} features {:?} slo {}ms/{}ms reward {}{rule} workload {} arrivals {} target {:?} {} | scan {} epsilon {} decay {} max_rounds {} patience {} seed {}",
        fit.split,
        fit.k,
        fit.method.as_str(),
        fit.features,
        fit.slo.ttft_ms,
        fit.slo.tpot_ms,
        fit.reward.as_str(),
        fit.workload,
        args.arrivals,
        args.target,
        match args.target {
            Target::Sim => format!("profile {} blocks {}", args.sim_profile, args.total_blocks),
            Target::Live => format!("period {}", args.period_requests),
        },
        search.scan,
        search.epsilon,
        search.epsilon_decay,
        search.max_rounds,
        search.patience,
        search.seed
    )
}

/// The first replay, whose features the table is fitted to.
async fn gather(measure: &mut Measure) -> Result<Vec<RequestOutcome>, LearnCmdError> {
    match measure {
        Measure::Sim(target) => {
            Ok(target.run(Policy::Threshold(ThresholdConfig::default()), None)?)
        }
        Measure::Live(target) => {
            eprintln!(
                "gathering features: one period of {} requests under the router's current decisions",
                target.period_requests
            );
            let outcomes = target.period().await?;
            let ok = outcomes.iter().filter(|o| o.ok).count();
            if ok == 0 {
                return Err(LearnCmdError::Live(
                    "no request of the gathering period completed".into(),
                ));
            }
            Ok(outcomes)
        }
    }
}

/// One line per round.
fn describe(r: &Round) -> String {
    let phase = match &r.phase {
        Phase::Scan { cluster, bit } => {
            format!(
                "scan c{cluster}={}",
                if *bit == 1 { "remote" } else { "local" }
            )
        }
        Phase::Refine => "refine".to_owned(),
    };
    let rewards: Vec<String> = r
        .per_cluster_reward
        .iter()
        .map(|x| x.map_or("-".into(), |v| format!("{v:.2}")))
        .collect();
    format!(
        "round {:>3} {:<18} bits {} attainment {:.4} (P90 TTFT {:.0} ms, TPOT {:.1} ms) best {:.4}{} rewards [{}]",
        r.round,
        phase,
        r.bits.iter().map(|b| b.to_string()).collect::<String>(),
        r.attainment,
        r.p90_ttft_ms,
        r.p90_tpot_ms,
        r.best_attainment,
        if r.improved { " *" } else { "" },
        rewards.join(" ")
    )
}

/// Writes the learned table where asked.
async fn keep(
    args: &LearnArgs,
    table: &RoutingTable,
    out: &mut impl Write,
) -> Result<(), LearnCmdError> {
    let json = format!("{}\n", table.to_json_pretty());
    if let Some(path) = &args.out {
        std::fs::write(path, &json).map_err(|source| LearnCmdError::Io {
            path: path.clone(),
            source,
        })?;
        eprintln!("wrote {}", path.display());
    }
    if args.activate {
        let resp = crate::client::admin(&args.router_admin)
            .await?
            .put_table(v1::PutTableRequest {
                split: table.split.to_string(),
                version: String::new(),
                json: json.clone(),
                activate: true,
            })
            .await
            .map_err(|s| CtlError::rpc("PutTable", s))?
            .into_inner();
        eprintln!("stored and activated {}/{}", resp.split, resp.version);
    }
    if args.out.is_none() && !args.activate {
        out.write_all(json.as_bytes())
            .map_err(|e| LearnCmdError::Router(CtlError::Output(e)))?;
    }
    Ok(())
}

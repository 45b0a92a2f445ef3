//! The body of a worker binary's `main`, shared by both workers: parse the flags, fix the
//! compute threads while the process is still single-threaded, start the runtime, run, and turn
//! the outcome into an exit status (64 for bad configuration, EX_USAGE).

use std::future::Future;
use std::process::ExitCode;

use clap::Parser;

use crate::{CommonArgs, configure_compute_threads, error_chain};

/// A worker binary's configuration: its own flags around the common ones.
pub trait WorkerConfig: Parser {
    /// The flags every worker takes.
    fn common(&self) -> &CommonArgs;
}

/// An error that knows the process exit status it stands for.
pub trait ExitStatus: std::error::Error {
    /// 64 for bad configuration, else 1.
    fn exit_code(&self) -> u8;
}

/// Runs a worker binary: `name` prefixes messages printed before logging starts.
pub fn worker_main<C, E, Fut>(name: &str, run: impl FnOnce(C) -> Fut) -> ExitCode
where
    C: WorkerConfig,
    E: ExitStatus,
    Fut: Future<Output = Result<(), E>>,
{
    let cfg = match C::try_parse() {
        Ok(cfg) => cfg,
        Err(err) => {
            // --help and --version are not errors; a bad flag exits 64 (EX_USAGE).
            let code = if err.use_stderr() { 64 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    // Before any other thread exists: candle's thread count is set through the environment.
    if let Err(err) = configure_compute_threads(&cfg.common().engine) {
        eprintln!("{name}: {err}");
        return ExitCode::from(64);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // 0 is refused by `CommonArgs::validate`, first thing in `run`; tokio would panic on it.
    if let Some(n) = cfg.common().runtime_threads.filter(|&n| n > 0) {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("{name}: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // Inside the runtime: the OTLP exporter's channel lives on it.
    let traces = {
        let _rt = runtime.enter();
        dolphin_cluster::init_tracing(cfg.common().log_json, name)
    };
    let code = runtime.block_on(async move {
        match run(cfg).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!(error = %error_chain(&err), "{name} failed");
                ExitCode::from(err.exit_code())
            }
        }
    });
    // The last spans leave while the runtime still runs the exporter's channel.
    {
        let _rt = runtime.enter();
        drop(traces);
    }
    code
}

//! `dolphinctl`: parse the command line, run the command on a current-thread runtime (children
//! are spawned from the main thread, which their parent-death signal follows), map errors to exit
//! codes: 64 for bad usage or configuration, 1 for failures.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use dolphinctl::cli::{Cli, Command, WorkersArgs};
use dolphinctl::learn::LearnCmdError;
use dolphinctl::profile::ProfileError;
use dolphinctl::replay::ReplayError;
use dolphinctl::{CtlError, classifier, learn, replay, request, tables, up, workers};

// The simulator behind `learn` and `replay --target sim` allocates a small vector per cache
// event; mimalloc makes those cheaper than glibc's malloc (as `sim_speed` measures with it).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(64)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_tracing();
    dolphinctl::client::init_keys(cli.api_key.as_deref(), cli.admin_key.as_deref());
    if let Err(err) = dolphinctl::client::init_tls(&cli.tls) {
        eprintln!("dolphinctl: {err}");
        return ExitCode::from(64);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("dolphinctl: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { code, error }) => {
            eprintln!("dolphinctl: error: {}", render(&error));
            ExitCode::from(code)
        }
    }
}

/// An error and its causes, `: `-separated, each cause said once: transport errors repeat
/// their source's message in their own ("Connection refused: Connection refused").
fn render(error: &anyhow::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if !said.last().is_some_and(|last| last.ends_with(&message)) {
            said.push(message);
        }
    }
    said.join(": ")
}

/// A command's error with the exit code it maps to.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl From<CtlError> for Failure {
    fn from(err: CtlError) -> Self {
        let code = match err {
            CtlError::BinaryMissing { .. }
            | CtlError::ModelMissing { .. }
            | CtlError::InvalidUrl { .. }
            | CtlError::Tls(_) => 64,
            _ => 1,
        };
        Failure {
            code,
            error: err.into(),
        }
    }
}

impl From<LearnCmdError> for Failure {
    fn from(err: LearnCmdError) -> Self {
        Failure {
            code: err.exit_code(),
            error: err.into(),
        }
    }
}

impl From<ReplayError> for Failure {
    fn from(err: ReplayError) -> Self {
        Failure {
            code: err.exit_code(),
            error: err.into(),
        }
    }
}

impl From<ProfileError> for Failure {
    fn from(err: ProfileError) -> Self {
        Failure {
            code: err.exit_code(),
            error: err.into(),
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let mut stdout = std::io::stdout();
    match cli.command {
        Command::Up(args) => Ok(up::up(*args).await?),
        Command::Workers(args) => Ok(list_workers(&args).await?),
        Command::Drain(args) => Ok(dolphinctl::drain::drain(&args).await?),
        Command::Request(args) => {
            let outcome = request::run(&args, &mut stdout).await?;
            writeln!(stdout).map_err(CtlError::Output)?;
            for line in request::logprob_lines(&outcome) {
                eprintln!("{line}");
            }
            eprintln!("{}", request::describe(&outcome));
            Ok(())
        }
        Command::Tables(args) => Ok(tables::run(args, &mut stdout).await?),
        Command::Classifier(args) => Ok(classifier::run(args, &mut stdout).await?),
        Command::Replay(args) => Ok(replay::run(&args, &mut stdout).await?),
        Command::Learn(args) => Ok(learn::run(&args, &mut stdout).await?),
        Command::Profile(args) => Ok(dolphinctl::profile::run(args, &mut stdout).await?),
        Command::Handoff(args) => Ok(dolphinctl::handoff::run(args, &mut stdout).await?),
    }
}

async fn list_workers(args: &WorkersArgs) -> Result<(), CtlError> {
    let rows = workers::list_workers(&args.router_admin).await?;
    let text = if args.json {
        let mut s = serde_json::to_string_pretty(&rows).unwrap_or_default();
        s.push('\n');
        s
    } else {
        workers::render_table(&rows)
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(CtlError::Output)
}

/// Logs to stderr; RUST_LOG overrides the default (warnings only: the CLI's output is its own).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_that_repeats_the_one_before_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = anyhow::Error::new(io)
            .context("transport error: refused")
            .context("cannot connect");
        assert_eq!(render(&error), "cannot connect: transport error: refused");
        let error = anyhow::anyhow!("inner").context("outer");
        assert_eq!(render(&error), "outer: inner");
    }
}

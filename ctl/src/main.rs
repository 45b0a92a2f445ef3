//! `dolphinctl`: parse the command line, run the command on a current-thread runtime (children
//! are spawned from the main thread, which their parent-death signal follows), map errors to exit
//! codes: 64 for bad usage or configuration, 1 for failures.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use dolphinctl::cli::{Cli, Command};
use dolphinctl::{CtlError, classifier, request, tables, up, workers};

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
        Err(err) => {
            let code = match err {
                CtlError::BinaryMissing { .. }
                | CtlError::ModelMissing { .. }
                | CtlError::InvalidUrl { .. } => 64,
                _ => 1,
            };
            eprintln!("dolphinctl: error: {:#}", anyhow::Error::from(err));
            ExitCode::from(code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), CtlError> {
    match cli.command {
        Command::Up(args) => up::up(*args).await,
        Command::Workers(args) => {
            let rows = workers::list_workers(&args.router_grpc).await?;
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
        Command::Request(args) => {
            let mut stdout = std::io::stdout();
            let outcome = request::run(&args, &mut stdout).await?;
            writeln!(stdout).map_err(CtlError::Output)?;
            eprintln!("{}", request::describe(&outcome));
            Ok(())
        }
        Command::Tables(args) => tables::run(args, &mut std::io::stdout()).await,
        Command::Classifier(args) => classifier::run(args, &mut std::io::stdout()).await,
    }
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

//! `dolphin-decode-worker`: see the crate docs of `dolphin_decode_worker`.

use std::process::ExitCode;

use clap::Parser;
use dolphin_decode_worker::{DecodeConfig, run};
use dolphin_worker_common::{configure_compute_threads, error_chain};

fn main() -> ExitCode {
    let cfg = match DecodeConfig::try_parse() {
        Ok(cfg) => cfg,
        Err(err) => {
            // --help and --version are not errors; a bad flag exits 64 (EX_USAGE).
            let code = if err.use_stderr() { 64 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    // Before any other thread exists: candle's thread count is set through the environment.
    if let Err(err) = configure_compute_threads(&cfg.common.engine) {
        eprintln!("dolphin-decode-worker: {err}");
        return ExitCode::from(64);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("dolphin-decode-worker: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    dolphin_cluster::init_tracing(cfg.common.log_json);
    runtime.block_on(async move {
        match run(cfg).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!(error = %error_chain(&err), "decode worker failed");
                ExitCode::from(err.exit_code())
            }
        }
    })
}

//! `dolphin-prefill-worker`: see the crate docs of `dolphin_prefill_worker`.

use std::process::ExitCode;

use clap::Parser;
use dolphin_prefill_worker::{PrefillConfig, run};
use dolphin_worker_common::error_chain;

#[tokio::main]
async fn main() -> ExitCode {
    let cfg = match PrefillConfig::try_parse() {
        Ok(cfg) => cfg,
        Err(err) => {
            // --help and --version are not errors; a bad flag exits 64 (EX_USAGE).
            let code = if err.use_stderr() { 64 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    dolphin_cluster::init_tracing(cfg.common.log_json);
    match run(cfg).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %error_chain(&err), "prefill worker failed");
            ExitCode::from(err.exit_code())
        }
    }
}

//! `dolphin-prefill-worker`: see the crate docs of `dolphin_prefill_worker`.

use std::process::ExitCode;

fn main() -> ExitCode {
    dolphin_worker_common::worker_main("dolphin-prefill-worker", dolphin_prefill_worker::run)
}

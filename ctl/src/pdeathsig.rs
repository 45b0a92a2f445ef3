//! Making children die with dolphinctl, without `unsafe`.
//!
//! The kernel's `PR_SET_PDEATHSIG` has to be set in the child between `fork` and `exec`, which
//! from Rust means `CommandExt::pre_exec`, an `unsafe` function (the workspace denies
//! `unsafe_code`). util-linux's `setpriv --pdeathsig KILL -- PROGRAM ARGS` does exactly that step
//! and then execs the program under the same pid, so when `setpriv` is installed dolphinctl
//! wraps every child in it.
//!
//! Limits: the signal fires when the *thread* that spawned the child exits, so children must be
//! spawned from a thread that lives as long as the supervisor (dolphinctl runs a current-thread
//! runtime, so that is the main thread); and without `setpriv` a `kill -9` of dolphinctl leaves
//! its children running (each in its own process group: `kill -- -PID` stops one).

use std::path::PathBuf;
use std::sync::OnceLock;

/// Path of a `setpriv` that supports `--pdeathsig`, looked up once per process.
pub fn setpriv_path() -> Option<&'static PathBuf> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV.get_or_init(find_setpriv).as_ref()
}

fn find_setpriv() -> Option<PathBuf> {
    let dirs = std::env::var_os("PATH")?;
    let path = std::env::split_paths(&dirs)
        .map(|dir| dir.join("setpriv"))
        .find(|p| p.is_file())?;
    // Old util-linux versions lack --pdeathsig; ask the binary rather than guess from a version.
    let help = std::process::Command::new(&path)
        .arg("--help")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&help.stdout)
        .contains("--pdeathsig")
        .then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_is_stable() {
        // Whether setpriv exists depends on the machine; asking twice must agree.
        assert_eq!(setpriv_path(), setpriv_path());
        if let Some(p) = setpriv_path() {
            assert!(p.ends_with("setpriv"));
        }
    }
}

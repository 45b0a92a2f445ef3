//! API keys: the public APIs' (HTTP `Authorization: Bearer KEY`, gRPC metadata
//! `authorization: Bearer KEY`) and the admin listener's, each from a file of keys that is read
//! again when it changes (a mounted Kubernetes secret is replaced atomically).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often key files are checked for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// It cannot be read.
    #[error("cannot read key file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It holds no key.
    #[error("key file {} holds no key (one per line; # starts a comment)", .0.display())]
    Empty(PathBuf),
}

/// The keys of one file, shared by every request that checks them (cheap to clone).
#[derive(Clone, Debug)]
pub struct KeySet {
    path: PathBuf,
    keys: Arc<RwLock<Arc<Vec<Vec<u8>>>>>,
}

impl KeySet {
    /// Reads `path`: one key per line, blank lines and `#` comments skipped, whitespace trimmed.
    pub fn load(path: &Path) -> Result<KeySet, KeyFileError> {
        Ok(KeySet {
            path: path.to_path_buf(),
            keys: Arc::new(RwLock::new(Arc::new(read_keys(path)?))),
        })
    }

    /// Whether `presented` is one of the keys. Compares in time independent of where a key
    /// differs, so response times say nothing about a key's prefix.
    pub fn admits(&self, presented: &[u8]) -> bool {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner()).clone();
        keys.iter()
            .fold(false, |found, key| found | constant_time_eq(key, presented))
    }

    /// Reads the file every `every` and swaps in its keys when they changed (a secret mount
    /// swaps a symlink, so contents decide, not times); a file that cannot be read or holds no
    /// key keeps the previous keys (logged). Stops at `shutdown`.
    pub fn watch(&self, every: Duration, shutdown: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                match read_keys(&this.path) {
                    Ok(keys) => {
                        let mut current = this.keys.write().unwrap_or_else(|e| e.into_inner());
                        if **current != keys {
                            tracing::info!(file = %this.path.display(), keys = keys.len(), "key file changed; reloaded");
                            *current = Arc::new(keys);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "key file unusable; keeping the previous keys");
                    }
                }
            }
        });
    }
}

fn read_keys(path: &Path) -> Result<Vec<Vec<u8>>, KeyFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let keys: Vec<Vec<u8>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.as_bytes().to_vec())
        .collect();
    if keys.is_empty() {
        return Err(KeyFileError::Empty(path.to_path_buf()));
    }
    Ok(keys)
}

/// Equality whose time depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key in an `Authorization` value: `Bearer KEY` (the scheme case-insensitive).
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let key = rest.trim_ascii();
    (!key.is_empty()).then_some(key)
}

/// What a request's credentials amount to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No key needed, or a valid one given.
    Admitted,
    /// No `Authorization: Bearer` header.
    Missing,
    /// A key that is not one of the file's.
    Wrong,
}

impl Verdict {
    /// Checks an `Authorization` value (`None`: no header) against `keys` (`None`: open).
    pub fn of(keys: Option<&KeySet>, authorization: Option<&[u8]>) -> Verdict {
        let Some(keys) = keys else {
            return Verdict::Admitted;
        };
        match authorization.and_then(bearer) {
            None => Verdict::Missing,
            Some(key) if keys.admits(key) => Verdict::Admitted,
            Some(_) => Verdict::Wrong,
        }
    }

    /// The gRPC status of a refusal (`None` when admitted).
    pub fn status(self, what: &str) -> Option<tonic::Status> {
        match self {
            Verdict::Admitted => None,
            Verdict::Missing => Some(tonic::Status::unauthenticated(format!(
                "missing {what} key: send metadata `authorization: Bearer KEY`"
            ))),
            Verdict::Wrong => Some(tonic::Status::unauthenticated(format!(
                "invalid {what} key"
            ))),
        }
    }
}

/// A tonic interceptor that admits requests carrying one of `keys` (all when `None`).
pub fn interceptor(
    keys: Option<KeySet>,
    what: &'static str,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req: tonic::Request<()>| {
        let value = req.metadata().get("authorization").map(|v| v.as_bytes());
        match Verdict::of(keys.as_ref(), value).status(what) {
            None => Ok(req),
            Some(status) => Err(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(text: &str) -> (tempfile::TempDir, KeySet) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keys");
        std::fs::write(&path, text).expect("write");
        let set = KeySet::load(&path).expect("load");
        (dir, set)
    }

    #[test]
    fn keys_come_one_per_line_without_comments() {
        let (_dir, set) = keys("# operators\n  sk-one  \n\nsk-two\n");
        assert!(set.admits(b"sk-one") && set.admits(b"sk-two"));
        assert!(!set.admits(b"sk-on") && !set.admits(b"# operators") && !set.admits(b""));
    }

    #[test]
    fn a_file_without_keys_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keys");
        std::fs::write(&path, "# nothing\n\n").expect("write");
        assert!(matches!(KeySet::load(&path), Err(KeyFileError::Empty(_))));
        assert!(matches!(
            KeySet::load(&dir.path().join("missing")),
            Err(KeyFileError::Read { .. })
        ));
    }

    #[test]
    fn bearer_values() {
        assert_eq!(bearer(b"Bearer sk-1"), Some(&b"sk-1"[..]));
        assert_eq!(bearer(b"bearer  sk-1 "), Some(&b"sk-1"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"sk-1"), None);
    }

    #[test]
    fn verdicts() {
        let (_dir, set) = keys("sk-1\n");
        assert_eq!(Verdict::of(None, None), Verdict::Admitted);
        assert_eq!(Verdict::of(Some(&set), None), Verdict::Missing);
        assert_eq!(Verdict::of(Some(&set), Some(b"Basic x")), Verdict::Missing);
        assert_eq!(
            Verdict::of(Some(&set), Some(b"Bearer sk-2")),
            Verdict::Wrong
        );
        assert_eq!(
            Verdict::of(Some(&set), Some(b"Bearer sk-1")),
            Verdict::Admitted
        );
        let status = Verdict::Wrong.status("API").expect("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
    }

    #[tokio::test]
    async fn a_changed_file_is_reloaded() {
        let (dir, set) = keys("old\n");
        set.watch(Duration::from_millis(20), CancellationToken::new());
        std::fs::write(dir.path().join("keys"), "new\n").expect("write");
        for _ in 0..200 {
            if set.admits(b"new") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(set.admits(b"new") && !set.admits(b"old"));
    }
}

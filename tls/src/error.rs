//! Why TLS could not be set up.

use std::path::PathBuf;

/// A certificate, key or CA file that cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}")]
    Read {
        /// Which file ("certificate", "key", "CA bundle").
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM object of the kind expected.
    #[error("{path} holds no {what} in PEM form")]
    Empty {
        /// What was looked for.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the material (a key that does not match, an unsupported algorithm).
    #[error("{what} in {path} is not usable")]
    Rustls {
        /// What was being built.
        what: &'static str,
        /// The file it came from.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
    /// A flag combination that cannot work.
    #[error("{0}")]
    Config(String),
}

//! Why learning failed.

use std::path::PathBuf;

/// Errors of the learning crate.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    /// The log could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Too little usable data.
    #[error("not enough data: {0}")]
    NotEnoughData(String),
    /// Bad parameters.
    #[error("invalid parameters: {0}")]
    Invalid(String),
    /// A length that must equal the number of clusters K does not (initial bits, the search
    /// configuration, an evaluator's period).
    #[error("{what} has {found} clusters, expected K = {expected}")]
    KMismatch {
        /// What had the wrong length.
        what: String,
        /// K.
        expected: usize,
        /// Its length.
        found: usize,
    },
    /// Logged rounds that do not continue the search being resumed (another configuration,
    /// other initial bits, or a damaged log).
    #[error("cannot resume from the logged rounds: {0}")]
    Resume(String),
    /// The target (the simulator or the live cluster) could not measure a period.
    #[error("measuring on the target failed: {0}")]
    Target(String),
    /// The learned table did not validate (a bug, or degenerate data).
    #[error("the learned table is invalid")]
    Table(#[from] dolphin_router::dolphin::TableError),
    /// The learned classifier did not validate.
    #[error("the learned classifier is invalid")]
    Classifier(#[from] dolphin_router::dolphin::classifier::ClassifierError),
}

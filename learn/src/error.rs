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
    /// The learned table did not validate (a bug, or degenerate data).
    #[error("the learned table is invalid")]
    Table(#[from] dolphin_router::dolphin::TableError),
    /// The learned classifier did not validate.
    #[error("the learned classifier is invalid")]
    Classifier(#[from] dolphin_router::dolphin::classifier::ClassifierError),
}

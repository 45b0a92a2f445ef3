//! Why a model could not be loaded.

use std::path::PathBuf;

/// A model file that cannot be served, or a configuration that does not fit it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or read.
    #[error("cannot read model file {path}")]
    Io {
        /// The model file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a readable GGUF file.
    #[error("cannot parse GGUF file {path}")]
    Gguf {
        /// The model file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: candle_core::Error,
    },
    /// A hyperparameter is missing or out of range.
    #[error("model metadata: {0}")]
    Metadata(String),
    /// The model uses something this engine does not implement.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// A weight the architecture needs is absent.
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    /// A weight has the wrong shape.
    #[error("tensor {name}: {detail}")]
    BadTensor {
        /// Tensor name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The configuration does not fit the model or the machine.
    #[error("{0}")]
    Config(String),
    /// A tensor operation failed while preparing the weights or the KV memory.
    #[error("preparing the model failed")]
    Candle(#[from] candle_core::Error),
}

//! Why a format cannot be served.

/// A format that does not compile, or a token the format does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The format is malformed (not JSON, a bad regular expression, a grammar that does not
    /// parse, a schema feature llguidance does not support): the client's error.
    #[error("{field}: {message}")]
    Invalid {
        /// The format's kind as the wire names it (`json_schema`, `regex`, ...).
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The model's vocabulary could not be read into a token space.
    #[error("structured output is not available for this model: {0}")]
    Unavailable(String),
    /// A token the model was fed breaks the format (it was drawn without the mask).
    #[error("token {token} does not continue the requested format: {message}")]
    Rejected {
        /// The token.
        token: u32,
        /// llguidance's reason.
        message: String,
    },
    /// Computing the next mask failed (a grammar too costly to follow, for instance).
    #[error("the requested format cannot be followed further: {0}")]
    Stuck(String),
}

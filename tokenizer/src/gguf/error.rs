//! Errors of the GGUF reader.

use std::path::PathBuf;

use super::value::ValueType;

/// Why a GGUF file could not be read, or a metadata value not used as asked.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or read.
    #[error("reading {path}")]
    Io {
        /// The file (empty when reading from a stream).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file ended in the middle of `what`.
    #[error("file truncated while reading {what}")]
    Truncated {
        /// The item being read.
        what: &'static str,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// Only versions 2 and 3 (little-endian) are read.
    #[error("unsupported GGUF version {0} (2 and 3 are supported; big-endian files are not)")]
    UnsupportedVersion(u32),
    /// A count or length is over a configured limit or larger than the rest of the file.
    #[error("{what} of {value} exceeds the limit of {limit}")]
    LimitExceeded {
        /// The quantity that is too large.
        what: &'static str,
        /// Its value in the file.
        value: u64,
        /// The most allowed here.
        limit: u64,
    },
    /// A value type id outside the GGUF specification.
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    /// A bool stored as something other than 0 or 1.
    #[error("invalid bool byte {0}")]
    InvalidBool(u8),
    /// A string that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string (a key name, or a description).
        what: String,
    },
    /// The same key appears twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// `general.alignment` is zero, not a power of two, or not an integer.
    #[error("invalid alignment {0}")]
    InvalidAlignment(u64),
    /// A tensor's description is inconsistent.
    #[error("tensor {name:?}: {detail}")]
    InvalidTensor {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// A required key is absent.
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    /// A key holds a value of another type than asked for.
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller asked for.
        expected: &'static str,
        /// What the file holds.
        found: ValueType,
    },
    /// A numeric value does not fit the type asked for.
    #[error("metadata key {key:?}: value {value} is out of range for {expected}")]
    OutOfRange {
        /// The key.
        key: String,
        /// The value (as text).
        value: String,
        /// The requested type.
        expected: &'static str,
    },
}

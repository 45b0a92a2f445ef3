//! The tokenizer metadata of a GGUF file, read by candle's GGUF reader
//! (`candle_core::quantized::gguf_file`, the one reader in the workspace: the engine loads its
//! weights with it). Only the header is read, never the tensor data.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

pub use candle_core::quantized::gguf_file::{self, Content, Value};

/// Why the metadata could not be read, or a value not used as asked.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened, or candle's reader refused it (not GGUF, truncated,
    /// lengths past the file's end or its limits).
    #[error("reading {path}: {message}")]
    Read {
        /// The file (empty when reading from a stream).
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A required key is absent.
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    /// A key holds a value of another type than asked for, or one out of range.
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller asked for.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
}

/// A GGUF file's metadata.
#[derive(Debug)]
pub struct GgufMetadata {
    content: Content,
}

impl GgufMetadata {
    /// Reads the header of the GGUF file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufMetadata, GgufError> {
        let path = path.as_ref();
        let failed = |message: String| GgufError::Read {
            path: path.to_path_buf(),
            message,
        };
        let file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
        Content::read(&mut std::io::BufReader::new(file))
            .map(|content| GgufMetadata { content })
            .map_err(|e| failed(e.to_string()))
    }

    /// Reads a header from a stream.
    pub fn read<R: Read + Seek>(reader: &mut R) -> Result<GgufMetadata, GgufError> {
        Content::read(reader)
            .map(|content| GgufMetadata { content })
            .map_err(|e| GgufError::Read {
                path: PathBuf::new(),
                message: e.to_string(),
            })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// The string value of `key`.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(wrong_type(key, "a string", v)),
        }
    }

    /// The value of `key`, stored as any integer type, as u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key)?;
        integer(v)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| wrong_type(key, "an integer that fits u32", v))
    }

    /// The bool value of `key`.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(wrong_type(key, "a bool", v)),
        }
    }

    /// The string-array value of `key`.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<String>, GgufError> {
        self.array(key, "a string array", |i| match i {
            Value::String(s) => Some(s.clone()),
            _ => None,
        })
    }

    /// The integer-array value of `key` (elements of any integer type).
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        self.array(key, "an integer array", |i| {
            integer(i).and_then(|x| i64::try_from(x).ok())
        })
    }

    /// The array value of `key`, each element converted by `element` (`None`: wrong type).
    fn array<T>(
        &self,
        key: &str,
        expected: &'static str,
        element: impl Fn(&Value) -> Option<T>,
    ) -> Result<Vec<T>, GgufError> {
        let v = self.require(key)?;
        let Value::Array(items) = v else {
            return Err(wrong_type(key, expected, v));
        };
        items
            .iter()
            .map(|i| element(i).ok_or_else(|| wrong_type(key, expected, i)))
            .collect()
    }
}

/// An integer value of any width.
fn integer(v: &Value) -> Option<i128> {
    Some(match *v {
        Value::U8(x) => x.into(),
        Value::I8(x) => x.into(),
        Value::U16(x) => x.into(),
        Value::I16(x) => x.into(),
        Value::U32(x) => x.into(),
        Value::I32(x) => x.into(),
        Value::U64(x) => x.into(),
        Value::I64(x) => x.into(),
        _ => return None,
    })
}

fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: format!("{:?}", v.value_type()),
    }
}

/// Maps a missing key to `None`, keeping other errors.
pub fn optional<T>(r: Result<T, GgufError>) -> Result<Option<T>, GgufError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(GgufError::MissingKey(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A GGUF file of `metadata` and no tensors, in memory (tests build tokenizers with it).
pub fn write_metadata(metadata: &[(&str, Value)]) -> Result<Vec<u8>, GgufError> {
    let refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let mut out = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut out, &refs, &[]).map_err(|e| GgufError::Read {
        path: PathBuf::new(),
        message: e.to_string(),
    })?;
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_getters_over_candles_reader() {
        let bytes = write_metadata(&[
            ("s", Value::String("smollm".into())),
            ("u", Value::U32(7)),
            ("i", Value::I32(9)),
            ("neg", Value::I32(-1)),
            ("b", Value::Bool(true)),
            (
                "strs",
                Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
            ),
            ("ints", Value::Array(vec![Value::I32(1), Value::I32(3)])),
        ])
        .expect("write");
        let g = GgufMetadata::read(&mut std::io::Cursor::new(bytes)).expect("read");
        assert_eq!(g.get_str("s").unwrap(), "smollm");
        assert_eq!((g.get_u32("u").unwrap(), g.get_u32("i").unwrap()), (7, 9));
        assert!(g.get_bool("b").unwrap());
        assert_eq!(g.get_str_array("strs").unwrap(), ["a", "b"]);
        assert_eq!(g.get_int_array("ints").unwrap(), [1, 3]);
        assert!(matches!(g.get_u32("neg"), Err(GgufError::WrongType { .. })));
        assert!(matches!(g.get_str("u"), Err(GgufError::WrongType { .. })));
        assert!(matches!(g.get_str("nope"), Err(GgufError::MissingKey(_))));
        assert_eq!(optional(g.get_str("nope")).unwrap(), None);
        assert!(g.get_int_array("strs").is_err());
    }

    #[test]
    fn files_that_are_not_gguf_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("x.gguf");
        std::fs::write(&path, b"not a gguf file at all").expect("write");
        let e = GgufMetadata::open(&path).unwrap_err();
        assert!(e.to_string().contains("x.gguf"), "{e}");
        let e = GgufMetadata::open(dir.path().join("missing.gguf")).unwrap_err();
        assert!(e.to_string().contains("missing.gguf"), "{e}");
        // Truncated anywhere: an error, not a panic.
        let bytes = write_metadata(&[("k", Value::String("value".into()))]).expect("write");
        for cut in 0..bytes.len() {
            let _ = GgufMetadata::read(&mut std::io::Cursor::new(&bytes[..cut]));
        }
    }
}

//! A minimal, safe GGUF reader: header, metadata key/values (all value types, nested arrays) and
//! tensor descriptions of versions 2 and 3. Tensor data is not read: a loader maps or reads it at
//! [`GgufFile::data_offset`] + [`TensorInfo::offset`].
//!
//! Layout (little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 key/value count, the
//! key/values (string key, u32 type, value), the tensor infos (string name, u32 dims, u64 per dim,
//! u32 type, u64 offset), padding to `general.alignment` (default 32), then the data section.

mod error;
mod reader;
mod tensor;
mod value;
mod writer;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

pub use error::GgufError;
use reader::BoundedReader;
pub use reader::Limits;
pub use tensor::{GgmlType, MAX_DIMS, TensorInfo};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The header of a GGUF file: metadata and tensor descriptions.
#[derive(Clone, Debug)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    /// Tensor descriptions, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of tensor data (a power of two).
    pub alignment: u64,
    /// Absolute file offset where the data section starts.
    pub data_offset: u64,
}

impl GgufFile {
    /// Reads the header of the file at `path` with default [`Limits`].
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_with_limits(path, Limits::default())
    }

    /// Reads the header of the file at `path`; checks that every tensor of a known type lies
    /// inside the file.
    pub fn open_with_limits(path: impl AsRef<Path>, limits: Limits) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let mut reader = BoundedReader::new(BufReader::new(file), path, Some(len), limits);
        let gguf = Self::read_header(&mut reader)?;
        gguf.check_tensor_bounds(len)?;
        Ok(gguf)
    }

    /// Reads a header from `reader` positioned at the start of a file of `len` bytes (`None`
    /// when unknown: the limits alone bound allocation then).
    pub fn read<R: Read>(
        reader: R,
        len: Option<u64>,
        limits: Limits,
    ) -> Result<GgufFile, GgufError> {
        let mut reader = BoundedReader::new(reader, Path::new(""), len, limits);
        let gguf = Self::read_header(&mut reader)?;
        if let Some(len) = len {
            gguf.check_tensor_bounds(len)?;
        }
        Ok(gguf)
    }

    fn read_header<R: Read>(r: &mut BoundedReader<'_, R>) -> Result<GgufFile, GgufError> {
        let mut magic = [0u8; 4];
        r.read_bytes(&mut magic, "magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = r.u32("version")?;
        // Version 1 used 32-bit counts; a big-endian file reads as a huge version here.
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let limits = *r.limits();
        // A tensor info takes at least 8 (name len) + 4 + 8 + 4 + 8 bytes; a key/value 8 + 4 + 1.
        let n_tensors = r.count("tensor count", limits.max_tensors, 32)?;
        let n_kv = r.count("metadata count", limits.max_kv, 13)?;

        let mut metadata = Vec::with_capacity(n_kv.min(1 << 12) as usize);
        let mut index = HashMap::with_capacity(n_kv.min(1 << 12) as usize);
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.value_type()?;
            let value = r.value(ty)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_integer() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() && a <= 1 << 30 => a as u64,
                Some(a) => return Err(GgufError::InvalidAlignment(a.max(0) as u64)),
                None => return Err(GgufError::InvalidAlignment(0)),
            },
        };

        r.charge(n_tensors.saturating_mul(std::mem::size_of::<TensorInfo>() as u64))?;
        // Preallocate little: the counts are only plausible, not yet proven by the bytes.
        let prealloc = n_tensors.min(1 << 12) as usize;
        let mut tensors = Vec::with_capacity(prealloc);
        let mut names = HashSet::with_capacity(prealloc);
        for _ in 0..n_tensors {
            let info = Self::read_tensor_info(r, alignment)?;
            if !names.insert(info.name.clone()) {
                return Err(GgufError::InvalidTensor {
                    name: info.name,
                    detail: "duplicate tensor name".into(),
                });
            }
            tensors.push(info);
        }
        let data_offset = r.position().next_multiple_of(alignment);
        Ok(GgufFile {
            version,
            metadata,
            index,
            tensors,
            alignment,
            data_offset,
        })
    }

    fn read_tensor_info<R: Read>(
        r: &mut BoundedReader<'_, R>,
        alignment: u64,
    ) -> Result<TensorInfo, GgufError> {
        let name = r.string("tensor name")?;
        let invalid = |name: &str, detail: String| GgufError::InvalidTensor {
            name: name.to_string(),
            detail,
        };
        let n_dims = r.u32("tensor dimension count")?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(invalid(
                &name,
                format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
            ));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        let mut elements: u64 = 1;
        for _ in 0..n_dims {
            let d = r.u64("tensor dimension")?;
            elements = elements
                .checked_mul(d)
                .ok_or_else(|| invalid(&name, "element count overflows u64".into()))?;
            shape.push(d);
        }
        let ggml_type = GgmlType(r.u32("tensor type")?);
        let offset = r.u64("tensor offset")?;
        if offset % alignment != 0 {
            return Err(invalid(
                &name,
                format!("offset {offset} is not a multiple of {alignment}"),
            ));
        }
        Ok(TensorInfo {
            name,
            shape,
            ggml_type,
            offset,
        })
    }

    /// Fails when a tensor of known size would end past the end of a file of `file_len` bytes.
    fn check_tensor_bounds(&self, file_len: u64) -> Result<(), GgufError> {
        for t in &self.tensors {
            let Some(len) = t.byte_len() else { continue };
            let end = self
                .data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(len));
            if end.is_none_or(|end| end > file_len) {
                return Err(GgufError::InvalidTensor {
                    name: t.name.clone(),
                    detail: format!(
                        "{len} bytes at offset {} run past the end of the file",
                        t.offset
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every metadata key/value, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The description of tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.value_type(),
        }
    }

    /// The string value of `key`.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    /// The value of `key`, stored as any integer type, as u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key)?;
        let i = v
            .as_integer()
            .ok_or_else(|| Self::wrong_type(key, "integer", v))?;
        u32::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            expected: "u32",
        })
    }

    /// The value of `key`, stored as any integer type, as u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        let i = v
            .as_integer()
            .ok_or_else(|| Self::wrong_type(key, "integer", v))?;
        u64::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            expected: "u64",
        })
    }

    /// The value of `key`, stored as a float or integer type, as f64.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| Self::wrong_type(key, "number", v))
    }

    /// The bool value of `key`.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(Self::wrong_type(key, "bool", v)),
        }
    }

    /// The array value of `key`.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// The string-array value of `key`.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.get_array(key)? {
            Array::String(s) => Ok(s),
            _ => Err(GgufError::WrongType {
                key: key.to_string(),
                expected: "string array",
                found: ValueType::Array,
            }),
        }
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

#[cfg(test)]
mod tests;

//! Low-level reading of GGUF primitives with bounds: every count and length read from the file
//! is checked against [`Limits`] and against the bytes left in the file before anything is
//! allocated for it, so a corrupt or hostile header cannot make the reader allocate without bound.

use std::io::{ErrorKind, Read};
use std::path::Path;

use super::error::GgufError;
use super::value::{Array, Value, ValueType};

/// Bounds on what a GGUF header may declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most metadata key/value pairs.
    pub max_kv: u64,
    /// Most tensors.
    pub max_tensors: u64,
    /// Longest string (key, value or array element), in bytes.
    pub max_string_len: u64,
    /// Most elements in one array.
    pub max_array_len: u64,
    /// Deepest nesting of arrays in arrays.
    pub max_array_depth: u32,
    /// Most bytes of memory the whole header (metadata and tensor infos) may take.
    pub max_header_bytes: u64,
}

impl Default for Limits {
    /// Generous for real models (a 256k-token vocabulary, a 1M-tensor model), small enough that a
    /// corrupt header fails fast instead of exhausting memory.
    fn default() -> Self {
        Limits {
            max_kv: 1 << 16,
            max_tensors: 1 << 20,
            max_string_len: 16 << 20,
            max_array_len: 1 << 24,
            max_array_depth: 8,
            max_header_bytes: 1 << 30,
        }
    }
}

/// Rough in-memory cost of a String beyond its bytes.
const STRING_OVERHEAD: u64 = std::mem::size_of::<String>() as u64;
/// Elements reserved up front for an array; more grow as they are actually read.
const MAX_PREALLOC: u64 = 1 << 16;

/// A reader of GGUF primitives that knows how many bytes remain and how much memory it has spent.
pub(crate) struct BoundedReader<'p, R> {
    inner: R,
    path: &'p Path,
    pos: u64,
    /// Bytes left in the file, when its length is known.
    remaining: Option<u64>,
    limits: Limits,
    /// Memory charged so far against `limits.max_header_bytes`.
    spent: u64,
}

impl<'p, R: Read> BoundedReader<'p, R> {
    /// Reads from `inner`, positioned at byte 0 of a file of `len` bytes (if known).
    pub(crate) fn new(inner: R, path: &'p Path, len: Option<u64>, limits: Limits) -> Self {
        BoundedReader {
            inner,
            path,
            pos: 0,
            remaining: len,
            limits,
            spent: 0,
        }
    }

    /// Bytes read so far.
    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    /// The configured limits.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Charges `bytes` of memory against the header budget.
    pub(crate) fn charge(&mut self, bytes: u64) -> Result<(), GgufError> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > self.limits.max_header_bytes {
            return Err(GgufError::LimitExceeded {
                what: "header memory",
                value: self.spent,
                limit: self.limits.max_header_bytes,
            });
        }
        Ok(())
    }

    /// Fails unless `count` items of at least `min_bytes` each can still be in the file.
    fn check_fits(&self, what: &'static str, count: u64, min_bytes: u64) -> Result<(), GgufError> {
        if let Some(remaining) = self.remaining {
            let need = count.saturating_mul(min_bytes);
            if need > remaining {
                return Err(GgufError::LimitExceeded {
                    what,
                    value: count,
                    limit: remaining / min_bytes.max(1),
                });
            }
        }
        Ok(())
    }

    /// Fails when `value` is over `limit`.
    pub(crate) fn check_limit(what: &'static str, value: u64, limit: u64) -> Result<(), GgufError> {
        if value > limit {
            return Err(GgufError::LimitExceeded { what, value, limit });
        }
        Ok(())
    }

    /// Fills `buf` from the file.
    pub(crate) fn read_bytes(
        &mut self,
        buf: &mut [u8],
        what: &'static str,
    ) -> Result<(), GgufError> {
        match self.inner.read_exact(buf) {
            Ok(()) => {
                let n = buf.len() as u64;
                self.pos += n;
                self.remaining = self.remaining.map(|r| r.saturating_sub(n));
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(GgufError::Truncated { what }),
            Err(source) => Err(GgufError::Io {
                path: self.path.to_path_buf(),
                source,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.read_bytes(&mut b, what)?;
        Ok(b)
    }

    /// A little-endian u32.
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A little-endian u64.
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items each taking at least `min_bytes` in the file, checked against `limit`
    /// and against the bytes left.
    pub(crate) fn count(
        &mut self,
        what: &'static str,
        limit: u64,
        min_bytes: u64,
    ) -> Result<u64, GgufError> {
        let n = self.u64(what)?;
        Self::check_limit(what, n, limit)?;
        self.check_fits(what, n, min_bytes)?;
        Ok(n)
    }

    /// A GGUF string (u64 length, UTF-8 bytes); `what` names it in errors.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        Self::check_limit("string length", len, self.limits.max_string_len)?;
        self.check_fits("string length", len, 1)?;
        self.charge(len + STRING_OVERHEAD)?;
        // Bounded by max_string_len and by the bytes left in the file (checked above).
        let mut bytes = vec![0u8; len as usize];
        self.read_bytes(&mut bytes, what)?;
        String::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { what: what.into() })
    }

    /// A value type id.
    pub(crate) fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::UnknownValueType(id))
    }

    /// One value of type `ty`.
    pub(crate) fn value(&mut self, ty: ValueType) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array("u8")?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array("i8")?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16")?)),
            ValueType::U32 => Value::U32(self.u32("u32")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32")?)),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => Value::Array(self.array_value(1)?),
            ValueType::U64 => Value::U64(self.u64("u64")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64")?)),
        })
    }

    fn bool(&mut self) -> Result<bool, GgufError> {
        match self.array::<1>("bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(GgufError::InvalidBool(b)),
        }
    }

    /// An array (element type, count, elements) at nesting `depth` (1 = a top-level value).
    fn array_value(&mut self, depth: u32) -> Result<Array, GgufError> {
        Self::check_limit(
            "array nesting",
            depth.into(),
            self.limits.max_array_depth.into(),
        )?;
        let ty = self.value_type()?;
        // Strings and arrays take at least their 8-byte length/count (arrays 12 with the type).
        let min_bytes = ty.fixed_size().unwrap_or(8);
        let n = self.count("array length", self.limits.max_array_len, min_bytes)?;
        let mem_per = match ty {
            ValueType::String => STRING_OVERHEAD,
            ValueType::Array => std::mem::size_of::<Array>() as u64,
            _ => min_bytes,
        };
        self.charge(n.saturating_mul(mem_per))?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let mut v: Vec<$t> = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
                for _ in 0..n {
                    v.push(<$t>::from_le_bytes(self.array(stringify!($t))?));
                }
                Array::$variant(v)
            }};
        }
        Ok(match ty {
            ValueType::U8 => fixed!(U8, u8),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
                for _ in 0..n {
                    v.push(self.bool()?);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
                for _ in 0..n {
                    v.push(self.string("string array element")?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
                for _ in 0..n {
                    v.push(self.array_value(depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

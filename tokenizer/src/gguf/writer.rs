//! A small GGUF writer, so tests can build files (a tiny vocabulary, a tiny random-weight model)
//! instead of shipping them.

use std::io::{self, Write};

use super::tensor::GgmlType;
use super::value::{Array, Value};
use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};

/// Builds a GGUF file in memory: metadata, then tensors laid out at aligned offsets.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    /// A version-3 file with the default alignment and nothing in it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the format version written (2 and 3 share one layout).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the data alignment; a non-default one is also written as `general.alignment`.
    pub fn alignment(&mut self, alignment: u64) -> &mut Self {
        self.alignment = alignment;
        self
    }

    /// Adds a metadata key/value (in call order; duplicates are written as given).
    pub fn add(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Adds a tensor with its raw data bytes.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        shape: Vec<u64>,
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push((name.into(), shape, ggml_type, data));
        self
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write(&mut out);
        out
    }

    /// Writes the whole file to `w`.
    pub fn write<W: Write>(&self, w: &mut W) -> io::Result<()> {
        let mut head = Vec::new();
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&self.version.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        let extra_alignment = self.alignment != DEFAULT_ALIGNMENT;
        let n_kv = self.metadata.len() + usize::from(extra_alignment);
        head.extend_from_slice(&(n_kv as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut head, k);
            put_typed_value(&mut head, v);
        }
        if extra_alignment {
            put_string(&mut head, ALIGNMENT_KEY);
            // Alignments past u32 are invalid anyway; the reader rejects what this writes.
            put_typed_value(&mut head, &Value::U32(self.alignment as u32));
        }
        let align = self.alignment.max(1);
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, shape, ty, data) in &self.tensors {
            put_string(&mut head, name);
            head.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&ty.0.to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).next_multiple_of(align);
        }
        let data_start = (head.len() as u64).next_multiple_of(align);
        head.resize(data_start as usize, 0);
        w.write_all(&head)?;
        let mut written = 0u64;
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            w.write_all(&vec![0u8; (off - written) as usize])?;
            w.write_all(data)?;
            written = off + data.len() as u64;
        }
        Ok(())
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_typed_value(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(&v.value_type().id().to_le_bytes());
    put_value(out, v);
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.element_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

//! Tensor descriptions of a GGUF file (name, shape, type, offset), for a model loader.

/// Most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;

/// A ggml tensor element type, as its raw id; known ids have a name and a block layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// (id, name, elements per block, bytes per block) of the ggml types this reader can size.
const KNOWN_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (30, "BF16", 1, 2),
];

impl GgmlType {
    fn known(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        KNOWN_TYPES.iter().find(|t| t.0 == self.0)
    }

    /// The type's ggml name ("Q4_1", "F32", ...), for the types this reader knows.
    pub fn name(self) -> Option<&'static str> {
        self.known().map(|t| t.1)
    }

    /// (elements per block, bytes per block), for the types this reader knows.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        self.known().map(|t| (t.2, t.3))
    }
}

/// One tensor's description from the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. "blk.0.attn_q.weight".
    pub name: String,
    /// Dimensions in ggml order (innermost first), 1 to [`MAX_DIMS`] of them.
    pub shape: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the tensor's data from the start of the data section
    /// ([`super::GgufFile::data_offset`]).
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (the product of the dimensions; checked for overflow when read).
    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes of data the tensor takes, when its type is known and its innermost dimension is a
    /// whole number of blocks.
    pub fn byte_len(&self) -> Option<u64> {
        let (block, bytes) = self.ggml_type.block_layout()?;
        let inner = *self.shape.first()?;
        if inner % block != 0 {
            return None;
        }
        (self.element_count() / block).checked_mul(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_embedding_size() {
        let t = TensorInfo {
            name: "token_embd.weight".into(),
            shape: vec![576, 49152],
            ggml_type: GgmlType(3),
            offset: 0,
        };
        assert_eq!(t.ggml_type.name(), Some("Q4_1"));
        assert_eq!(t.element_count(), 576 * 49152);
        assert_eq!(t.byte_len(), Some(576 / 32 * 20 * 49152));
    }

    #[test]
    fn partial_blocks_and_unknown_types_have_no_size() {
        let mut t = TensorInfo {
            name: "x".into(),
            shape: vec![33],
            ggml_type: GgmlType(2),
            offset: 0,
        };
        assert_eq!(t.byte_len(), None);
        t.ggml_type = GgmlType(999);
        assert_eq!(t.byte_len(), None);
        assert_eq!(t.ggml_type.name(), None);
    }
}

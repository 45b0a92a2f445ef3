//! Llama hyperparameters read from a GGUF file's metadata (`llama.*` keys, llama.cpp's names).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};

use super::error::LoadError;

/// Everything the forward pass needs to know about the model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaParams {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size (embedding length).
    pub hidden: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Feed-forward (SwiGLU) inner size.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub context_length: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// End-of-sequence token, if the metadata names one.
    pub eos_token_id: Option<u32>,
}

impl LlamaParams {
    /// Reads the hyperparameters of a llama-architecture model. The vocabulary size falls back
    /// to the embedding table's rows; the head size is `embedding_length / head_count` and must
    /// equal `rope.dimension_count` when present (partial rotary embeddings are not supported).
    pub fn from_gguf(content: &Content) -> Result<LlamaParams, LoadError> {
        let md = &content.metadata;
        let arch = string(md, "general.architecture")?;
        if arch != "llama" {
            return Err(LoadError::Unsupported(format!(
                "architecture {arch:?} (only \"llama\" is supported)"
            )));
        }
        if let Some(kind) = optional_string(md, "llama.rope.scaling.type")?
            && kind != "none"
        {
            return Err(LoadError::Unsupported(format!("RoPE scaling {kind:?}")));
        }
        let n_layer = int(md, "llama.block_count")?;
        let hidden = int(md, "llama.embedding_length")?;
        let n_head = int(md, "llama.attention.head_count")?;
        let n_head_kv = optional_int(md, "llama.attention.head_count_kv")?.unwrap_or(n_head);
        let ffn = int(md, "llama.feed_forward_length")?;
        let context_length = int(md, "llama.context_length")?;
        let rope_theta = optional_float(md, "llama.rope.freq_base")?.unwrap_or(10_000.0);
        let rms_eps = optional_float(md, "llama.attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);
        let embd_rows = content
            .tensor_infos
            .get("token_embd.weight")
            .and_then(|t| t.shape.dims().first().copied());
        let vocab_size = match optional_int(md, "llama.vocab_size")? {
            Some(v) => v,
            None => {
                embd_rows.ok_or_else(|| LoadError::MissingTensor("token_embd.weight".into()))?
            }
        };
        let eos_token_id = optional_int(md, "tokenizer.ggml.eos_token_id")?.map(|e| e as u32);

        let bad = |msg: String| Err(LoadError::Metadata(msg));
        if n_layer == 0 || hidden == 0 || n_head == 0 || n_head_kv == 0 || ffn == 0 {
            return bad("zero-sized dimension".into());
        }
        if hidden % n_head != 0 {
            return bad(format!(
                "embedding length {hidden} is not a multiple of {n_head} heads"
            ));
        }
        if n_head % n_head_kv != 0 {
            return bad(format!(
                "{n_head} heads are not a multiple of {n_head_kv} KV heads"
            ));
        }
        let head_dim = hidden / n_head;
        if head_dim % 2 != 0 {
            return bad(format!("head size {head_dim} is odd"));
        }
        if let Some(rot) = optional_int(md, "llama.rope.dimension_count")?
            && rot != head_dim
        {
            return Err(LoadError::Unsupported(format!(
                "rotary dimension {rot} differs from the head size {head_dim}"
            )));
        }
        if vocab_size == 0 || u32::try_from(vocab_size).is_err() {
            return bad(format!("vocabulary size {vocab_size}"));
        }
        if let Some(e) = eos_token_id
            && e as usize >= vocab_size
        {
            return bad(format!("EOS token {e} is outside the vocabulary"));
        }
        if !(rope_theta.is_finite() && rope_theta > 0.0 && rms_eps.is_finite() && rms_eps >= 0.0) {
            return bad(format!("rope base {rope_theta} / rms epsilon {rms_eps}"));
        }
        Ok(LlamaParams {
            n_layer,
            hidden,
            n_head,
            n_head_kv,
            head_dim,
            ffn,
            vocab_size,
            context_length,
            rope_theta,
            rms_eps,
            eos_token_id,
        })
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Floats of one token's K (or V) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Bytes of one token's KV as stored and exported: every layer's K and V in f32.
    pub fn kv_bytes_per_token(&self) -> u64 {
        (self.n_layer * 2 * self.kv_dim() * 4) as u64
    }

    /// The exported KV layout: per block, every layer's K then V, f32, this geometry.
    pub fn kv_layout(&self) -> String {
        format!(
            "candle/f32/layers={}/kv_heads={}/head_dim={}",
            self.n_layer, self.n_head_kv, self.head_dim
        )
    }
}

fn int(md: &HashMap<String, Value>, key: &str) -> Result<usize, LoadError> {
    optional_int(md, key)?.ok_or_else(|| LoadError::Metadata(format!("missing key {key}")))
}

fn optional_int(md: &HashMap<String, Value>, key: &str) -> Result<Option<usize>, LoadError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let n: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        _ => return Err(LoadError::Metadata(format!("{key} is not an integer"))),
    };
    usize::try_from(n)
        .map(Some)
        .map_err(|_| LoadError::Metadata(format!("{key} = {n} is out of range")))
}

fn optional_float(md: &HashMap<String, Value>, key: &str) -> Result<Option<f32>, LoadError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::F32(x)) => Ok(Some(*x)),
        Some(Value::F64(x)) => Ok(Some(*x as f32)),
        Some(_) => optional_int(md, key).map(|v| v.map(|v| v as f32)),
    }
}

fn string<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a str, LoadError> {
    optional_string(md, key)?.ok_or_else(|| LoadError::Metadata(format!("missing key {key}")))
}

fn optional_string<'a>(
    md: &'a HashMap<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, LoadError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(LoadError::Metadata(format!("{key} is not a string"))),
    }
}

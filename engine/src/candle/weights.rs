//! Loads a llama GGUF's weights: re-quantized (Q8_0 by default), q/k/v and gate/up fused into
//! one matmul each, and the inner dimension of matmuls fed by the hidden state optionally
//! zero-padded to a multiple of 256 (see [`super::Padding`]).

use std::borrow::Cow;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Tensor};

use super::config::WeightFormat;
use super::error::LoadError;
use super::linear::Linear;
use super::params::LlamaParams;

/// Weights of one transformer block.
#[derive(Debug)]
pub(crate) struct LayerWeights {
    pub attn_norm: Tensor,
    /// Rows: q (`n_head * head_dim`), then k and v (`kv_dim` each).
    pub qkv: Linear,
    pub wo: Linear,
    pub ffn_norm: Tensor,
    /// Rows: gate (`ffn`), then up (`ffn`).
    pub gate_up: Linear,
    pub down: Linear,
}

/// The whole model's weights.
#[derive(Debug)]
pub(crate) struct Weights {
    /// Token embeddings `[vocab, hidden]` as stored (looked up row by row).
    pub embed: QTensor,
    pub layers: Vec<LayerWeights>,
    pub out_norm: Tensor,
    /// `[vocab, hidden(+pad)]`; the embedding table when the output is tied.
    pub lm_head: Linear,
}

/// How to lay out the matmul weights.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub format: WeightFormat,
    /// Padded inner size of matmuls fed by the hidden state (`hidden` when unpadded).
    pub hidden_in: usize,
    /// Padded inner size of the attention output projection.
    pub attn_in: usize,
    /// Which quantized matmuls run on the tiled AVX2 kernels instead of candle's.
    pub tiled: super::linear::TiledKernels,
}

impl Layout {
    /// Format of the output projection: Q8_0 whenever the blocks are quantized (it decides the
    /// sampled token: 8 bits keep it close to the file's embedding). Padded like the blocks:
    /// unpadded, candle's generic Q8_0 kernel took 30% of a decode step at batch 8.
    pub fn head_format(&self) -> WeightFormat {
        match self.format {
            // An unresolved `Auto` loads as its fallback, Q8_0.
            WeightFormat::Q4K | WeightFormat::Auto => WeightFormat::Q8_0,
            f => f,
        }
    }
}

/// Reads the GGUF header (metadata and tensor index) of `path`.
pub(crate) fn read_content(path: &Path) -> Result<(Content, BufReader<File>), LoadError> {
    let file = File::open(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).map_err(|source| LoadError::Gguf {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((content, reader))
}

struct Loader<'a> {
    content: &'a Content,
    reader: &'a mut BufReader<File>,
    device: &'a Device,
    layout: Layout,
}

impl Loader<'_> {
    /// A tensor as stored, on the CPU, checked against the expected `[rows, cols]` (candle order).
    fn raw(&mut self, name: &str, dims: &[usize]) -> Result<QTensor, LoadError> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(LoadError::MissingTensor(name.into()));
        }
        let t = self.content.tensor(self.reader, name, &Device::Cpu)?;
        if t.shape().dims() != dims {
            return Err(LoadError::BadTensor {
                name: name.into(),
                detail: format!("shape {:?}, expected {dims:?}", t.shape().dims()),
            });
        }
        Ok(t)
    }

    /// A norm weight as an f32 vector on the device.
    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor, LoadError> {
        Ok(self.raw(name, &[len])?.dequantize(self.device)?)
    }

    /// One matmul from the row-wise concatenation of `parts` (each `[rows_i, k]`), its inner
    /// dimension zero-padded to `k_pad`, in the configured format.
    fn linear(
        &mut self,
        parts: &[(&str, usize)],
        k: usize,
        k_pad: usize,
    ) -> Result<Linear, LoadError> {
        self.linear_as(self.layout.format, parts, k, k_pad)
    }

    fn linear_as(
        &mut self,
        format: WeightFormat,
        parts: &[(&str, usize)],
        k: usize,
        k_pad: usize,
    ) -> Result<Linear, LoadError> {
        let m = self.qmatmul(format, parts, k, k_pad)?;
        Ok(Linear::new(m, self.layout.tiled)?)
    }

    fn qmatmul(
        &mut self,
        format: WeightFormat,
        parts: &[(&str, usize)],
        k: usize,
        k_pad: usize,
    ) -> Result<QMatMul, LoadError> {
        let mut raws = Vec::with_capacity(parts.len());
        for &(name, rows) in parts {
            raws.push(self.raw(name, &[rows, k])?);
        }
        let rows: usize = parts.iter().map(|p| p.1).sum();
        let same_dtype = raws.iter().all(|r| r.dtype() == raws[0].dtype());
        if format == WeightFormat::Keep && k_pad == k && same_dtype {
            // Quantized rows are independent: concatenating their bytes is exact.
            let dtype = raws[0].dtype();
            let mut bytes = Vec::new();
            for r in &raws {
                bytes.extend_from_slice(&r.data()?);
            }
            let storage = QStorage::from_data(Cow::Owned(bytes), self.device, dtype)?;
            return Ok(QMatMul::from_qtensor(QTensor::new(storage, (rows, k))?)?);
        }
        let mut dense = Vec::with_capacity(raws.len());
        for r in &raws {
            dense.push(r.dequantize(&Device::Cpu)?);
        }
        let w = Tensor::cat(&dense, 0)?.pad_with_zeros(1, 0, k_pad - k)?;
        let dtype = match format {
            WeightFormat::Keep if same_dtype => raws[0].dtype(),
            WeightFormat::Keep | WeightFormat::F32 => {
                return Ok(QMatMul::Tensor(w.to_device(self.device)?));
            }
            WeightFormat::Q8_0 | WeightFormat::Auto => GgmlDType::Q8_0,
            WeightFormat::Q4K => GgmlDType::Q4K,
        };
        if !k_pad.is_multiple_of(dtype.block_size()) {
            return Err(LoadError::Config(format!(
                "{} weights need inner sizes that are multiples of {} ({} is not; enable padding)",
                format,
                dtype.block_size(),
                k_pad
            )));
        }
        Ok(QMatMul::from_qtensor(QTensor::quantize_onto(
            &w,
            dtype,
            self.device,
        )?)?)
    }
}

/// Loads every weight of `params`'s model from `content`/`reader` onto `device`.
pub(crate) fn load(
    content: &Content,
    reader: &mut BufReader<File>,
    params: &LlamaParams,
    layout: Layout,
    device: &Device,
) -> Result<Weights, LoadError> {
    let p = params;
    let (h, hd, kvd) = (p.hidden, p.head_dim, p.kv_dim());
    let mut l = Loader {
        content,
        reader,
        device,
        layout,
    };
    let embed_cpu = l.raw("token_embd.weight", &[p.vocab_size, h])?;
    let embed = if device.is_cpu() {
        embed_cpu
    } else {
        QTensor::new(
            QStorage::from_data(embed_cpu.data()?, device, embed_cpu.dtype())?,
            (p.vocab_size, h),
        )?
    };
    let mut layers = Vec::with_capacity(p.n_layer);
    for i in 0..p.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let (q, k, v) = (n("attn_q"), n("attn_k"), n("attn_v"));
        let (gate, up) = (n("ffn_gate"), n("ffn_up"));
        layers.push(LayerWeights {
            attn_norm: l.vector(&n("attn_norm"), h)?,
            qkv: l.linear(
                &[(&q, p.n_head * hd), (&k, kvd), (&v, kvd)],
                h,
                layout.hidden_in,
            )?,
            wo: l.linear(&[(&n("attn_output"), h)], p.n_head * hd, layout.attn_in)?,
            ffn_norm: l.vector(&n("ffn_norm"), h)?,
            gate_up: l.linear(&[(&gate, p.ffn), (&up, p.ffn)], h, layout.hidden_in)?,
            down: l.linear(&[(&n("ffn_down"), h)], p.ffn, p.ffn)?,
        });
    }
    let out_norm = l.vector("output_norm.weight", h)?;
    let head = if content.tensor_infos.contains_key("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let lm_head = l.linear_as(
        layout.head_format(),
        &[(head, p.vocab_size)],
        h,
        layout.hidden_in,
    )?;
    Ok(Weights {
        embed,
        layers,
        out_norm,
        lm_head,
    })
}

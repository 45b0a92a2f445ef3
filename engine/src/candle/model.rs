//! The llama forward pass over a ragged batch: every sequence's new tokens are concatenated
//! into one `[rows, hidden]` activation for the embedding, norms and linear layers; attention
//! runs per sequence over its own paged KV (see `attention`). Keys get RoPE at their absolute
//! positions before they are stored, so a chunk of a prompt, a decode token and an imported
//! block all see the same cached keys.

use std::path::Path;

use candle_core::{Device, Result, Tensor};
use candle_nn::ops::rms_norm;
use candle_nn::rotary_emb::rope_i;

use super::attention::{AttnGeom, RowInfo, Span, attend_cpu, attend_tensors};
use super::config::WeightFormat;
use super::error::LoadError;
use super::kv_store::{KvStore, SlotRun};
use super::linear::TiledKernels;
use super::params::LlamaParams;
use super::weights::{self, Layout, Weights};

/// Which attention implementation a model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttnImpl {
    /// The CPU kernel over the paged storage (deterministic per token).
    Native,
    /// Gather plus tensor ops (any device).
    Tensors,
}

/// A loaded llama model.
#[derive(Debug)]
pub(crate) struct Llama {
    pub params: LlamaParams,
    weights: Weights,
    device: Device,
    /// RoPE tables `[positions, head_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    hidden_in: usize,
    attn_in: usize,
    geom: AttnGeom,
    pub attention: AttnImpl,
}

/// How to load a model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadOptions {
    pub format: WeightFormat,
    pub pad: bool,
    pub block_size: usize,
    /// Positions supported (RoPE table size); capped by the model's context length.
    pub max_context: Option<usize>,
    /// Early exit after this many layers (`None`: all).
    pub layers: Option<usize>,
    /// Which quantized matmuls run on the tiled AVX2 kernels.
    pub tiled: TiledKernels,
}

/// Rounds `n` up to a multiple of 256 when padding.
fn padded(n: usize, pad: bool) -> usize {
    if pad { n.next_multiple_of(256) } else { n }
}

impl Llama {
    /// Reads hyperparameters and weights from a GGUF file onto `device`.
    pub fn load(
        path: &Path,
        opts: LoadOptions,
        device: &Device,
    ) -> std::result::Result<Llama, LoadError> {
        let (content, mut reader) = weights::read_content(path)?;
        let mut params = LlamaParams::from_gguf(&content)?;
        if let Some(n) = opts.layers {
            if n == 0 || n > params.n_layer {
                return Err(LoadError::Config(format!(
                    "layers={n}: the model has {} layers",
                    params.n_layer
                )));
            }
            // Only the first n layers are loaded; the final norm and head stay.
            params.n_layer = n;
        }
        let layout = Layout {
            format: opts.format,
            hidden_in: padded(params.hidden, opts.pad),
            attn_in: padded(params.n_head * params.head_dim, opts.pad),
            tiled: if device.is_cpu() {
                opts.tiled
            } else {
                TiledKernels::default()
            },
        };
        let weights = weights::load(&content, &mut reader, &params, layout, device)?;
        let positions = opts
            .max_context
            .map_or(params.context_length, |c| c.min(params.context_length))
            .max(1);
        let (cos, sin) = rope_tables(&params, positions, device)?;
        let geom = AttnGeom {
            n_head: params.n_head,
            n_head_kv: params.n_head_kv,
            head_dim: params.head_dim,
            block_size: opts.block_size,
        };
        Ok(Llama {
            params,
            weights,
            device: device.clone(),
            cos,
            sin,
            hidden_in: layout.hidden_in,
            attn_in: layout.attn_in,
            geom,
            attention: if device.is_cpu() {
                AttnImpl::Native
            } else {
                AttnImpl::Tensors
            },
        })
    }

    /// Positions the RoPE tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Runs `tokens` (the spans' new tokens, concatenated in span order) through the model,
    /// writing their KV into `kv`, and returns the logits `[logit_rows.len(), vocab]` of the
    /// given rows (`None` when no row is asked for).
    pub fn forward(
        &self,
        kv: &KvStore,
        tokens: &[u32],
        spans: &[Span<'_>],
        logit_rows: &[usize],
    ) -> Result<Option<Tensor>> {
        let p = &self.params;
        let n = tokens.len();
        let (nh, hd, kvd, ffn) = (p.n_head, p.head_dim, p.kv_dim(), p.ffn);
        let bs = self.geom.block_size;
        let mut positions = Vec::with_capacity(n);
        let mut rows = Vec::with_capacity(n);
        let mut runs: Vec<SlotRun> = Vec::with_capacity(spans.len());
        for (si, span) in spans.iter().enumerate() {
            for i in 0..span.len {
                let (row, pos) = (span.start + i, span.position + i);
                positions.push(pos as u32);
                rows.push(RowInfo {
                    position: pos,
                    span: si,
                });
                let slot = span.slot(pos, bs);
                match runs.last_mut() {
                    Some(r) if r.row + r.len == row && r.slot + r.len == slot => r.len += 1,
                    _ => runs.push(SlotRun { row, slot, len: 1 }),
                }
            }
        }
        let dev = &self.device;
        let ids = Tensor::from_slice(tokens, n, dev)?;
        let pos = Tensor::from_vec(positions, n, dev)?;
        let cos = self.cos.index_select(&pos, 0)?.reshape((n, 1, hd / 2))?;
        let sin = self.sin.index_select(&pos, 0)?.reshape((n, 1, hd / 2))?;
        let picked: Vec<u32> = logit_rows.iter().map(|&r| r as u32).collect();
        let picked = Tensor::from_vec(picked, logit_rows.len(), dev)?;
        let n_layer = self.weights.layers.len();
        // Only the sampled rows need the last layer's output (every row's KV is written before):
        // from its attention on, the last layer runs on those rows alone.
        let trim_last = logit_rows.len() < n;
        let mut x = self.weights.embed.embedding(&ids)?;
        for (l, w) in self.weights.layers.iter().enumerate() {
            let h = self.norm_in(&x, &w.attn_norm)?;
            let qkv = w.qkv.forward(&h)?;
            let q = qkv.narrow(1, 0, nh * hd)?.contiguous()?;
            let k = qkv.narrow(1, nh * hd, kvd)?.contiguous()?;
            let v = qkv.narrow(1, nh * hd + kvd, kvd)?.contiguous()?;
            let q = rope_i(&q.reshape((n, nh, 1, hd))?, &cos, &sin)?.reshape((n, nh, hd))?;
            let k = rope_i(&k.reshape((n, p.n_head_kv, 1, hd))?, &cos, &sin)?.reshape((n, kvd))?;
            kv.write(l, &k, &v, &runs)?;
            let (ks, vs) = kv.layer(l);
            let attn = if l + 1 == n_layer && trim_last {
                if logit_rows.is_empty() {
                    return Ok(None);
                }
                x = x.index_select(&picked, 0)?;
                match self.attention {
                    AttnImpl::Native => {
                        let sel: Vec<RowInfo> = logit_rows.iter().map(|&r| rows[r]).collect();
                        attend_cpu(self.geom, &q.index_select(&picked, 0)?, ks, vs, spans, &sel)?
                    }
                    AttnImpl::Tensors => {
                        attend_tensors(self.geom, &q, ks, vs, spans)?.index_select(&picked, 0)?
                    }
                }
            } else {
                match self.attention {
                    AttnImpl::Native => attend_cpu(self.geom, &q, ks, vs, spans, &rows)?,
                    AttnImpl::Tensors => attend_tensors(self.geom, &q, ks, vs, spans)?,
                }
            };
            let attn = attn.pad_with_zeros(1, 0, self.attn_in - nh * hd)?;
            x = (x + w.wo.forward(&attn)?)?;
            let h = self.norm_in(&x, &w.ffn_norm)?;
            let gu = w.gate_up.forward(&h)?;
            let act = (gu.narrow(1, 0, ffn)?.silu()? * gu.narrow(1, ffn, ffn)?)?;
            x = (x + w.down.forward(&act)?)?;
        }
        if logit_rows.is_empty() {
            return Ok(None);
        }
        if !trim_last {
            x = x.index_select(&picked, 0)?;
        }
        let h = self.norm_in(&x, &self.weights.out_norm)?;
        Ok(Some(self.weights.lm_head.forward(&h)?))
    }

    /// RMSNorm, then zero-padding to the matmul inner size.
    fn norm_in(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        rms_norm(x, w, self.params.rms_eps)?.pad_with_zeros(
            1,
            0,
            self.hidden_in - self.params.hidden,
        )
    }
}

/// cos and sin of `pos * theta^(-2i / head_dim)` for every position and pair `i`, computed in
/// f64 and rounded once.
fn rope_tables(p: &LlamaParams, positions: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = p.head_dim / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| f64::from(p.rope_theta).powf(-2.0 * i as f64 / p.head_dim as f64))
        .collect();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for pos in 0..positions {
        for f in &inv {
            let a = pos as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(cos, (positions, half), device)?,
        Tensor::from_vec(sin, (positions, half), device)?,
    ))
}

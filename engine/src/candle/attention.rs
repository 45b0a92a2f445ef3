//! Attention of each sequence's new tokens over its own paged KV.
//!
//! The CPU kernel reads K and V straight from the paged storage (no gather) and computes every
//! (token, KV head) unit on its own, in a fixed order: a query's result depends only on its own
//! keys, never on which other tokens share the step or how the prompt was chunked. That makes
//! batched decoding equal one-at-a-time decoding and chunked prefill equal one-shot prefill, bit
//! for bit, so KV computed on a prefill worker is exactly what the decode worker would compute.
//! Other devices take [`attend_tensors`]: gather with `index_select`, then matmuls and softmax.

use candle_core::{D, Device, Result, Storage, Tensor};
use parking_lot::Mutex;

use crate::types::BlockId;

/// One sequence's share of a forward pass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span<'a> {
    /// Its first row in the batch.
    pub start: usize,
    /// Its new tokens.
    pub len: usize,
    /// Position of its first new token.
    pub position: usize,
    /// Its block table (covers at least `position + len` tokens).
    pub table: &'a [BlockId],
}

impl Span<'_> {
    /// Storage slot of position `pos`.
    pub fn slot(&self, pos: usize, block_size: usize) -> usize {
        self.table[pos / block_size] as usize * block_size + pos % block_size
    }
}

/// Attention shapes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnGeom {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

impl AttnGeom {
    fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Per batch row: its position and its span.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowInfo {
    pub position: usize,
    pub span: usize,
}

/// The contiguous f32 contents of a CPU tensor, read-locked for the duration of `f`.
pub(crate) fn with_cpu_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("expected a CPU tensor");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("expected a contiguous tensor");
    };
    f(&cpu.as_slice::<f32>()?[start..end])
}

/// CPU attention: `q` is `[rows, n_head, head_dim]` (contiguous, RoPE applied), `k_store` and
/// `v_store` are a layer's `[slots, kv_dim]` storage with this step's keys already written.
/// Returns `[rows, n_head * head_dim]`.
pub(crate) fn attend_cpu(
    geom: AttnGeom,
    q: &Tensor,
    k_store: &Tensor,
    v_store: &Tensor,
    spans: &[Span<'_>],
    rows: &[RowInfo],
) -> Result<Tensor> {
    let (hd, group) = (geom.head_dim, geom.group());
    let unit = group * hd;
    let mut out = vec![0f32; rows.len() * geom.n_head * hd];
    with_cpu_slice(q, |q| {
        with_cpu_slice(k_store, |k| {
            with_cpu_slice(v_store, |v| {
                // One cell per (row, KV head): workers write disjoint outputs without unsafe code.
                let cells: Vec<Mutex<&mut [f32]>> = out.chunks_mut(unit).map(Mutex::new).collect();
                let arch = pulp::Arch::new();
                candle_core::utils::barrier_pool().execute_chunked(cells.len(), |range| {
                    arch.dispatch(Units {
                        geom,
                        q,
                        k,
                        v,
                        spans,
                        rows,
                        cells: &cells,
                        range,
                    });
                });
                Ok(())
            })
        })
    })?;
    Tensor::from_vec(out, (rows.len(), geom.n_head * hd), &Device::Cpu)
}

/// A worker's range of (row, KV head) units. Run through `pulp::Arch::dispatch`, so the
/// kernel (inlined into it) is compiled for AVX2/FMA when the CPU has them: same results, the
/// summation order is fixed by the code and no multiply-add is fused.
struct Units<'a, 'b> {
    geom: AttnGeom,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    spans: &'a [Span<'b>],
    rows: &'a [RowInfo],
    cells: &'a [Mutex<&'a mut [f32]>],
    range: std::ops::Range<usize>,
}

impl pulp::WithSimd for Units<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let geom = self.geom;
        let (hd, group) = (geom.head_dim, geom.group());
        // Scores of one unit; allocated per range (a handful per layer) rather than kept in a
        // thread-local, whose accessor would not be inlined into this target-feature context.
        let mut scores = Vec::new();
        for u in self.range {
            let (r, g) = (u / geom.n_head_kv, u % geom.n_head_kv);
            let row = self.rows[r];
            let qs = &self.q[(r * geom.n_head + g * group) * hd..][..group * hd];
            let mut o = self.cells[u].lock();
            let span = &self.spans[row.span];
            attend_unit(
                geom,
                qs,
                self.k,
                self.v,
                span,
                row.position,
                g,
                &mut scores,
                &mut o,
            );
        }
    }
}

/// The `group` query heads sharing KV head `g`, for the token at `pos`, over keys `0..=pos`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_unit(
    geom: AttnGeom,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    span: &Span<'_>,
    pos: usize,
    g: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (hd, group, kvd, bs) = (geom.head_dim, geom.group(), geom.kv_dim(), geom.block_size);
    let n_keys = pos + 1;
    let scale = geom.scale();
    {
        scores.clear();
        scores.resize(group * n_keys, 0.0);
        let mut j = 0;
        while j < n_keys {
            let base = span.table[j / bs] as usize * bs;
            let run = (bs - j % bs).min(n_keys - j);
            for s in 0..run {
                let krow = &k[(base + j % bs + s) * kvd + g * hd..][..hd];
                for h in 0..group {
                    scores[h * n_keys + j + s] = dot(&q[h * hd..][..hd], krow) * scale;
                }
            }
            j += run;
        }
        let mut inv = [0f32; 16];
        for h in 0..group {
            let row = &mut scores[h * n_keys..][..n_keys];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let mut sum = 0f32;
            for x in row.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            if h < inv.len() {
                inv[h] = 1.0 / sum;
            } else {
                row.iter_mut().for_each(|x| *x /= sum);
            }
        }
        out.fill(0.0);
        let mut j = 0;
        while j < n_keys {
            let base = span.table[j / bs] as usize * bs;
            let run = (bs - j % bs).min(n_keys - j);
            for s in 0..run {
                let vrow = &v[(base + j % bs + s) * kvd + g * hd..][..hd];
                for h in 0..group {
                    axpy(&mut out[h * hd..][..hd], scores[h * n_keys + j + s], vrow);
                }
            }
            j += run;
        }
        for h in 0..group.min(inv.len()) {
            out[h * hd..][..hd].iter_mut().for_each(|x| *x *= inv[h]);
        }
    }
}

/// Dot product with eight independent accumulators (vectorizes; fixed summation order).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `out += w * x`.
#[inline(always)]
fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, x) in out.iter_mut().zip(x) {
        *o += w * x;
    }
}

/// Device-agnostic attention from tensor ops: per span, gather its keys and values with
/// `index_select`, repeat KV heads for grouped queries, masked softmax. `q` is
/// `[rows, n_head, head_dim]`; returns `[rows, n_head * head_dim]`.
pub(crate) fn attend_tensors(
    geom: AttnGeom,
    q: &Tensor,
    k_store: &Tensor,
    v_store: &Tensor,
    spans: &[Span<'_>],
) -> Result<Tensor> {
    let (nh, nkv, hd, group) = (geom.n_head, geom.n_head_kv, geom.head_dim, geom.group());
    let device = q.device();
    let mut outs = Vec::with_capacity(spans.len());
    for span in spans {
        let ctx = span.position + span.len;
        let slots: Vec<u32> = (0..ctx)
            .map(|p| span.slot(p, geom.block_size) as u32)
            .collect();
        let idx = Tensor::from_vec(slots, ctx, device)?;
        let gather = |store: &Tensor| -> Result<Tensor> {
            store
                .index_select(&idx, 0)?
                .reshape((ctx, nkv, 1, hd))?
                .broadcast_as((ctx, nkv, group, hd))?
                .reshape((ctx, nh, hd))?
                .transpose(0, 1)?
                .contiguous()
        };
        let (k, v) = (gather(k_store)?, gather(v_store)?);
        let qs = q
            .narrow(0, span.start, span.len)?
            .transpose(0, 1)?
            .contiguous()?;
        let scores = (qs.matmul(&k.t()?)? * f64::from(geom.scale()))?;
        let mask: Vec<f32> = (0..span.len)
            .flat_map(|i| {
                (0..ctx).map(move |j| {
                    if j > span.position + i {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (span.len, ctx), device)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        let o = probs.matmul(&v)?; // [nh, len, hd]
        outs.push(o.transpose(0, 1)?.reshape((span.len, nh * hd))?);
    }
    let out = Tensor::cat(&outs, 0)?;
    debug_assert_eq!(out.dim(D::Minus1)?, nh * hd);
    Ok(out)
}

//! The paged KV memory behind the pool's block ids: per layer, one K and one V tensor of
//! `[total_blocks * block_size, n_head_kv * head_dim]` f32, where block `b` holds slots
//! `[b * block_size, (b + 1) * block_size)` and slot `b * block_size + i` holds the token at
//! position `i` of that block.
//!
//! Export format of one block holding `filled` tokens (the bytes moved between engines):
//! for each layer `0..n_layer`, the K rows then the V rows of the block's first `filled` slots,
//! each row `n_head_kv * head_dim` little-endian f32 (heads in order, then dimensions): in all
//! `n_layer * 2 * filled * kv_dim * 4` bytes (46,080 bytes per token for SmolLM2-135M). Keys are
//! stored after RoPE, at their absolute positions, so blocks move between engines unchanged.

use std::sync::Arc;

use bytes::Bytes;
use candle_core::{DType, Device, Result, Tensor};

use super::export_buffers::ExportBuffers;
use crate::error::BackendError;
use crate::types::BlockId;

/// A run of consecutive batch rows written to consecutive slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRun {
    pub row: usize,
    pub slot: usize,
    pub len: usize,
}

/// The KV memory of every layer.
#[derive(Debug)]
pub(crate) struct KvStore {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    block_size: usize,
    kv_dim: usize,
    total_blocks: usize,
    /// Buffers of exported blocks, reused once the transport dropped them.
    exports: Arc<ExportBuffers>,
}

/// Idle export buffers kept per KV memory: 32 MiB, 45 SmolLM2-135M blocks, more than a
/// 512-token prefill's 32 (what streams out while the next chunk computes).
const EXPORT_BUFFERS_BYTES: usize = 32 << 20;

impl KvStore {
    /// Zeroed memory for `total_blocks` blocks of every layer.
    pub fn new(
        n_layer: usize,
        total_blocks: usize,
        block_size: usize,
        kv_dim: usize,
        device: &Device,
    ) -> Result<KvStore> {
        let slots = total_blocks * block_size;
        let mut k = Vec::with_capacity(n_layer);
        let mut v = Vec::with_capacity(n_layer);
        for _ in 0..n_layer {
            k.push(Tensor::zeros((slots, kv_dim), DType::F32, device)?);
            v.push(Tensor::zeros((slots, kv_dim), DType::F32, device)?);
        }
        Ok(KvStore {
            k,
            v,
            block_size,
            kv_dim,
            total_blocks,
            exports: ExportBuffers::new(EXPORT_BUFFERS_BYTES),
        })
    }

    /// The same memory, exporting every block into a fresh allocation (what export did
    /// before its buffers were reused): the A of `kv_block_copy_speed`'s A/B.
    #[cfg(test)]
    pub fn without_export_reuse(mut self) -> KvStore {
        self.exports = ExportBuffers::new(0);
        self
    }

    /// Layer `l`'s K and V storage.
    pub fn layer(&self, l: usize) -> (&Tensor, &Tensor) {
        (&self.k[l], &self.v[l])
    }

    /// Writes this step's keys and values (`[rows, kv_dim]` each) of layer `l` into their slots.
    pub fn write(&self, l: usize, k: &Tensor, v: &Tensor, runs: &[SlotRun]) -> Result<()> {
        for run in runs {
            self.k[l].slice_set(&k.narrow(0, run.row, run.len)?, 0, run.slot)?;
            self.v[l].slice_set(&v.narrow(0, run.row, run.len)?, 0, run.slot)?;
        }
        Ok(())
    }

    /// Bytes of one token's KV in the export format.
    pub fn bytes_per_token(&self) -> usize {
        self.k.len() * 2 * self.kv_dim * 4
    }

    fn check_block(&self, block: BlockId, filled: usize) -> std::result::Result<(), BackendError> {
        if block as usize >= self.total_blocks {
            return Err(BackendError::Invalid(format!(
                "block {block} is outside the pool of {}",
                self.total_blocks
            )));
        }
        if filled == 0 || filled > self.block_size {
            return Err(BackendError::Invalid(format!(
                "a block holds 1 to {} tokens, not {filled}",
                self.block_size
            )));
        }
        Ok(())
    }

    /// The first `filled` tokens of `block`, in the export format. On the CPU the rows are
    /// copied once, straight from the KV memory into the output (a block is
    /// `filled * kv_dim` consecutive floats per tensor); elsewhere through a host copy. The
    /// output's buffer is reused from an earlier export once that one's `Bytes` are dropped.
    pub fn export_block(
        &self,
        block: BlockId,
        filled: usize,
    ) -> std::result::Result<Bytes, BackendError> {
        self.check_block(block, filled)?;
        let start = block as usize * self.block_size * self.kv_dim;
        let len = filled * self.kv_dim;
        let mut out = self.exports.take(filled * self.bytes_per_token());
        for (k, v) in self.k.iter().zip(&self.v) {
            for t in [k, v] {
                append_rows(t, start, len, &mut out)?;
            }
        }
        Ok(self.exports.seal(out))
    }

    /// Writes exported bytes of `filled` tokens into `block`. Rejects a wrong length and
    /// non-finite values (what a real KV never holds) as corrupt. The bytes are checked in
    /// place and copied into the KV memory through one staging tensor per layer and K/V.
    pub fn import_block(
        &self,
        block: BlockId,
        filled: usize,
        data: &[u8],
    ) -> std::result::Result<(), BackendError> {
        self.check_block(block, filled)?;
        let expected = filled * self.bytes_per_token();
        if data.len() != expected {
            return Err(BackendError::Corrupt(format!(
                "{} bytes, expected {expected} for {filled} tokens",
                data.len()
            )));
        }
        if let Some((at, x)) = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .enumerate()
            .find(|(_, x)| !x.is_finite())
        {
            return Err(BackendError::Corrupt(format!(
                "value {at} is not finite ({x})"
            )));
        }
        let start = block as usize * self.block_size;
        let per = filled * self.kv_dim * 4;
        let device = self.k[0].device();
        for (l, chunk) in data.chunks_exact(2 * per).enumerate() {
            let (kd, vd) = chunk.split_at(per);
            for (store, d) in [(&self.k[l], kd), (&self.v[l], vd)] {
                let src = Tensor::from_raw_buffer(d, DType::F32, &[filled, self.kv_dim], device)
                    .map_err(compute)?;
                store.slice_set(&src, 0, start).map_err(compute)?;
            }
        }
        Ok(())
    }
}

/// Appends `len` floats of `t` from element `start` (of its contiguous storage) to `out`,
/// little-endian.
fn append_rows(
    t: &Tensor,
    start: usize,
    len: usize,
    out: &mut Vec<u8>,
) -> std::result::Result<(), BackendError> {
    #[cfg(target_endian = "little")]
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((offset, _))) =
            (&*storage, layout.contiguous_offsets())
        {
            let all = cpu.as_slice::<f32>().map_err(compute)?;
            let rows = &all[offset + start..offset + start + len];
            out.extend_from_slice(bytemuck::cast_slice(rows));
            return Ok(());
        }
    }
    let kv_dim = t.dim(1).map_err(compute)?;
    let rows = t
        .narrow(0, start / kv_dim, len / kv_dim)
        .and_then(|r| r.flatten_all())
        .and_then(|r| r.to_vec1::<f32>())
        .map_err(compute)?;
    out.extend(rows.iter().flat_map(|x| x.to_le_bytes()));
    Ok(())
}

/// A candle failure as a backend compute error.
pub(crate) fn compute(e: candle_core::Error) -> BackendError {
    BackendError::Compute(Box::new(e))
}

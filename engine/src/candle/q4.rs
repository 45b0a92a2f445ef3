//! Q4_1 matmul for x86 CPUs with AVX2, on the weights as a GGUF file stores them: 4-bit quants,
//! half the bytes of Q8_0 per weight. Decoding one sequence reads every weight once per token,
//! so it runs at the speed memory delivers them: Q8_0 re-quantized at load reads 1.9 times the
//! bytes of the file's Q4_1 (llama.cpp reads Q4_1 as stored, and led Dolphin's batch-1 decode on
//! an AVX-512 VNNI host by 25% in `bench/llama-peer`). candle has only a scalar Q4_1 kernel.
//!
//! Same structure as [`super::q8`]: weights repacked once into groups of [`ROWS`] rows, a tile of
//! [`ROWS`] rows by [`TOKENS`] tokens sharing every loaded block. The quants stay 4-bit, but two
//! blocks share 32 bytes (block `2p` in the low nibbles, `2p + 1` in the high ones, each in
//! element order), so a mask and a shift unpack them in place: the file's layout (elements `j`
//! and `j + 16` in one byte) needs a lane-crossing insert per block, which made the kernel 30%
//! slower than the Q8_0 one on compute-bound sizes. Scales and minimums stay the file's f16
//! (widened as they are used), each row's minimums in a row of their own. Activations are
//! quantized to Q8_1 (per block of 32: `d = max|x| / 127`, quants `round(x / d)`, and
//! `s = d * sum(quants)`), so one block's dot product is
//! `d_w * d_x * sum(q_w * q_x) + m_w * s_x` with `q_w` in 0..=15: AVX2's `maddubs` (unsigned by
//! signed bytes) takes it exactly, without the sign tricks Q8_0 needs.
//!
//! Each token's result is computed by the same operations in the same order whether it shares a
//! tile with another token or not, so batched, chunked and single-token steps agree bit for bit.
//!
//! On CPUs with AVX-512 VNNI the same layout runs through [`avx512`]: a block pair per register
//! and one `vpdpbusd` per pair, where AVX2 takes a `maddubs` and a `madd` per block.

mod avx512;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};
use core::arch::x86_64::{__m256, __m256i};
use pulp::x86::V3;
use std::ops::Range;

/// Values per block.
const BLOCK: usize = 32;
/// Bytes of one stored Q4_1 block: f16 scale, f16 minimum, 16 bytes of two quants each.
const BLOCK_BYTES: usize = 4 + BLOCK / 2;
/// Weight rows per tile.
const ROWS: usize = 4;
/// Tokens per tile (prefill chunks and batches; a row group's unpacked blocks serve them all).
const TOKENS: usize = 4;

/// A `[rows, k]` Q4_1 weight matrix repacked for the tiled kernel: rows in groups of [`ROWS`]
/// (the last padded with zero rows), blocks in pairs (an odd last block paired with a zero
/// block), each group's pairs interleaved pair by pair.
#[derive(Debug)]
pub(crate) struct Q4Matrix {
    /// Proof of AVX2 and FMA.
    simd: V3,
    /// Proof of AVX-512 VNNI, where the wider kernel runs.
    wide: Option<avx512::Avx512Vnni>,
    rows: usize,
    k: usize,
    /// `groups * pairs` entries: pair `p` of the group's rows, byte `j` holding element `j` of
    /// block `2p` (low nibble) and of block `2p + 1` (high nibble).
    qs: Vec<[[u8; BLOCK]; ROWS]>,
    /// The matching scales, f16 bits as the file stores them: `[block 2p, block 2p + 1]` per
    /// row. (As f32 they made a row of 576 weights 488 bytes instead of the file's 360, and
    /// batch-1 decode runs at the speed memory delivers them.)
    d: Vec<[[u16; ROWS]; 2]>,
    /// Each row's block minimums (f16 bits), row by row: `k / 32` per row.
    mins: Vec<u16>,
}

impl Q4Matrix {
    /// Repacks a Q4_1 tensor of shape `[rows, k]`; `None` for any other dtype or shape, or a CPU
    /// without AVX2 and FMA. With `wide`, it runs on AVX-512 VNNI where the CPU has it.
    pub fn from_qtensor(t: &QTensor, wide: bool) -> Result<Option<Q4Matrix>> {
        let &[rows, k] = t.shape().dims() else {
            return Ok(None);
        };
        let Some(simd) = V3::try_new() else {
            return Ok(None);
        };
        if t.dtype() != GgmlDType::Q4_1 || !k.is_multiple_of(BLOCK) || rows == 0 {
            return Ok(None);
        }
        let data = t.data()?;
        let kb = k / BLOCK;
        let pairs = kb.div_ceil(2);
        if data.len() != rows * kb * BLOCK_BYTES {
            candle_core::bail!("Q4_1 data of {} bytes for {rows} x {kb} blocks", data.len());
        }
        let groups = rows.div_ceil(ROWS);
        let mut qs = vec![[[0u8; BLOCK]; ROWS]; groups * pairs];
        let mut d = vec![[[0u16; ROWS]; 2]; groups * pairs];
        let mut mins = vec![0u16; rows * kb];
        let f16 = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
        for (row, blocks) in data.chunks_exact(kb * BLOCK_BYTES).enumerate() {
            let (g, i) = (row / ROWS, row % ROWS);
            for (b, block) in blocks.chunks_exact(BLOCK_BYTES).enumerate() {
                let (p, half) = (b / 2, b % 2);
                d[g * pairs + p][half][i] = f16(&block[0..2]);
                mins[row * kb + b] = f16(&block[2..4]);
                let shift = 4 * half;
                let dst = &mut qs[g * pairs + p][i];
                for (j, &byte) in block[4..].iter().enumerate() {
                    // The file's byte j holds elements j (low nibble) and j + 16 (high).
                    dst[j] |= (byte & 0x0f) << shift;
                    dst[j + BLOCK / 2] |= (byte >> 4) << shift;
                }
            }
        }
        Ok(Some(Q4Matrix {
            simd,
            wide: if wide {
                avx512::Avx512Vnni::try_new()
            } else {
                None
            },
            rows,
            k,
            qs,
            d,
            mins,
        }))
    }

    /// `x @ self^T`: `x` is `[m, k]` f32 (contiguous or not), the result `[m, rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (m, k) = x.dims2()?;
        if k != self.k {
            candle_core::bail!(
                "matmul of [{m}, {k}] by a [{}, {}] weight",
                self.rows,
                self.k
            );
        }
        let x = x.contiguous()?.to_dtype(candle_core::DType::F32)?;
        let acts = Q8_1::of(&x.flatten_all()?.to_vec1::<f32>()?, m, k);
        let mut out = vec![0f32; m * self.rows];
        let pool = candle_core::utils::barrier_pool();
        let threads = pool.n_workers() + 1;
        let groups = self.rows.div_ceil(ROWS);
        if threads <= 1 || groups < 2 * threads {
            let n = self.rows;
            self.compute(&acts, 0..groups, |t, r, v| out[t * n + r] = v);
        } else {
            let shared = parking_lot::Mutex::new(&mut out);
            pool.execute_chunked(groups, |range| {
                let first = (range.start * ROWS).min(self.rows);
                let width = (range.end * ROWS).min(self.rows) - first;
                let mut part = vec![0f32; m * width];
                self.compute(&acts, range, |t, r, v| part[t * width + r - first] = v);
                let mut out = shared.lock();
                for t in 0..m {
                    let row = t * self.rows + first;
                    out[row..row + width].copy_from_slice(&part[t * width..(t + 1) * width]);
                }
            });
        }
        Tensor::from_vec(out, (m, self.rows), x.device())
    }

    /// Every token against row groups `groups`; `put(token, row, value)` for the real rows.
    fn compute(&self, acts: &Q8_1, groups: Range<usize>, put: impl FnMut(usize, usize, f32)) {
        if let Some(wide) = self.wide {
            return wide.compute(self, acts, groups, put);
        }
        self.drive(
            acts,
            groups,
            put,
            |w, a| self.tile::<TOKENS>(w, a),
            |w, a| self.tile::<1>(w, a),
            |mins, s| min_term(self.simd, mins, s),
        );
    }

    /// The loop over row groups and token tiles, around one instruction set's tiles of
    /// [`TOKENS`] and of one token and its minimums' dot product. Inlined into its caller, so
    /// the AVX-512 path's closures are compiled with that path's features.
    #[inline(always)]
    fn drive(
        &self,
        acts: &Q8_1,
        groups: Range<usize>,
        mut put: impl FnMut(usize, usize, f32),
        tile: impl Fn(Weights<'_>, [Acts<'_>; TOKENS]) -> [[f32; TOKENS]; ROWS],
        tile_one: impl Fn(Weights<'_>, [Acts<'_>; 1]) -> [[f32; 1]; ROWS],
        min_term: impl Fn(&[u16], &[f32]) -> f32,
    ) {
        let kb = self.k / BLOCK;
        let pairs = kb.div_ceil(2);
        for g in groups {
            let w = (
                &self.qs[g * pairs..(g + 1) * pairs],
                &self.d[g * pairs..(g + 1) * pairs],
            );
            let real = ROWS.min(self.rows - g * ROWS);
            let mins = |i: usize| {
                let row = g * ROWS + i;
                &self.mins[row * kb..(row + 1) * kb]
            };
            let mut t = 0;
            let mut put_tile = |t: usize, sums: &[[f32; TOKENS]; ROWS], n: usize| {
                for (i, row) in sums.iter().enumerate().take(real) {
                    for (j, &v) in row.iter().enumerate().take(n) {
                        put(t + j, g * ROWS + i, v + min_term(mins(i), acts.s(t + j)));
                    }
                }
            };
            while t + TOKENS <= acts.m {
                let a = std::array::from_fn(|j| acts.token(t + j));
                put_tile(t, &tile(w, a), TOKENS);
                t += TOKENS;
            }
            // The rest one by one: each token's operations are the same in any tile width.
            while t < acts.m {
                let one = tile_one(w, [acts.token(t)]);
                let mut sums = [[0f32; TOKENS]; ROWS];
                for (dst, src) in sums.iter_mut().zip(one) {
                    dst[0] = src[0];
                }
                put_tile(t, &sums, 1);
                t += 1;
            }
        }
    }

    /// One row group against `N` tokens: `sum_b d_w * d_x * dot(q_w, q_x)` per row and token.
    #[inline(always)]
    fn tile<const N: usize>(&self, w: Weights<'_>, a: [Acts<'_>; N]) -> [[f32; N]; ROWS] {
        let v = self.simd;
        let zero = v.avx._mm256_setzero_ps();
        let mut acc = [[zero; N]; ROWS];
        for (p, (wq, wd)) in w.0.iter().zip(w.1).enumerate() {
            let wd = scales_of(*wd);
            let x: [[__m256i; 2]; N] = std::array::from_fn(|j| bytemuck::cast(a[j].0[p]));
            let dx: [[f32; 2]; N] = std::array::from_fn(|j| a[j].1[p]);
            for i in 0..ROWS {
                let q = unpack(v, wq[i]);
                for h in 0..2 {
                    for j in 0..N {
                        acc[i][j] = dot_add(v, q[h], x[j][h], wd[h][i] * dx[j][h], acc[i][j]);
                    }
                }
            }
        }
        acc.map(|row| row.map(|x| hsum(v, x)))
    }
}

/// Which instructions the tiles run on here, AVX-512 VNNI allowed (`wide`) or not: `"avx512vnni"`
/// or `"avx2"`.
pub(crate) fn isa(wide: bool) -> &'static str {
    if wide && avx512::Avx512Vnni::try_new().is_some() {
        "avx512vnni"
    } else {
        "avx2"
    }
}

/// An f16's value (exact as f32).
#[inline(always)]
fn f32_of(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// A group's quant block pairs and scales (f16 bits).
type Weights<'a> = (&'a [[[u8; BLOCK]; ROWS]], &'a [[[u16; ROWS]; 2]]);
/// A token's quant block pairs and scales.
type Acts<'a> = (&'a [[[i8; BLOCK]; 2]], &'a [[f32; 2]]);

/// A block pair's quants as bytes 0..=15: the low nibbles (block `2p`), the high ones (`2p+1`).
#[inline(always)]
fn unpack(v: V3, packed: [u8; BLOCK]) -> [__m256i; 2] {
    let raw: __m256i = bytemuck::cast(packed);
    let mask = v.avx._mm256_set1_epi8(0x0f);
    [
        v.avx2._mm256_and_si256(raw, mask),
        v.avx2
            ._mm256_and_si256(v.avx2._mm256_srli_epi16::<4>(raw), mask),
    ]
}

/// `acc + d * dot(q, x)` for one block: unsigned quants by signed ones, summed in i16 pairs
/// (at most 2 * 15 * 127, no overflow), then i32 pairs, then converted.
#[inline(always)]
fn dot_add(v: V3, q: __m256i, x: __m256i, d: f32, acc: __m256) -> __m256 {
    let pairs = v.avx2._mm256_maddubs_epi16(q, x);
    let ones = v.avx._mm256_set1_epi16(1);
    let dot = v
        .avx
        ._mm256_cvtepi32_ps(v.avx2._mm256_madd_epi16(ones, pairs));
    v.fma._mm256_fmadd_ps(v.avx._mm256_set1_ps(d), dot, acc)
}

/// The sum of a vector's lanes.
#[inline(always)]
fn hsum(v: V3, x: __m256) -> f32 {
    let hi = v.avx._mm256_extractf128_ps::<1>(x);
    let res = v.sse._mm_add_ps(hi, v.avx._mm256_castps256_ps128(x));
    let res = v.sse._mm_add_ps(res, v.sse._mm_movehl_ps(res, res));
    v.sse
        ._mm_cvtss_f32(v.sse._mm_add_ss(res, v.sse3._mm_movehdup_ps(res)))
}

/// `sum_b m_w[b] * s_x[b]`: the minimums' share of a row's dot product with a token, 8 lanes
/// at a time and the last `kb % 8` one by one.
#[inline(always)]
fn min_term(v: V3, mins: &[u16], s: &[f32]) -> f32 {
    let (m8, m_rest) = mins.as_chunks::<8>();
    let (s8, s_rest) = s.as_chunks::<8>();
    let mut acc = v.avx._mm256_setzero_ps();
    for (m, s) in m8.iter().zip(s8) {
        acc = v.fma._mm256_fmadd_ps(f32x8_of(*m), bytemuck::cast(*s), acc);
    }
    hsum(v, acc) + min_term_scalar(m_rest, s_rest)
}

/// The minimums' share over blocks left after the SIMD chunks, one by one (both paths).
#[inline(always)]
fn min_term_scalar(mins: &[u16], s: &[f32]) -> f32 {
    mins.iter().zip(s).map(|(&m, s)| f32_of(m) * s).sum()
}

/// Eight f16s as f32 (exact; `half` converts them with one F16C instruction where the build
/// has it, as x86-64-v3 does).
#[inline(always)]
fn f32x8_of(bits: [u16; 8]) -> __m256 {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let mut out = [0f32; 8];
    bits.reinterpret_cast::<half::f16>()
        .convert_to_f32_slice(&mut out);
    bytemuck::cast(out)
}

/// A group pair's scales as f32.
#[inline(always)]
fn scales_of(bits: [[u16; ROWS]; 2]) -> [[f32; ROWS]; 2] {
    bytemuck::cast(f32x8_of(bytemuck::cast(bits)))
}

/// Activations quantized to Q8_1: per block `d = max|x| / 127`, quants `round(x / d)` and
/// `s = d * sum(quants)`; blocks in pairs like the weights' (an odd last one paired with zeros).
struct Q8_1 {
    m: usize,
    /// Block pairs per token.
    pairs: usize,
    /// Blocks per token.
    kb: usize,
    qs: Vec<[[i8; BLOCK]; 2]>,
    d: Vec<[f32; 2]>,
    s: Vec<f32>,
}

impl Q8_1 {
    fn of(x: &[f32], m: usize, k: usize) -> Q8_1 {
        let kb = k / BLOCK;
        let pairs = kb.div_ceil(2);
        let mut qs = vec![[[0i8; BLOCK]; 2]; m * pairs];
        let mut d = vec![[0f32; 2]; m * pairs];
        let mut s = vec![0f32; m * kb];
        for (t, token) in x.chunks_exact(k).enumerate() {
            for (b, block) in token.chunks_exact(BLOCK).enumerate() {
                let amax = block.iter().fold(0f32, |a, &v| a.max(v.abs()));
                let scale = amax / 127.0;
                let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
                let q = &mut qs[t * pairs + b / 2][b % 2];
                let mut sum = 0i32;
                for (dst, &v) in q.iter_mut().zip(block) {
                    *dst = (v * inv).round() as i8;
                    sum += i32::from(*dst);
                }
                d[t * pairs + b / 2][b % 2] = scale;
                s[t * kb + b] = scale * sum as f32;
            }
        }
        Q8_1 {
            m,
            pairs,
            kb,
            qs,
            d,
            s,
        }
    }

    /// Token `t`'s block pairs.
    fn token(&self, t: usize) -> Acts<'_> {
        let r = t * self.pairs..(t + 1) * self.pairs;
        (&self.qs[r.clone()], &self.d[r])
    }

    /// Token `t`'s block sums.
    fn s(&self, t: usize) -> &[f32] {
        &self.s[t * self.kb..(t + 1) * self.kb]
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};
    use proptest::prelude::*;

    use super::*;

    /// A deterministic `[rows, cols]` matrix with values in about [-2, 2] and some exact zeros.
    fn matrix(rows: usize, cols: usize, seed: u32) -> Tensor {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                if h.is_multiple_of(17) {
                    0.0
                } else {
                    (h % 4001) as f32 / 1000.0 - 2.0
                }
            })
            .collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).expect("tensor")
    }

    fn flat(t: Tensor) -> Vec<f32> {
        t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("vec")
    }

    /// The tiled result, candle's Q4_1 result (its scalar kernel on the same weights) and the
    /// exact product of the dequantized weights with `x`.
    fn three(
        rows: usize,
        k: usize,
        m: usize,
        seed: u32,
        wide: bool,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let w = QTensor::quantize(&matrix(rows, k, seed), GgmlDType::Q4_1).expect("quantize");
        let exact_w = w.dequantize(&Device::Cpu).expect("dequantize");
        let tiled = Q4Matrix::from_qtensor(&w, wide)
            .expect("repack")
            .expect("q4_1");
        let candle = QMatMul::from_qtensor(w).expect("qmatmul");
        let x = matrix(m, k, seed ^ 0x5bd1);
        let got = flat(tiled.forward(&x).expect("tiled"));
        let want = flat(candle.forward(&x).expect("candle"));
        let exact = flat(x.matmul(&exact_w.t().expect("t")).expect("matmul"));
        (got, want, exact)
    }

    /// The largest |a - b| over the outputs, relative to the largest |exact| (a row's typical
    /// magnitude: single outputs may cancel to near zero).
    fn err(a: &[f32], b: &[f32], exact: &[f32]) -> f32 {
        let scale = exact.iter().fold(1e-6f32, |s, v| s.max(v.abs()));
        a.iter().zip(b).fold(0f32, |e, (x, y)| e.max((x - y).abs())) / scale
    }

    #[test]
    fn matches_candle_and_the_exact_product_on_model_shapes() {
        for wide in [false, true] {
            for (rows, k) in [(960, 576), (576, 1536)] {
                for m in [1, 8, 33] {
                    let (got, want, exact) = three(rows, k, m, 7, wide);
                    // Both quantize the activations to 8 bits (candle through f16 scales): they
                    // differ from each other and from the exact product by that rounding alone.
                    assert!(err(&got, &want, &exact) < 1e-2, "{rows}x{k} m={m} {wide}");
                    assert!(err(&got, &exact, &exact) < 1e-2, "{rows}x{k} m={m} {wide}");
                }
            }
        }
    }

    /// Where the CPU has AVX-512 VNNI, the wide path computes the AVX2 path's products (the
    /// same integer dot products and scales) and differs only in the order of the float sums.
    #[test]
    fn the_wide_path_agrees_with_the_avx2_path() {
        if isa(true) != "avx512vnni" {
            println!("skipped: this CPU has no AVX-512 VNNI, both paths are the AVX2 one");
            return;
        }
        for (rows, k, m) in [(960, 576, 1), (576, 1536, 9), (7, 96, 5)] {
            let w = QTensor::quantize(&matrix(rows, k, 11), GgmlDType::Q4_1).expect("quantize");
            let x = matrix(m, k, 13);
            let out = |wide| {
                let tiled = Q4Matrix::from_qtensor(&w, wide)
                    .expect("repack")
                    .expect("q4_1");
                flat(tiled.forward(&x).expect("forward"))
            };
            let (narrow, wide) = (out(false), out(true));
            assert!(err(&narrow, &wide, &narrow) < 1e-5, "{rows}x{k} m={m}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn close_to_exact_on_any_tile_remainder(
            rows in 1usize..11,
            blocks in 1usize..5,
            m in 1usize..6,
            seed in any::<u32>(),
            wide in any::<bool>(),
        ) {
            let k = blocks * BLOCK;
            let w = QTensor::quantize(&matrix(rows, k, seed), GgmlDType::Q4_1).expect("quantize");
            let exact_w = w.dequantize(&Device::Cpu).expect("dequantize");
            let tiled = Q4Matrix::from_qtensor(&w, wide).expect("repack").expect("q4_1");
            let x = matrix(m, k, seed ^ 0x5bd1);
            let got = flat(tiled.forward(&x).expect("tiled"));
            let exact = flat(x.matmul(&exact_w.t().expect("t")).expect("matmul"));
            // Odd block counts too (a pair padded with a zero block), where candle's own Q4_1
            // kernel refuses to run (it asserts an even count).
            prop_assert!(err(&got, &exact, &exact) < 2e-2);
        }

        #[test]
        fn a_token_gets_the_same_bits_alone_or_in_a_batch(
            rows in 1usize..9,
            blocks in 1usize..4,
            m in 2usize..6,
            seed in any::<u32>(),
            wide in any::<bool>(),
        ) {
            let k = blocks * BLOCK;
            let w = QTensor::quantize(&matrix(rows, k, seed), GgmlDType::Q4_1).expect("quantize");
            let tiled = Q4Matrix::from_qtensor(&w, wide).expect("repack").expect("q4_1");
            let x = matrix(m, k, seed ^ 3);
            let batch = flat(tiled.forward(&x).expect("batch"));
            for t in 0..m {
                let one = flat(tiled.forward(&x.narrow(0, t, 1).expect("row")).expect("one"));
                for (r, v) in one.iter().enumerate() {
                    prop_assert_eq!(v.to_bits(), batch[t * rows + r].to_bits());
                }
            }
        }
    }

    #[test]
    fn other_dtypes_and_shapes_are_left_to_candle() {
        let w = QTensor::quantize(&matrix(4, 64, 1), GgmlDType::Q8_0).expect("quantize");
        assert!(
            Q4Matrix::from_qtensor(&w, true)
                .expect("no error")
                .is_none()
        );
        let w = QTensor::quantize(&matrix(4, 64, 1), GgmlDType::Q4_1).expect("quantize");
        let tiled = Q4Matrix::from_qtensor(&w, true)
            .expect("repack")
            .expect("q4_1");
        assert!(
            tiled.forward(&matrix(2, 32, 1)).is_err(),
            "wrong inner size"
        );
    }

    /// Time per matmul, candle's Q4_1 against the tiled kernel on AVX2 and on the widest
    /// instructions here, at SmolLM2's shapes: a
    /// measurement. `cargo test --release -p dolphin-engine --features candle --lib --
    /// --ignored --nocapture q4_speed`.
    #[test]
    #[ignore = "a measurement; run by hand"]
    fn q4_speed() {
        for (rows, k) in [(960, 576), (3072, 576), (576, 1536), (49152, 576)] {
            let w = QTensor::quantize(&matrix(rows, k, 3), GgmlDType::Q4_1).expect("quantize");
            let tiled = Q4Matrix::from_qtensor(&w, false)
                .expect("repack")
                .expect("q4_1");
            let wide = Q4Matrix::from_qtensor(&w, true)
                .expect("repack")
                .expect("q4_1");
            let candle = QMatMul::from_qtensor(w).expect("qmatmul");
            for m in [1, 8, 128] {
                let x = matrix(m, k, 5);
                let reps = (2_000_000 / (rows * m)).clamp(3, 2000);
                let time = |f: &dyn Fn() -> Tensor| {
                    f();
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        std::hint::black_box(f());
                    }
                    t.elapsed().as_secs_f64() * 1e6 / reps as f64
                };
                let c = time(&|| candle.forward(&x).expect("candle"));
                let q = time(&|| tiled.forward(&x).expect("tiled"));
                let v = time(&|| wide.forward(&x).expect("wide"));
                println!(
                    "{rows}x{k} m={m}: candle {c:.1} us, tiled avx2 {q:.1} us ({:.2}x), \
                     tiled {} {v:.1} us ({:.2}x)",
                    c / q,
                    isa(true),
                    c / v
                );
            }
        }
    }
}

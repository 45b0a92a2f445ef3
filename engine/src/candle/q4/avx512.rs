//! The Q4_1 tile on AVX-512 with VNNI. A block pair's 64 quants fill one register (block `2p`'s
//! in the low half, `2p + 1`'s in the high one), so one `vpdpbusd` per (row, token, pair) does
//! what AVX2 needs a `maddubs` and a `madd` per block for, and the two blocks' scales are applied
//! by one multiply and one FMA on 16 lanes. The minimums' share is a 16-lane dot product (8 on
//! the AVX2 path).
//!
//! Like the AVX2 tile, each token's result is computed by the same operations in the same order
//! in any tile width, so a token gets the same bits alone or in a batch. The two paths do not
//! agree bit for bit with each other (the lanes are summed in another order), so every process
//! on one machine runs the same one: the widest the CPU has.

use core::arch::x86_64::{
    __m128i, __m256i, __m512, _mm_castsi128_ps, _mm_cvtsi64_si128, _mm256_cvtph_ps,
    _mm256_srli_epi16, _mm512_add_epi32, _mm512_and_si512, _mm512_castps128_ps512,
    _mm512_castps256_ps512, _mm512_castsi256_si512, _mm512_cvtepi32_ps, _mm512_cvtph_ps,
    _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_inserti64x4, _mm512_mul_ps, _mm512_mullo_epi32,
    _mm512_permutexvar_ps, _mm512_reduce_add_ps, _mm512_set1_epi8, _mm512_set1_epi32,
    _mm512_setr_epi32, _mm512_setzero_ps, _mm512_setzero_si512,
};
use std::ops::Range;

use super::{Acts, Q4Matrix, Q8_1, ROWS, TOKENS, Weights};

/// Proof that this CPU has AVX-512 F, BW, VL and VNNI.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx512Vnni(());

impl Avx512Vnni {
    /// `Some` where every instruction this kernel uses exists.
    pub fn try_new() -> Option<Avx512Vnni> {
        let has = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni");
        has.then_some(Avx512Vnni(()))
    }

    /// [`Q4Matrix::compute`] on these instructions.
    pub fn compute(
        self,
        matrix: &Q4Matrix,
        acts: &Q8_1,
        groups: Range<usize>,
        put: impl FnMut(usize, usize, f32),
    ) {
        // The one unsafe call: a function compiled for AVX-512 runs only where `self` proves the
        // CPU has it (`try_new` is the only constructor).
        #[allow(unsafe_code)]
        // SAFETY: `compute` enables exactly the features `try_new` detected.
        unsafe {
            compute(matrix, acts, groups, put)
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn compute(
    matrix: &Q4Matrix,
    acts: &Q8_1,
    groups: Range<usize>,
    put: impl FnMut(usize, usize, f32),
) {
    // Closures defined here are compiled with this function's features.
    matrix.drive(
        acts,
        groups,
        put,
        |w, a| tile::<TOKENS>(w, a),
        |w, a| tile::<1>(w, a),
        |mins, s| min_term(mins, s),
    );
}

/// One row group against `N` tokens: `sum_p (d_w * d_x) . dot(q_w, q_x)` on 16 lanes, 8 per
/// block of the pair, then the lanes' sum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn tile<const N: usize>(w: Weights<'_>, a: [Acts<'_>; N]) -> [[f32; N]; ROWS] {
    // No closures in here (`from_fn`, `map`): they were not inlined into this function.
    let mask = _mm512_set1_epi8(0x0f);
    // Lanes 0-7 take a pair's first scale, 8-15 its second: row i's are at i and ROWS + i of
    // the group's scales, a token's at 0 and 1.
    let halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let first_row = _mm512_mullo_epi32(halves, _mm512_set1_epi32(ROWS as i32));
    let mut rows = [first_row; ROWS];
    for (i, r) in rows.iter_mut().enumerate() {
        *r = _mm512_add_epi32(first_row, _mm512_set1_epi32(i as i32));
    }
    let mut acc = [[_mm512_setzero_ps(); N]; ROWS];
    let mut x = [_mm512_setzero_si512(); N];
    let mut dx = [_mm512_setzero_ps(); N];
    for (p, (wq, wd)) in w.0.iter().zip(w.1).enumerate() {
        for j in 0..N {
            x[j] = bytemuck::cast(a[j].0[p]);
            let pair = bytemuck::cast::<[f32; 2], i64>(a[j].1[p]);
            let pair = _mm512_castps128_ps512(_mm_castsi128_ps(_mm_cvtsi64_si128(pair)));
            dx[j] = _mm512_permutexvar_ps(halves, pair);
        }
        let wd = _mm512_castps256_ps512(_mm256_cvtph_ps(bytemuck::cast::<_, __m128i>(*wd)));
        for i in 0..ROWS {
            let raw: __m256i = bytemuck::cast(wq[i]);
            let q =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(raw), _mm256_srli_epi16::<4>(raw));
            let q = _mm512_and_si512(q, mask);
            let d = _mm512_permutexvar_ps(rows[i], wd);
            for j in 0..N {
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x[j]);
                acc[i][j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, dx[j]), acc[i][j]);
            }
        }
    }
    let mut out = [[0f32; N]; ROWS];
    for i in 0..ROWS {
        for j in 0..N {
            out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
        }
    }
    out
}

/// `sum_b m_w[b] * s_x[b]`: 16 lanes at a time, the last `kb % 16` one by one (copying them
/// into a zeroed register's worth cost a `memcpy` call per row and token).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn min_term(mins: &[u16], s: &[f32]) -> f32 {
    let (m16, m_rest) = mins.as_chunks::<LANES>();
    let (s16, s_rest) = s.as_chunks::<LANES>();
    let mut acc = _mm512_setzero_ps();
    for (m, s) in m16.iter().zip(s16) {
        let m = _mm512_cvtph_ps(bytemuck::cast::<_, __m256i>(*m));
        acc = _mm512_fmadd_ps(m, bytemuck::cast::<_, __m512>(*s), acc);
    }
    _mm512_reduce_add_ps(acc) + super::min_term_scalar(m_rest, s_rest)
}

/// f32 lanes of a register.
const LANES: usize = 16;

//! One matmul of the model: candle's `QMatMul`, or on x86 CPUs with AVX2 the tiled kernels: Q8_0
//! ([`super::q8`], same results as candle's bit for bit, several times fewer block loads) and
//! Q4_1 ([`super::q4`], the 4-bit weights as the file stores them; candle's Q4_1 is scalar).

use candle_core::quantized::QMatMul;
use candle_core::{Module, Result, Tensor};

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
use super::{q4::Q4Matrix, q8::Q8Matrix};

/// Which formats go to the tiled kernels (the rest stay with candle).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TiledKernels {
    /// Q8_0 weights.
    pub q8: bool,
    /// Q4_1 weights.
    pub q4: bool,
    /// AVX-512 VNNI for the Q4_1 kernel where the CPU has it (else AVX2).
    pub wide: bool,
}

/// A weight matrix `[rows, k]`; `forward` computes `x @ w^T`.
#[derive(Debug)]
pub(crate) enum Linear {
    /// candle's kernels (every format, every device).
    Candle(QMatMul),
    /// Q8_0 weights through the tiled AVX2 kernel.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    TiledQ8(Q8Matrix),
    /// Q4_1 weights through the tiled AVX2 kernel.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    TiledQ4(Q4Matrix),
}

impl Linear {
    /// Wraps `m`, moving Q8_0 and Q4_1 weights to the tiled kernels as `tiled` says (other
    /// formats, and builds without AVX2, stay with candle).
    pub fn new(m: QMatMul, tiled: TiledKernels) -> Result<Linear> {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        if tiled.q8
            && let QMatMul::QTensor(t) = &m
            && let Some(q8) = Q8Matrix::from_qtensor(t)?
        {
            return Ok(Linear::TiledQ8(q8));
        }
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        if tiled.q4
            && let QMatMul::QTensor(t) = &m
            && let Some(q4) = Q4Matrix::from_qtensor(t, tiled.wide)?
        {
            return Ok(Linear::TiledQ4(q4));
        }
        let _ = tiled;
        Ok(Linear::Candle(m))
    }

    /// `x @ w^T` for `x` of `[m, k]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Candle(m) => m.forward(x),
            #[cfg(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma"
            ))]
            Self::TiledQ8(m) => m.forward(x),
            #[cfg(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma"
            ))]
            Self::TiledQ4(m) => m.forward(x),
        }
    }
}

/// Whether the tiled kernel exists in this build.
pub(crate) const TILED_BUILT: bool = cfg!(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
));

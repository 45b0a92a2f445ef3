//! One matmul of the model: candle's `QMatMul`, or on x86 CPUs with AVX2 and no VNNI the tiled
//! Q8_0 kernel of [`super::q8`] (same results bit for bit, several times fewer block loads).

use candle_core::quantized::QMatMul;
use candle_core::{Module, Result, Tensor};

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
use super::q8::Q8Matrix;

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
}

impl Linear {
    /// Wraps `m`, moving Q8_0 weights to the tiled kernel when `tiled` (other formats, and
    /// builds without AVX2, stay with candle).
    pub fn new(m: QMatMul, tiled: bool) -> Result<Linear> {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        if tiled
            && let QMatMul::QTensor(t) = &m
            && let Some(q8) = Q8Matrix::from_qtensor(t)?
        {
            return Ok(Linear::TiledQ8(q8));
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
        }
    }
}

/// Whether the tiled kernel exists in this build.
pub(crate) const TILED_BUILT: bool = cfg!(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
));

//! `CandleConfig`: which model, how its weights are held, how much KV memory, which device.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::linear::TiledKernels;

/// How weights are held in memory after loading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightFormat {
    /// The default: a Q4_1 file's own weights where the tiled Q4_1 kernel runs (x86 CPUs with
    /// AVX2; its AVX-512 VNNI path where the CPU has it): closer to the file's exact weights
    /// than Q8_0 and ahead of it on batch-1 decode, which reads every weight per token. Q8_0
    /// elsewhere. [`CandleConfig::resolved`] decides, from the file.
    #[default]
    Auto,
    /// As stored in the file (Q4_1 for SmolLM2: Dolphin's tiled kernel; candle's is scalar).
    Keep,
    /// Re-quantized to Q8_0 at load: candle has SIMD kernels for it.
    Q8_0,
    /// Re-quantized to Q4_K (needs inner dimensions that are multiples of 256: padding on).
    Q4K,
    /// Dequantized to f32 (exact reference, four times the memory of Q8_0).
    F32,
}

impl WeightFormat {
    /// The name used by flags: `auto`, `keep`, `q8_0`, `q4k`, `f32`.
    pub fn as_str(self) -> &'static str {
        match self {
            WeightFormat::Auto => "auto",
            WeightFormat::Keep => "keep",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q4K => "q4k",
            WeightFormat::F32 => "f32",
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`WeightFormat`] / [`DeviceKind`] / [`Padding`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} (expected {expected})")]
pub struct ParseConfigError {
    what: &'static str,
    value: String,
    expected: &'static str,
}

impl FromStr for WeightFormat {
    type Err = ParseConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(WeightFormat::Auto),
            "keep" => Ok(WeightFormat::Keep),
            "q8_0" | "q8" => Ok(WeightFormat::Q8_0),
            "q4k" | "q4_k" => Ok(WeightFormat::Q4K),
            "f32" => Ok(WeightFormat::F32),
            _ => Err(ParseConfigError {
                what: "weight format",
                value: s.into(),
                expected: "auto, keep, q8_0, q4k or f32",
            }),
        }
    }
}

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU (candle's own thread pool; see [`super::configure_threads`]).
    #[default]
    Cpu,
    /// An NVIDIA GPU by ordinal; needs the crate's `cuda` feature.
    Cuda(usize),
}

impl FromStr for DeviceKind {
    type Err = ParseConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseConfigError {
            what: "device",
            value: s.into(),
            expected: "cpu, cuda or cuda:N",
        };
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" => Ok(DeviceKind::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceKind::Cuda)
                .ok_or_else(err),
        }
    }
}

/// Zero-padding of the inner dimension of matmuls whose input is the hidden state (576 for
/// SmolLM2) up to a multiple of 256: candle's fast x86 kernels (AVX512-VNNI / AVX-VNNI, repacked
/// Q8_0 and Q4_K) only take such sizes. Padding adds zero columns to weights and activations, so
/// it does not change the result beyond the activations' quantization grouping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Padding {
    /// On for quantized weights on an x86 CPU with VNNI, off otherwise.
    #[default]
    Auto,
    /// Never pad.
    Off,
    /// Always pad (tests use it to run the padded path anywhere).
    On,
}

impl FromStr for Padding {
    type Err = ParseConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Padding::Auto),
            "off" | "false" | "no" => Ok(Padding::Off),
            "on" | "true" | "yes" => Ok(Padding::On),
            _ => Err(ParseConfigError {
                what: "padding mode",
                value: s.into(),
                expected: "auto, on or off",
            }),
        }
    }
}

/// Everything a candle engine is made of.
#[derive(Clone, Debug)]
pub struct CandleConfig {
    /// A llama-architecture GGUF file.
    pub model_path: PathBuf,
    /// The file's tokenizer, where the caller has read it already (the worker does, for the
    /// model's stop tokens); `None`: the engine reads it from `model_path` for structured
    /// output's token space.
    pub tokenizer: Option<Arc<dolphin_tokenizer::ModelTokenizer>>,
    /// Served model name.
    pub model: String,
    /// How weights are held after loading.
    pub weights: WeightFormat,
    /// Inner-dimension padding for the fast kernels.
    pub padding: Padding,
    /// Where the model runs.
    pub device: DeviceKind,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV memory in bytes; the pool has `kv_bytes / (kv_bytes_per_token * block_size)` blocks.
    pub kv_bytes: u64,
    /// Tokens per step (decode tokens plus prefill chunks).
    pub max_batched_tokens: u32,
    /// Most prefill tokens of one sequence per step (0: no cap beyond the budget).
    pub prefill_chunk_tokens: u32,
    /// Most prefill tokens in a step that also decodes (0: no cap beyond the budget).
    pub mixed_prefill_tokens: u32,
    /// Requests that may wait for admission.
    pub max_waiting: u32,
    /// The order requests are admitted and prefilled in.
    pub policy: crate::SchedulingPolicy,
    /// Compute threads; `None`: `DOLPHIN_THREADS`, else 1 (see [`super::configure_threads`]).
    pub threads: Option<usize>,
    /// Caps the context length below the model's (`None`: the model's).
    pub max_context: Option<u32>,
    /// Early exit: run only the first `layers` transformer layers, then the final norm and the
    /// output head (`None`: all). A small model for token-level handoffs cut from the large
    /// one, sharing its tokenizer by construction.
    pub layers: Option<u32>,
    /// Which kernels run the quantized matmuls on the CPU.
    pub matmul: MatmulKernel,
}

/// The CPU kernels of quantized matmuls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulKernel {
    /// The tiled kernels for Q4_1 weights (candle's is scalar; on AVX-512 VNNI CPUs their wide
    /// variant) and for Q8_0 where candle's repacked VNNI kernels cannot run (no VNNI, or an
    /// inner dimension left unpadded); candle's elsewhere.
    #[default]
    Auto,
    /// candle's own (for Q8_0: on VNNI CPUs its repacked kernels, on AVX2 one dot product per
    /// row and token; for Q4_1 a scalar loop).
    Candle,
    /// The tiled kernels wherever the build has them (Q4_1 on AVX-512 VNNI where the CPU has it).
    Tiled,
    /// The tiled kernels on AVX2 instructions only, even where the CPU has AVX-512: what an
    /// AVX2-only CPU runs, measured on this one.
    TiledAvx2,
}

impl std::str::FromStr for MatmulKernel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "candle" => Ok(Self::Candle),
            "tiled" => Ok(Self::Tiled),
            "tiled-avx2" => Ok(Self::TiledAvx2),
            other => Err(format!(
                "unknown matmul kernel {other:?} (auto, candle, tiled, tiled-avx2)"
            )),
        }
    }
}

impl std::fmt::Display for MatmulKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Candle => "candle",
            Self::Tiled => "tiled",
            Self::TiledAvx2 => "tiled-avx2",
        })
    }
}

/// Default KV memory: 512 MiB, about 11.6k tokens of SmolLM2-135M.
pub const DEFAULT_KV_BYTES: u64 = 512 << 20;

impl CandleConfig {
    /// Defaults around a model file: served as the file's stem, Q8_0 weights, automatic
    /// padding, CPU, blocks of 16 tokens, 512 MiB of KV, 256 tokens per step, 256 waiting.
    /// (256 SmolLM2 tokens take about 0.85 s on one core: every running sequence's next token
    /// waits for the step, so steps stay short.)
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        let model_path = model_path.into();
        let model = model_path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        Self {
            model_path,
            model,
            weights: WeightFormat::default(),
            padding: Padding::default(),
            device: DeviceKind::default(),
            block_size: dolphin_cluster::DEFAULT_BLOCK_SIZE as u32,
            kv_bytes: DEFAULT_KV_BYTES,
            max_batched_tokens: 256,
            prefill_chunk_tokens: 0,
            mixed_prefill_tokens: 0,
            max_waiting: 256,
            policy: crate::SchedulingPolicy::Fcfs,
            threads: None,
            max_context: None,
            layers: None,
            matmul: MatmulKernel::default(),
            tokenizer: None,
        }
    }

    /// This config with [`WeightFormat::Auto`] decided for its model file (read for its tensor
    /// index): the file's own weights where its layers are Q4_1 and the tiled Q4_1 kernel runs
    /// here, Q8_0 otherwise. Other formats are left as they are.
    pub fn resolved(&self) -> Result<CandleConfig, super::LoadError> {
        let mut cfg = self.clone();
        if cfg.weights != WeightFormat::Auto {
            return Ok(cfg);
        }
        cfg.weights = WeightFormat::Q8_0;
        if cfg.tiled_q4_isa().is_some() {
            let (content, _) = super::weights::read_content(&cfg.model_path)?;
            let q4_1 = content
                .tensor_infos
                .get("blk.0.attn_q.weight")
                .is_some_and(|t| t.ggml_dtype == candle_core::quantized::GgmlDType::Q4_1);
            if q4_1 {
                cfg.weights = WeightFormat::Keep;
            }
        }
        Ok(cfg)
    }

    /// Whether matmul inner dimensions are padded to multiples of 256 under this config (a
    /// [`resolved`](Self::resolved) one: `Auto` counts as not padded).
    pub fn pads(&self) -> bool {
        match self.padding {
            Padding::On => true,
            Padding::Off => false,
            Padding::Auto => {
                self.device == DeviceKind::Cpu
                    && matches!(self.weights, WeightFormat::Q8_0 | WeightFormat::Q4K)
                    && cpu_has_vnni()
            }
        }
    }

    /// Which quantized matmuls run on the tiled AVX2 kernels under this config.
    pub(crate) fn tiled(&self) -> TiledKernels {
        let cpu = super::linear::TILED_BUILT && self.device == DeviceKind::Cpu;
        TiledKernels {
            q8: cpu
                && match self.matmul {
                    // candle's repacked VNNI kernels need the padded inner dimension;
                    // unpadded, candle runs its one-row-one-token kernel.
                    MatmulKernel::Auto => !cpu_has_vnni() || !self.pads(),
                    MatmulKernel::Candle => false,
                    MatmulKernel::Tiled | MatmulKernel::TiledAvx2 => true,
                },
            q4: cpu && self.matmul != MatmulKernel::Candle,
            wide: self.matmul != MatmulKernel::TiledAvx2,
        }
    }

    /// Whether the Q8_0 matmuls run on the tiled AVX2 kernel under this config.
    pub fn tiled_q8(&self) -> bool {
        self.tiled().q8
    }

    /// Whether Q4_1 matmuls (`--weights keep` on a Q4_1 file) run on the tiled kernel.
    pub fn tiled_q4(&self) -> bool {
        self.tiled().q4
    }

    /// The instructions of the tiled Q4_1 kernel here (`"avx512vnni"`, `"avx2"`); `None` where
    /// Q4_1 stays with candle.
    pub fn tiled_q4_isa(&self) -> Option<&'static str> {
        let tiled = self.tiled();
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        if tiled.q4 {
            return Some(super::q4::isa(tiled.wide));
        }
        let _ = tiled;
        None
    }

    /// Blocks of KV memory for a model with `bytes_per_token` of KV per token.
    pub fn total_blocks(&self, bytes_per_token: u64) -> u64 {
        self.kv_bytes / (bytes_per_token * u64::from(self.block_size)).max(1)
    }
}

/// Whether candle's repacked x86 Q8_0 / Q4_K kernels can run here.
pub(crate) fn cpu_has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512bw"))
            || (std::arch::is_x86_feature_detected!("avxvnni")
                && std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

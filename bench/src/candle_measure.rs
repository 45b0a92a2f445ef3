//! The measurement settings `engine_candle` (the engine alone) and `cluster_candle` (the same
//! model through router and workers) share, so their numbers line up.

/// Prompt and output sizes, batch and runs of a candle measurement.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct CandleMeasure {
    /// Prompt tokens for the prefill measurements.
    #[arg(long, default_value_t = 512)]
    pub prefill_tokens: usize,
    /// Tokens generated per sequence in the decode measurements.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: u32,
    /// Prompt tokens of each decoding sequence.
    #[arg(long, default_value_t = 32)]
    pub decode_prompt: usize,
    /// Sequences decoding together in the batched measurement.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Runs of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
}

//! Tests of the candle engine: tiny random-weight models written by the tests (fast), and
//! SmolLM2-135M when it is present (`scripts/fetch-model.sh`).

mod engine_tests;
mod model_tests;
mod smollm2;
pub(crate) mod tiny;

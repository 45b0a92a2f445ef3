//! A synthetic request log whose output lengths depend on what is known at admission: a few
//! prompt templates (prefix families) each ask for a typical answer length, `max_tokens` caps
//! it, and lengths are noisy. For tests and demonstrations of the learning code.

use dolphin_router::dolphin::Admission;
use dolphin_router::policy::{Decision, Features};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::log::LogRecord;

/// Typical output length of each template.
pub const TEMPLATE_OUTPUT: [u32; 6] = [16, 24, 200, 300, 1500, 2500];
const MAX_TOKENS: [u32; 4] = [64, 512, 2048, 4096];

/// `n` requests, reproducible from `seed`.
pub fn log(n: usize, seed: u64) -> Vec<LogRecord> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let templates: Vec<Vec<u32>> = (0..TEMPLATE_OUTPUT.len())
        .map(|_| (0..24).map(|_| rng.random_range(3..99)).collect())
        .collect();
    (0..n)
        .map(|_| {
            let t = rng.random_range(0..templates.len());
            let isl = (rng.random_range(5.0f64..9.0).exp()) as usize;
            let mut tokens = templates[t].clone();
            tokens
                .extend((tokens.len()..isl.max(tokens.len())).map(|_| rng.random_range(3u32..99)));
            let max_tokens = MAX_TOKENS[rng.random_range(0..MAX_TOKENS.len())];
            let typical = f64::from(TEMPLATE_OUTPUT[t]) * rng.random_range(0.6..1.4);
            let out = (typical as u32).clamp(1, max_tokens);
            let isl = tokens.len() as u32;
            let cached = (f64::from(isl) * rng.random_range(0.0..0.9)) as u32;
            LogRecord {
                features: Features {
                    isl,
                    eff_isl_prefill: isl - cached / 2,
                    eff_isl_decode: isl - cached,
                    output_len_hint: max_tokens.min(512),
                },
                admission: Some(Admission::new(&tokens, max_tokens).to_record()),
                prompt_tokens: isl,
                completion_tokens: out,
                outcome: "ok".into(),
                decision: Some(Decision::Remote),
                path: None,
                slo_met: Some(rng.random_bool(0.8)),
            }
        })
        .collect()
}

//! Token sampling from logits: logit bias, the minimum output length, bad words, allowed
//! tokens, repetition, presence and frequency penalties, the output's format (structured
//! output), then greedy or temperature with top-k, min-p and top-p; seeded. Also the log probabilities a request asks for, of its
//! tokens and of its prompt's, from the raw logits.
//!
//! The randomness of each draw is a function of the request's seed and the position of the
//! token being drawn (not a stream advanced draw by draw), and the penalties and the format
//! read the tokens fed to the model (not the ones this sampler drew), so a sequence whose first
//! token was sampled on a prefill worker, or by the other model of a group, or before the
//! request moved here, continues exactly as it would have locally.

use std::collections::{HashMap, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use dolphin_grammar::{Constrained, GrammarError};

use super::backend::invalid;
use crate::error::BackendError;
use crate::types::{LogitRules, Sampling, TokenLogprobs, TokenStats};

/// One sequence's sampling state.
#[derive(Debug)]
pub(crate) struct Sampler {
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
    seed: u64,
    rules: LogitRules,
    /// Tokens that cannot be drawn before `min_tokens` outputs: end of sequence and stops.
    end_tokens: Vec<u32>,
    min_tokens: u32,
    /// Where the output starts: the prompt's length less the output an earlier worker
    /// generated (`Sampling::output_in_prompt`).
    prompt_len: u32,
    /// The prompt's last tokens that are output (`Sampling::output_in_prompt`).
    output_in_prompt: u32,
    /// The format the output follows, where the request names one.
    format: Option<Follow>,
    /// The text so far, kept only when a penalty reads it.
    history: Option<History>,
    /// The output's last tokens, kept only when a bad word of several tokens reads them.
    tail: Option<Tail>,
    /// (scaled logit, token) candidates, reused between draws.
    scratch: Vec<(f32, u32)>,
    /// The logits after the rules, reused between draws.
    adjusted: Vec<f32>,
    /// Report log probabilities with this many alternatives (`Sampling::logprobs`).
    logprobs: Option<u32>,
    /// The prompt's log probabilities, while they are computed (`Sampling::prompt_logprobs`).
    prompt_scores: Option<PromptScores>,
}

/// A prompt's log probabilities, gathered chunk by chunk until the first token is drawn.
#[derive(Debug)]
struct PromptScores {
    /// Alternatives per position.
    k: u32,
    /// The prompt (position `p`'s logits score token `p + 1`).
    prompt: Vec<u32>,
    /// One entry per prompt position scored so far, from position 0.
    scores: Vec<TokenLogprobs>,
}

/// A format being followed: what has been read of the output, and a failure to go on.
#[derive(Debug)]
struct Follow {
    constraint: Constrained,
    /// Output positions below this are read.
    seen: u32,
    /// Why the format cannot go on (a token it refuses, a mask it cannot compute): the
    /// sequence's next draw fails with it.
    failed: Option<GrammarError>,
    /// Tokens the output must have before the format starts (a reasoning model's
    /// `</think>`); empty: from the first token.
    gate: Vec<u32>,
    /// How many of the gate's tokens the output's last tokens match (all: the format has
    /// started).
    matched: usize,
}

impl Follow {
    /// Whether the format has started: draws are masked and tokens read.
    fn started(&self) -> bool {
        self.matched == self.gate.len()
    }

    fn read(&mut self, token: u32) {
        if !self.started() {
            // The gate is a tag of a token or a few, none repeating its own start.
            self.matched = if token == self.gate[self.matched] {
                self.matched + 1
            } else {
                usize::from(token == self.gate[0])
            };
            return;
        }
        if self.failed.is_none()
            && let Err(e) = self.constraint.consume(token)
        {
            self.failed = Some(e);
        }
    }
}

/// What the penalties read: the prompt's distinct tokens and the output's token counts.
#[derive(Debug, Default)]
struct History {
    /// Sorted, distinct (read by the repetition penalty only).
    prompt: Vec<u32>,
    output: HashMap<u32, u32>,
    /// Output positions below this are counted.
    seen: u32,
}

/// The output's last tokens, as many as the longest bad word less one.
#[derive(Debug)]
struct Tail {
    keep: usize,
    tokens: VecDeque<u32>,
    /// Output positions below this are kept.
    seen: u32,
}

impl Tail {
    fn push(&mut self, token: u32) {
        if self.tokens.len() == self.keep {
            self.tokens.pop_front();
        }
        self.tokens.push_back(token);
    }

    /// Whether the output ends with `tokens`.
    fn ends_with(&self, tokens: &[u32]) -> bool {
        tokens.len() <= self.tokens.len()
            && self
                .tokens
                .iter()
                .rev()
                .zip(tokens.iter().rev())
                .all(|(a, b)| a == b)
    }
}

impl Sampler {
    /// A sampler for `s` with no text yet; `fallback_seed` is used when the request names no
    /// seed.
    pub fn new(s: &Sampling, fallback_seed: u64) -> Sampler {
        Sampler {
            temperature: s.temperature,
            top_k: s.top_k.map(|k| k.get() as usize),
            top_p: s.top_p.filter(|&p| p > 0.0 && p < 1.0),
            seed: s.seed.unwrap_or(fallback_seed),
            rules: s.logits.clone(),
            end_tokens: s.stop_token_ids.clone(),
            min_tokens: s.min_tokens,
            prompt_len: 0,
            output_in_prompt: s.output_in_prompt,
            format: None,
            history: s.logits.needs_history().then(History::default),
            tail: match s.logits.bad_word_context() {
                0 => None,
                keep => Some(Tail {
                    keep,
                    tokens: VecDeque::with_capacity(keep),
                    seen: 0,
                }),
            },
            scratch: Vec::new(),
            adjusted: Vec::new(),
            logprobs: s.logprobs,
            prompt_scores: s.prompt_logprobs.map(|k| PromptScores {
                k,
                prompt: Vec::new(),
                scores: Vec::new(),
            }),
        }
    }

    /// Draws under `constraint` (the request's format, compiled for this model), from the
    /// token after the output has `gate` (at once when it is empty).
    pub fn following(mut self, constraint: Constrained, gate: Vec<u32>) -> Sampler {
        self.format = Some(Follow {
            constraint,
            seen: 0,
            failed: None,
            gate,
            matched: 0,
        });
        self
    }

    /// Prompt positions in `position..position + len` whose logits score a prompt token (every
    /// prompt position but the last), where the request asked for the prompt's log
    /// probabilities; empty otherwise. They must come in order from position 0.
    pub fn prompt_rows(
        &self,
        position: u32,
        len: u32,
    ) -> Result<std::ops::Range<u32>, BackendError> {
        let Some(p) = &self.prompt_scores else {
            return Ok(0..0);
        };
        let last = (p.prompt.len() as u32).saturating_sub(1);
        let rows = position.max(p.scores.len() as u32)..(position + len).min(last);
        if rows.start < rows.end && position > p.scores.len() as u32 {
            return Err(BackendError::Invalid(format!(
                "prompt log probabilities need every prompt position computed; position {position} came after {}",
                p.scores.len()
            )));
        }
        Ok(rows)
    }

    /// Scores the prompt token after `position` from that position's `logits`.
    pub fn score_prompt(&mut self, position: u32, logits: &[f32]) {
        let Some(p) = &mut self.prompt_scores else {
            return;
        };
        if position as usize != p.scores.len() {
            return;
        }
        let Some(&next) = p.prompt.get(position as usize + 1) else {
            return;
        };
        p.scores.push(token_logprobs(
            logits,
            next,
            p.k as usize,
            &mut self.scratch,
        ));
    }

    /// The prompt's log probabilities gathered so far (taken once, with the first token).
    pub fn take_prompt_scores(&mut self) -> Vec<TokenLogprobs> {
        self.prompt_scores
            .as_mut()
            .map(|p| std::mem::take(&mut p.scores))
            .unwrap_or_default()
    }

    /// The drawn `token`'s log probabilities from the raw `logits` of its step, where the
    /// request asked for them.
    pub fn logprobs(&mut self, logits: &[f32], token: u32) -> Option<Box<TokenLogprobs>> {
        let k = self.logprobs?;
        Some(Box::new(token_logprobs(
            logits,
            token,
            k as usize,
            &mut self.scratch,
        )))
    }

    /// Sets the sequence the sampler draws for: its prompt, the output it already has, how many
    /// of its leading tokens are computed (never fed again), and the model's end-of-sequence
    /// token, which `min_tokens` masks (`None` where the request ignores it).
    pub fn for_text(
        mut self,
        prompt: &[u32],
        output: &[u32],
        computed: u32,
        eos: Option<u32>,
    ) -> Sampler {
        // At least one prompt token stays the prompt's (the wire's check, kept here too).
        let carried = self
            .output_in_prompt
            .min((prompt.len() as u32).saturating_sub(1));
        self.prompt_len = prompt.len() as u32 - carried;
        self.end_tokens.extend(eos);
        if let Some(p) = &mut self.prompt_scores {
            p.prompt = prompt.to_vec();
        }
        let prompt_len = self.prompt_len;
        // The output so far, from the first output position; what is computed is never fed
        // again, so it is read now.
        let text = || prompt.iter().chain(output).skip(prompt_len as usize);
        let read_now = computed.saturating_sub(prompt_len) as usize;
        if let Some(h) = &mut self.history {
            if self.rules.repetition_penalty.is_some() {
                h.prompt = prompt[..prompt_len as usize].to_vec();
                h.prompt.sort_unstable();
                h.prompt.dedup();
            }
            h.seen = prompt_len.max(computed);
            for &t in text().take(read_now) {
                *h.output.entry(t).or_default() += 1;
            }
        }
        if let Some(tail) = &mut self.tail {
            tail.seen = prompt_len.max(computed);
            for &t in text().take(read_now) {
                tail.push(t);
            }
        }
        if let Some(f) = &mut self.format {
            f.seen = prompt_len.max(computed);
            for &t in text().take(read_now) {
                f.read(t);
            }
        }
        self
    }

    /// Notes `tokens`, fed to the model from `position` on: those past the prompt, not seen
    /// before, count as output.
    pub fn observe(&mut self, position: u32, tokens: &[u32]) {
        if let Some(f) = &mut self.format {
            for (pos, &t) in (position..).zip(tokens) {
                if pos >= f.seen {
                    f.read(t);
                    f.seen = pos + 1;
                }
            }
        }
        if let Some(tail) = &mut self.tail {
            for (pos, &t) in (position..).zip(tokens) {
                if pos >= tail.seen {
                    tail.push(t);
                    tail.seen = pos + 1;
                }
            }
        }
        let Some(h) = &mut self.history else {
            return;
        };
        for (pos, &t) in (position..).zip(tokens) {
            if pos >= h.seen {
                *h.output.entry(t).or_default() += 1;
                h.seen = pos + 1;
            }
        }
    }

    /// Whether this sampler always takes the most likely token.
    pub fn is_greedy(&self) -> bool {
        // NaN or non-positive temperatures are greedy too.
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == Some(1)
    }

    /// Picks the token at `position` from `logits`. `Ok(Err(_))`: the request cannot go on (its
    /// format refuses a token that was fed or cannot compute its mask, or its rules leave no
    /// token to draw); that sequence alone fails, where an `Err` fails the step.
    pub fn sample(
        &mut self,
        logits: &[f32],
        position: u32,
    ) -> Result<Result<u32, BackendError>, BackendError> {
        if logits.is_empty() || logits.iter().any(|x| x.is_nan()) {
            return Err(BackendError::Compute("logits are empty or NaN".into()));
        }
        if let Some(e) = self.format.as_ref().and_then(|f| f.failed.clone()) {
            return Ok(Err(invalid(e)));
        }
        // A complete format leaves only the end of sequence, whatever `min_tokens` says.
        let complete = self
            .format
            .as_ref()
            .is_some_and(|f| f.started() && f.constraint.is_stopped());
        let mask_ends = position.saturating_sub(self.prompt_len) < self.min_tokens
            && !self.end_tokens.is_empty()
            && !complete;
        // Before its gate the format masks nothing.
        let masking = self.format.as_ref().is_some_and(Follow::started);
        if self.rules.is_empty() && !mask_ends && !masking {
            return self.draw(logits, position).map(Ok);
        }
        let mut adjusted = std::mem::take(&mut self.adjusted);
        adjusted.clear();
        adjusted.extend_from_slice(logits);
        self.apply_rules(&mut adjusted, mask_ends);
        if let Some(f) = &mut self.format
            && f.started()
            && let Err(e) = f.constraint.mask(&mut adjusted)
        {
            self.adjusted = adjusted;
            f.failed = Some(e.clone());
            return Ok(Err(invalid(e)));
        }
        if adjusted.iter().all(|l| *l == f32::NEG_INFINITY) {
            self.adjusted = adjusted;
            return Ok(Err(BackendError::Invalid(
                "no token may be drawn: the request's allowed_token_ids, bad_words, min_tokens and format leave none".into(),
            )));
        }
        let token = self.draw(&adjusted, position);
        self.adjusted = adjusted;
        token.map(Ok)
    }

    /// The bias, the end tokens' mask, the bad words, the allowed tokens, then the penalties,
    /// in place.
    fn apply_rules(&self, logits: &mut [f32], mask_ends: bool) {
        for &(t, bias) in &self.rules.bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
        let mut mask = |t: u32| {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        };
        if mask_ends {
            self.end_tokens.iter().for_each(|&t| mask(t));
        }
        for word in &self.rules.bad_words {
            if let Some((&last, before)) = word.split_last()
                && (before.is_empty() || self.tail.as_ref().is_some_and(|t| t.ends_with(before)))
            {
                mask(last);
            }
        }
        if !self.rules.allowed.is_empty() {
            // Sorted: one walk beside the logits.
            let mut allowed = self.rules.allowed.iter().peekable();
            for (id, l) in logits.iter_mut().enumerate() {
                if allowed.next_if_eq(&&(id as u32)).is_none() {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let Some(h) = &self.history else {
            return;
        };
        if let Some(r) = self.rules.repetition_penalty {
            let output_only = h
                .output
                .keys()
                .filter(|t| h.prompt.binary_search(t).is_err());
            for &t in h.prompt.iter().chain(output_only) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
        let (presence, frequency) = (self.rules.presence_penalty, self.rules.frequency_penalty);
        if presence != 0.0 || frequency != 0.0 {
            for (&t, &n) in &h.output {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= presence + frequency * n as f32;
                }
            }
        }
    }

    /// Greedy, or a draw at the temperature from the candidates top-k, min-p and top-p keep.
    fn draw(&mut self, logits: &[f32], position: u32) -> Result<u32, BackendError> {
        if logits.iter().all(|l| *l == f32::NEG_INFINITY) {
            return Err(BackendError::Compute(
                "no token may be drawn: every logit is masked".into(),
            ));
        }
        if self.is_greedy() {
            return Ok(argmax(logits));
        }
        let t = self.temperature;
        let c = &mut self.scratch;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (l / t, i as u32)));
        if let Some(k) = self.top_k
            && k < c.len()
        {
            c.select_nth_unstable_by(k - 1, likelier_first);
            c.truncate(k);
        }
        if self.top_p.is_some() || self.top_k.is_some() {
            c.sort_unstable_by(likelier_first);
        }
        let max = c.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.0));
        for x in c.iter_mut() {
            x.0 = (x.0 - max).exp();
        }
        // Relative to the most likely token, whose weight is now 1.
        if let Some(min_p) = self.rules.min_p {
            c.retain(|x| x.0 >= min_p);
        }
        let total: f64 = c.iter().map(|x| f64::from(x.0)).sum();
        let mut keep = c.len();
        if let Some(p) = self.top_p {
            let target = f64::from(p) * total;
            let mut acc = 0.0;
            for (i, x) in c.iter().enumerate() {
                acc += f64::from(x.0);
                if acc >= target {
                    keep = i + 1;
                    break;
                }
            }
        }
        let kept = &c[..keep];
        let mass: f64 = kept.iter().map(|x| f64::from(x.0)).sum();
        let mut rng = StdRng::seed_from_u64(draw_seed(self.seed, position));
        let mut u = rng.random::<f64>() * mass;
        for x in kept {
            u -= f64::from(x.0);
            if u < 0.0 {
                return Ok(x.1);
            }
        }
        // Rounding left a sliver past the last candidate.
        Ok(kept[keep - 1].1)
    }
}

/// Statistics of `softmax(logits)` for the drawn `token`: its probability, the entropy in nats
/// and the top-2 margin. One pass for the maximum and the top two, one for the normalizer and
/// the entropy sum: `H = log Z - sum(p_i * (l_i - max))`, with `Z = sum(exp(l_i - max))`.
pub(crate) fn token_stats(logits: &[f32], token: u32) -> TokenStats {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in logits {
        if x > first {
            second = first;
            first = x;
        } else if x > second {
            second = x;
        }
    }
    if !first.is_finite() {
        return TokenStats::default();
    }
    let (mut z, mut weighted) = (0.0f64, 0.0f64);
    for &x in logits {
        let d = f64::from(x - first);
        let e = d.exp();
        if e > 0.0 {
            // Tokens at -inf (masked) weigh nothing (and 0 * -inf would be NaN).
            z += e;
            weighted += e * d;
        }
    }
    let p = |x: f32| (f64::from(x - first).exp() / z) as f32;
    let picked = logits.get(token as usize).copied().map_or(0.0, p);
    let second_p = if second.is_finite() { p(second) } else { 0.0 };
    TokenStats {
        prob: picked,
        entropy: (z.ln() - weighted / z).max(0.0) as f32,
        margin: p(first) - second_p,
    }
}

/// Log probabilities of `softmax(logits)` for the drawn `token` and the `k` most likely tokens
/// (most likely first, ties by lower id), and the token's rank: one pass for the maximum, one
/// for the normalizer and the rank, and a partial selection for the top `k` (`scratch` is
/// reused between calls).
pub(crate) fn token_logprobs(
    logits: &[f32],
    token: u32,
    k: usize,
    scratch: &mut Vec<(f32, u32)>,
) -> TokenLogprobs {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if !max.is_finite() {
        return TokenLogprobs::default();
    }
    let picked = logits.get(token as usize).copied();
    // Tokens more likely than the drawn one, counted in the normalizer's pass (one compare a
    // logit beside an exp).
    let (mut z, mut above) = (0f64, 0u32);
    let bar = picked.unwrap_or(f32::INFINITY);
    for &x in logits {
        z += f64::from(x - max).exp();
        above += u32::from(x > bar);
    }
    let log_z = max as f64 + z.ln();
    let lp = |x: f32| (f64::from(x) - log_z) as f32;
    let k = k.min(logits.len());
    let mut top = Vec::with_capacity(k);
    if k > 0 {
        scratch.clear();
        scratch.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        if k < scratch.len() {
            scratch.select_nth_unstable_by(k - 1, likelier_first);
        }
        scratch.truncate(k);
        scratch.sort_unstable_by(likelier_first);
        top.extend(scratch.iter().map(|&(l, id)| (id, lp(l))));
    }
    TokenLogprobs {
        logprob: picked.map_or(f32::NEG_INFINITY, lp),
        top,
        rank: if picked.is_some() { above + 1 } else { 0 },
    }
}

/// Orders (logit, token) candidates highest first, ties by lower id, so the order is total and
/// reproducible.
fn likelier_first(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Index of the largest logit (the first one on ties).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Seed of the draw at `position` (a SplitMix64 step over both).
fn draw_seed(seed: u64, position: u32) -> u64 {
    let mut z = seed ^ u64::from(position).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test shorthand: `top_k` 0 and `top_p` 1.0 mean off.
    fn sampling(temperature: f32, top_k: u32, top_p: f32, seed: Option<u64>) -> Sampling {
        Sampling {
            temperature,
            top_k: std::num::NonZeroU32::new(top_k),
            top_p: (top_p < 1.0).then_some(top_p),
            seed,
            ..Sampling::default()
        }
    }

    const LOGITS: [f32; 6] = [0.1, 2.0, 1.9, -1.0, 2.0, 0.5];

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(&Sampling::default(), 1);
        assert_eq!(s.pick(&LOGITS, 0).unwrap(), 1);
        let mut k1 = Sampler::new(&sampling(1.5, 1, 1.0, None), 7);
        assert_eq!(k1.pick(&LOGITS, 3).unwrap(), 1);
    }

    #[test]
    fn same_seed_and_position_give_the_same_token() {
        let mut a = Sampler::new(&sampling(1.0, 0, 1.0, Some(42)), 0);
        let mut b = Sampler::new(&sampling(1.0, 0, 1.0, Some(42)), 99);
        let xs: Vec<u32> = (0..64).map(|p| a.pick(&LOGITS, p).unwrap()).collect();
        // Drawing out of order gives the same tokens: draws depend on the position only.
        let mut ys: Vec<u32> = (0..64).rev().map(|p| b.pick(&LOGITS, p).unwrap()).collect();
        ys.reverse();
        assert_eq!(xs, ys);
        assert!(
            xs.iter().any(|&t| t != xs[0]),
            "a temperature-1 draw varies: {xs:?}"
        );
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let mut k2 = Sampler::new(&sampling(5.0, 2, 1.0, Some(3)), 0);
        for p in 0..200 {
            let t = k2.pick(&LOGITS, p).unwrap();
            assert!(t == 1 || t == 4, "top-2 drew {t}");
        }
        // The two tied leaders hold well over 10% of the mass: top-p 0.1 keeps only the first.
        let mut p01 = Sampler::new(&sampling(1.0, 0, 0.1, Some(3)), 0);
        for p in 0..50 {
            assert_eq!(p01.pick(&LOGITS, p).unwrap(), 1);
        }
    }

    #[test]
    fn temperature_follows_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let mut s = Sampler::new(&sampling(1.0, 0, 1.0, Some(11)), 0);
        let ones = (0..4000)
            .filter(|&p| s.pick(&logits, p).unwrap() == 1)
            .count();
        assert!((2800..3200).contains(&ones), "{ones} of 4000");
    }

    #[test]
    fn stats_match_the_softmax() {
        // Two tokens at ln 3 and 0: p = 0.75, 0.25.
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let s = token_stats(&logits, 1);
        assert!((s.prob - 0.75).abs() < 1e-6, "{s:?}");
        assert!((s.margin - 0.5).abs() < 1e-6, "{s:?}");
        let h = -(0.75f64 * 0.75f64.ln() + 0.25 * 0.25f64.ln());
        assert!((f64::from(s.entropy) - h).abs() < 1e-6, "{s:?}");
        let uniform = token_stats(&[1.0; 8], 3);
        assert!((f64::from(uniform.entropy) - 8f64.ln()).abs() < 1e-6);
        assert_eq!(uniform.margin, 0.0);
    }

    fn with_rules(rules: LogitRules) -> Sampling {
        Sampling {
            logits: rules,
            ..Sampling::default()
        }
    }

    #[test]
    fn logit_bias_moves_the_draw() {
        let bias = with_rules(LogitRules {
            bias: vec![(3, 10.0), (1, -5.0), (99, 1.0)],
            ..LogitRules::default()
        });
        let mut s = Sampler::new(&bias, 1);
        assert_eq!(s.pick(&LOGITS, 0).unwrap(), 3);
    }

    #[test]
    fn bad_words_ban_their_last_token_after_the_rest() {
        // Greedy over LOGITS takes 1, then 4 (tied), then 2.
        let rules = with_rules(LogitRules {
            bad_words: vec![vec![1], vec![5, 4], vec![0, 5, 2]],
            ..LogitRules::default()
        });
        let prompt = [5, 0, 5];
        // One token: never. After 5 (the prompt's last token, not output): 4 is still allowed.
        let mut s = Sampler::new(&rules, 1).for_text(&prompt, &[], 0, None);
        assert_eq!(s.pick(&LOGITS, 3).unwrap(), 4);
        // The output so far ends with 5: 4 is banned; with 0 5, so is 2.
        s.observe(3, &[5]);
        assert_eq!(s.pick(&LOGITS, 4).unwrap(), 2);
        s.observe(4, &[0, 5]);
        assert_eq!(s.pick(&LOGITS, 6).unwrap(), 5);
        // Output carried in the prompt (a migrated request) and computed output count too.
        let carried = Sampling {
            output_in_prompt: 2,
            ..rules.clone()
        };
        let mut s = Sampler::new(&carried, 1).for_text(&[7, 0, 5], &[], 3, None);
        assert_eq!(s.pick(&LOGITS, 3).unwrap(), 5);
        let mut s = Sampler::new(&rules, 1).for_text(&prompt, &[0, 5], 5, None);
        assert_eq!(s.pick(&LOGITS, 5).unwrap(), 5);
    }

    #[test]
    fn only_allowed_tokens_are_drawn() {
        let rules = LogitRules {
            allowed: vec![0, 3, 5],
            ..LogitRules::default()
        };
        let mut s = Sampler::new(&with_rules(rules.clone()), 1);
        assert_eq!(s.pick(&LOGITS, 0).unwrap(), 5);
        let mut hot = Sampler::new(
            &Sampling {
                temperature: 5.0,
                seed: Some(9),
                ..with_rules(rules.clone())
            },
            1,
        );
        for p in 0..200 {
            let t = hot.pick(&LOGITS, p).unwrap();
            assert!([0, 3, 5].contains(&t), "drew {t}");
        }
        // Rules that leave nothing fail the sequence, not the step.
        let none = with_rules(LogitRules {
            bad_words: vec![vec![0], vec![3], vec![5]],
            ..rules
        });
        let mut s = Sampler::new(&none, 1);
        match s.sample(&LOGITS, 0) {
            Ok(Err(BackendError::Invalid(m))) => assert!(m.contains("allowed_token_ids"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn end_tokens_wait_for_min_tokens() {
        // Token 1 is end of sequence, token 4 a stop token: both lead.
        let mut sampling = Sampling {
            min_tokens: 2,
            stop_token_ids: vec![4],
            ..Sampling::default()
        };
        let prompt = [0, 5, 5, 0];
        let mut s = Sampler::new(&sampling, 1).for_text(&prompt, &[], 0, Some(1));
        assert_eq!(s.pick(&LOGITS, 4).unwrap(), 2, "first output");
        assert_eq!(s.pick(&LOGITS, 5).unwrap(), 2, "second output");
        assert_eq!(s.pick(&LOGITS, 6).unwrap(), 1, "third: ends may be drawn");
        // Without an end-of-sequence token (ignore_eos) only the stop token waits.
        let mut s = Sampler::new(&sampling, 1).for_text(&prompt, &[], 0, None);
        assert_eq!(s.pick(&LOGITS, 4).unwrap(), 1);
        // Every token an end token: nothing may be drawn.
        sampling.stop_token_ids = (0..6).collect();
        let mut s = Sampler::new(&sampling, 1).for_text(&prompt, &[], 0, None);
        assert!(s.pick(&LOGITS, 4).is_err());
    }

    #[test]
    fn repetition_penalty_reads_prompt_and_output() {
        let rules = LogitRules {
            repetition_penalty: Some(4.0),
            ..LogitRules::default()
        };
        // Token 1 (2.0) in the prompt falls to 0.5, below token 4 (2.0).
        let mut s = Sampler::new(&with_rules(rules.clone()), 1).for_text(&[1, 1], &[], 0, None);
        assert_eq!(s.pick(&LOGITS, 2).unwrap(), 4);
        // Then token 4 is output too (fed at position 2): 2 (1.9) leads.
        s.observe(2, &[4]);
        assert_eq!(s.pick(&LOGITS, 3).unwrap(), 2);
        // A negative logit is multiplied: token 1 (-0.5) falls to -2.0, below token 0 (-1.0).
        let logits = [-1.0, -0.5, -3.0];
        let mut s = Sampler::new(&with_rules(rules), 1).for_text(&[1], &[], 0, None);
        assert_eq!(s.pick(&logits, 1).unwrap(), 0);
        let mut plain = Sampler::new(&Sampling::default(), 1);
        assert_eq!(plain.pick(&logits, 1).unwrap(), 1);
    }

    #[test]
    fn presence_and_frequency_penalties_count_the_output_once() {
        let frequency = with_rules(LogitRules {
            frequency_penalty: 0.06,
            ..LogitRules::default()
        });
        // Prompt tokens never count: token 1 stays first.
        let mut s = Sampler::new(&frequency, 1).for_text(&[1, 1, 1], &[], 0, None);
        assert_eq!(s.pick(&LOGITS, 3).unwrap(), 1);
        // Token 1 output once: 2.0 - 0.06 < 2.0 (token 4). Feeding the same position again
        // (a recomputed step) does not count it twice.
        s.observe(3, &[1]);
        s.observe(0, &[1, 1, 1, 1]);
        assert_eq!(s.pick(&LOGITS, 4).unwrap(), 4);
        // Then 4 once and 1 once: both at 1.94, still above 2 (1.9); the first maximum wins.
        s.observe(4, &[4]);
        assert_eq!(s.pick(&LOGITS, 5).unwrap(), 1);
        // 1 twice: 1.88 < 1.9.
        s.observe(5, &[1]);
        assert_eq!(s.pick(&LOGITS, 6).unwrap(), 4);
        // Output already there when the sequence starts (resumed, or handed over) counts too,
        // up to the computed tokens; the rest is counted when fed.
        let presence = with_rules(LogitRules {
            presence_penalty: 0.5,
            ..LogitRules::default()
        });
        let mut s = Sampler::new(&presence, 1).for_text(&[0, 0], &[1, 4, 2], 4, None);
        assert_eq!(
            s.pick(&LOGITS, 5).unwrap(),
            2,
            "1 and 4 counted, 2 not yet fed"
        );
        s.observe(4, &[2]);
        assert_eq!(s.pick(&LOGITS, 5).unwrap(), 1, "1 (1.5) above 2 (1.4)");
    }

    #[test]
    fn min_p_keeps_tokens_near_the_most_likely() {
        let at = |min_p: f32| {
            let mut sampling = with_rules(LogitRules {
                min_p: Some(min_p),
                ..LogitRules::default()
            });
            sampling.temperature = 1.0;
            sampling.seed = Some(5);
            let mut s = Sampler::new(&sampling, 1);
            let mut drawn: Vec<u32> = (0..400).map(|p| s.pick(&LOGITS, p).unwrap()).collect();
            drawn.sort_unstable();
            drawn.dedup();
            drawn
        };
        // exp(1.9 - 2.0) = 0.905: token 2 is kept at 0.9, not at 0.95.
        assert_eq!(at(0.9), vec![1, 2, 4]);
        assert_eq!(at(0.95), vec![1, 4]);
        assert_eq!(at(0.0), vec![0, 1, 2, 3, 4, 5]);
    }

    /// A format behind a gate: free draws until the output has the gate's tokens (a reasoning
    /// model's `</think>`), then masked ones; the same read from an output given at once.
    #[test]
    fn a_gated_format_starts_after_its_tokens() {
        use dolphin_grammar::{Format, TokenSpace, TokenText};
        // 0 `{`, 1 `}`, 2 `x`, 3 `</`, 4 `think>`, 5 the end.
        let mut tokens: Vec<TokenText> = ["{", "}", "x", "</", "think>"]
            .iter()
            .map(|t| TokenText::Bytes(t.as_bytes().to_vec()))
            .collect();
        tokens.push(TokenText::Special("<end>".into()));
        let space = TokenSpace::new(tokens, 6, &[5]).expect("space");
        let format = Format::Regex("[{][}]".into());
        let sampler = || {
            Sampler::new(&Sampling::default(), 1)
                .following(space.constrain(&format).expect("compiles"), vec![3, 4])
        };
        // `x` is the most likely token throughout.
        let logits = [1.0f32, 0.5, 3.0, 0.0, 0.0, 2.0];
        let draw = |s: &mut Sampler, pos: u32| s.sample(&logits, pos).unwrap().unwrap();
        let mut s = sampler().for_text(&[9, 9], &[], 2, Some(5));
        assert_eq!(draw(&mut s, 2), 2, "free before the gate");
        // `</` then `x` is not the gate.
        s.observe(2, &[2, 3, 2]);
        assert_eq!(draw(&mut s, 5), 2, "still free");
        s.observe(5, &[3, 4]);
        assert_eq!(draw(&mut s, 7), 0, "the format starts: `{{`");
        s.observe(7, &[0]);
        assert_eq!(draw(&mut s, 8), 1);
        s.observe(8, &[1]);
        assert_eq!(draw(&mut s, 9), 5, "complete: the end alone");
        // A sequence resumed with its output (computed already) reads it at once, gate and
        // format alike.
        let mut moved = sampler().for_text(&[9, 9], &[2, 3, 4, 0], 6, Some(5));
        assert_eq!(draw(&mut moved, 6), 1);
        // Without a gate the format starts at once.
        let mut plain = Sampler::new(&Sampling::default(), 1)
            .following(space.constrain(&format).expect("compiles"), Vec::new())
            .for_text(&[9, 9], &[], 2, Some(5));
        assert_eq!(draw(&mut plain, 2), 0);
    }

    #[test]
    fn nan_logits_are_an_error() {
        let mut s = Sampler::new(&Sampling::default(), 1);
        assert!(s.pick(&[0.0, f32::NAN], 0).is_err());
        assert!(s.pick(&[], 0).is_err());
    }

    impl Sampler {
        /// A draw of a sampler without a format.
        fn pick(&mut self, logits: &[f32], position: u32) -> Result<u32, BackendError> {
            self.sample(logits, position).and_then(|t| t)
        }

        fn logprobs_for(&mut self, logits: &[f32], k: usize) -> TokenLogprobs {
            token_logprobs(logits, 0, k, &mut self.scratch)
        }
    }

    #[test]
    fn logprobs_come_from_the_raw_logits_with_the_top_alternatives() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let lse = logits.iter().map(|&x| f64::from(x).exp()).sum::<f64>().ln() as f32;
        let mut sampling = with_rules(LogitRules {
            // The rules change the draw, not the reported distribution.
            bias: vec![(4, 50.0)],
            ..LogitRules::default()
        });
        sampling.logprobs = Some(3);
        let mut s = Sampler::new(&sampling, 1);
        let token = s.pick(&logits, 0).unwrap();
        assert_eq!(token, 4);
        let lp = s.logprobs(&logits, token).expect("asked for");
        assert!((lp.logprob - (-1.0 - lse)).abs() < 1e-5, "{lp:?}");
        // Most likely first, ties by lower id.
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!((lp.top[0].1 - (3.0 - lse)).abs() < 1e-5);
        assert!((lp.top[2].1 - (2.0 - lse)).abs() < 1e-5);
        // The least likely token but one: four tokens are likelier.
        assert_eq!(lp.rank, 5);
        assert_eq!(s.logprobs(&logits, 2).expect("asked for").rank, 3);
        assert_eq!(s.logprobs(&logits, 3).expect("asked for").rank, 1);
        // Normalized: the probabilities of every token add up to one.
        let all = s.logprobs_for(&logits, 5);
        let total: f32 = all.top.iter().map(|t| t.1.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        // Zero alternatives: the drawn token's alone; not asked: nothing.
        sampling.logprobs = Some(0);
        let mut s = Sampler::new(&sampling, 1);
        assert!(s.logprobs(&logits, 1).unwrap().top.is_empty());
        assert!(
            Sampler::new(&Sampling::default(), 1)
                .logprobs(&logits, 1)
                .is_none()
        );
    }

    #[test]
    fn the_prompt_is_scored_chunk_by_chunk_from_its_start() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let sampling = Sampling {
            prompt_logprobs: Some(1),
            ..Sampling::default()
        };
        let prompt = [3, 1, 2, 0];
        let mut s = Sampler::new(&sampling, 1).for_text(&prompt, &[], 0, None);
        // Positions 0 and 1 of a first chunk score tokens 1 and 2.
        assert_eq!(s.prompt_rows(0, 2).unwrap(), 0..2);
        s.score_prompt(0, &logits);
        s.score_prompt(1, &logits);
        // The last prompt position draws the first token instead.
        assert_eq!(s.prompt_rows(2, 2).unwrap(), 2..3);
        s.score_prompt(2, &logits);
        let scores = s.take_prompt_scores();
        let lse = logits.iter().map(|&x| x.exp()).sum::<f32>().ln();
        let want: Vec<f32> = [1, 2, 0].iter().map(|&t| logits[t] - lse).collect();
        let got: Vec<f32> = scores.iter().map(|l| l.logprob).collect();
        assert!(
            got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5),
            "{got:?}"
        );
        assert_eq!(scores[0].top.len(), 1);
        assert_eq!(scores[0].top[0].0, 3);
        assert!((scores[0].top[0].1 - (3.0 - lse)).abs() < 1e-5);
        assert!(s.prompt_rows(3, 1).unwrap().is_empty());
        // A chunk that starts past what was scored (a cached prefix) cannot be scored.
        let s = Sampler::new(&sampling, 1).for_text(&prompt, &[], 0, None);
        assert!(s.prompt_rows(2, 1).is_err());
        // Not asked: no rows.
        let s = Sampler::new(&Sampling::default(), 1).for_text(&prompt, &[], 0, None);
        assert!(s.prompt_rows(0, 4).unwrap().is_empty());
    }
}

//! `dolphinctl profile fit --worker ADDR`: the step grid measured on a running decode worker over
//! gRPC, from the timings the worker reports for each request (`Timings`, which start when the
//! request reaches the worker, so the network to it is left out), as Dynamo's profiler measures a
//! deployed engine from outside. It works for any engine a decode worker runs (on a GPU host too)
//! and includes what the worker adds to each step (planning, streaming), which an in-process fit
//! does not see.
//!
//! - **Prefill** of `t` tokens: the TTFT of one request with a fresh random prompt of `t` tokens
//!   (nothing cached) and `max_tokens` 1, on an otherwise idle worker: one step when `t` is at
//!   most the worker's per-request chunk; larger sizes are skipped.
//! - **Prefill after context** `c`: one long random prefix is prefilled once (untimed) and kept
//!   in the worker's prefix cache; a prompt of its first `c` tokens plus fresh ones then costs
//!   one chunk after `c` cached tokens. The context recorded is what the worker says it found
//!   cached, not what was intended.
//! - **Decode** at batch `b`: `b` concurrent requests whose prompts are a cached prefix plus one
//!   fresh token each, generating `--decode-tokens` tokens past their end of sequence; the step
//!   time is their TPOT (the worker's mean time per token after the first). Each sequence reads
//!   its whole context every step, as in the in-process fit, so a decode shape reads
//!   `b x context` tokens of KV whatever the prefix cache shares. Contexts come from the same
//!   prefix, so a grid of occupancies costs one long prefill, not one per shape.
//!
//! Mixed steps are not measured here (they are not fitted either). The worker must be idle:
//! other traffic lands in the measured steps.

use std::time::{SystemTime, UNIX_EPOCH};

use dolphin_engine::profile_fit::{FitGrid, StepSample, StepShape};
use dolphin_proto::v1;
use dolphin_proto::v1::decode_worker_client::DecodeWorkerClient;
use dolphin_proto::v1::worker_client::WorkerClient;
use futures::future::try_join_all;
use tonic::transport::Channel;

use super::ProfileError;
use crate::client;

/// Settings of a live measurement beyond the grid.
#[derive(Clone, Copy, Debug)]
pub struct LiveOptions {
    /// Tokens each decode request generates; its TPOT covers all but the first.
    pub decode_tokens: u32,
    /// Longest cached prefix prefilled for the context and decode shapes (a long one costs a
    /// long prefill: attention over the context grows with its square).
    pub max_prefix: u32,
}

/// What a live measurement found.
#[derive(Debug)]
pub struct Measured {
    /// The worker's `Info`.
    pub info: v1::WorkerInfo,
    /// Every measured shape.
    pub samples: Vec<StepSample>,
}

/// Measures `grid` on the decode worker at `url`, calling `progress` after each shape.
pub async fn measure(
    url: &str,
    grid: &FitGrid,
    opts: LiveOptions,
    mut progress: impl FnMut(&StepSample),
) -> Result<Measured, ProfileError> {
    let channel = client::channel(url).await.map_err(ProfileError::Connect)?;
    let info = WorkerClient::new(channel.clone())
        .info(v1::InfoRequest {})
        .await
        .map_err(|s| ProfileError::worker("Info", &s))?
        .into_inner();
    if info.role != v1::Role::Decode as i32 {
        return Err(ProfileError::Invalid(format!(
            "{url} is not a decode worker (role {}): profile a decode worker, which runs both \
             prefill and decode steps on the same engine",
            info.role
        )));
    }
    if info.block_size == 0 || info.total_blocks == 0 || info.vocab_size < 8 {
        return Err(ProfileError::Invalid(format!(
            "{url} reports no usable KV pool or vocabulary ({} blocks of {}, vocabulary {})",
            info.total_blocks, info.block_size, info.vocab_size
        )));
    }
    let mut probe = Probe {
        client: DecodeWorkerClient::new(channel),
        tokens: Tokens::new(info.vocab_size),
        next_id: 0,
        tag: format!("profile-fit-{}", std::process::id()),
        block_size: info.block_size,
        total_blocks: info.total_blocks,
        context_length: info.context_length,
        reps: grid.reps.max(1),
        warmup: grid.warmup,
    };
    let mut samples = Vec::new();
    let mut keep = |s: StepSample, out: &mut Vec<StepSample>| {
        progress(&s);
        out.push(s);
    };

    let chunk = one_step_prompt(&info);
    for &t in &grid.prefill_tokens {
        if t == 0 || t > chunk {
            eprintln!(
                "profile fit: prefill of {t} tokens skipped (one step computes at most {chunk})"
            );
            continue;
        }
        keep(probe.prefill(&[], t).await?, &mut samples);
    }

    let decode_tokens = opts.decode_tokens.max(2);
    let prefix_len = probe.prefix_len(opts.max_prefix, grid.context_chunk.max(decode_tokens));
    if prefix_len == 0 {
        eprintln!("profile fit: no room for a cached prefix; context and decode shapes skipped");
        return Ok(Measured { info, samples });
    }
    let prefix = probe.tokens.fresh(prefix_len);
    eprintln!("profile fit: prefilling a {prefix_len}-token prefix (untimed)");
    probe.warm(&prefix).await?;

    for &c in grid.prefill_context.iter().filter(|&&c| c > 0) {
        let c = c / probe.block_size * probe.block_size;
        if c == 0 || c > prefix_len || grid.context_chunk > chunk {
            eprintln!(
                "profile fit: prefill of {} after {c} cached tokens skipped (prefix {prefix_len}, \
                 one step computes at most {chunk})",
                grid.context_chunk
            );
            continue;
        }
        let s = probe
            .prefill(&prefix[..c as usize], grid.context_chunk)
            .await?;
        keep(s, &mut samples);
    }

    // The prefix back at the front of the cache before the decode shapes lean on it.
    probe.warm(&prefix).await?;
    for &batch in &grid.decode_batches {
        for &occupancy in &grid.occupancies {
            match probe.decode_context(batch, occupancy, decode_tokens, prefix_len) {
                Some(context) => keep(
                    probe
                        .decode(&prefix[..context as usize], batch, decode_tokens)
                        .await?,
                    &mut samples,
                ),
                None => eprintln!(
                    "profile fit: decode of {batch} at occupancy {occupancy} skipped (needs a \
                     context the {prefix_len}-token prefix or the pool cannot hold)"
                ),
            }
        }
    }
    Ok(Measured { info, samples })
}

/// The longest prompt the worker computes in one step: its per-request chunk, else its step
/// budget, within its context length.
fn one_step_prompt(info: &v1::WorkerInfo) -> u32 {
    let cap = [info.prefill_chunk_tokens, info.max_batched_tokens]
        .into_iter()
        .find(|&c| c > 0)
        .unwrap_or(u32::MAX);
    cap.min(info.context_length.saturating_sub(2).max(1))
}

/// One request's outcome as the worker reported it.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    /// Prompt tokens the worker found cached.
    cached: u32,
    /// Time to first token at the worker, ms.
    ttft_ms: f64,
    /// Mean time per token after the first, ms.
    tpot_ms: f64,
}

/// Sends the measured requests.
struct Probe {
    client: DecodeWorkerClient<Channel>,
    tokens: Tokens,
    next_id: u64,
    tag: String,
    block_size: u32,
    total_blocks: u32,
    context_length: u32,
    reps: u32,
    warmup: u32,
}

impl Probe {
    /// A prefill of `tokens` fresh tokens after `prefix` (cached or not): the median TTFT.
    async fn prefill(&mut self, prefix: &[u32], tokens: u32) -> Result<StepSample, ProfileError> {
        let len = prefix.len() as u32 + tokens;
        let mut runs = Vec::new();
        let mut cached = Vec::new();
        for run in 0..self.warmup + self.reps {
            let mut prompt = prefix.to_vec();
            prompt.extend(self.tokens.fresh(tokens));
            let o = self.one(prompt, 1).await?;
            if run >= self.warmup {
                runs.push(o.ttft_ms);
                cached.push(o.cached.min(len - 1));
            }
        }
        let context = median_u32(&mut cached);
        Ok(sample(
            StepShape::Prefill {
                tokens: len - context,
                context,
            },
            runs,
        ))
    }

    /// `batch` requests decoding `decode_tokens` each after `prefix` plus one fresh token: the
    /// median over runs of their median TPOT.
    async fn decode(
        &mut self,
        prefix: &[u32],
        batch: u32,
        decode_tokens: u32,
    ) -> Result<StepSample, ProfileError> {
        let mut runs = Vec::new();
        for run in 0..self.warmup + self.reps {
            let calls = (0..batch).map(|_| {
                let mut prompt = prefix.to_vec();
                prompt.extend(self.tokens.fresh(1));
                let id = self.id();
                one(self.client.clone(), id, prompt, decode_tokens)
            });
            let outcomes = try_join_all(calls.collect::<Vec<_>>()).await?;
            // A prefix evicted meanwhile would be prefilled again by every request, and those
            // prefills would land in the others' decode steps.
            if let Some(o) = outcomes.iter().find(|o| (o.cached as usize) < prefix.len()) {
                eprintln!(
                    "profile fit: warning: a decode request found {} of its {} prefix tokens \
                     cached; its batch's steps include prefill work",
                    o.cached,
                    prefix.len()
                );
            }
            if run >= self.warmup {
                let mut tpots: Vec<f64> = outcomes.iter().map(|o| o.tpot_ms).collect();
                runs.push(median(&mut tpots));
            }
        }
        // The mean context over the request's steps: the prompt, then one more token each step.
        let context = prefix.len() as u32 + 1 + decode_tokens / 2;
        let blocks_read = batch * (context + 1).div_ceil(self.block_size);
        Ok(sample(
            StepShape::Decode {
                batch,
                context,
                blocks_read,
            },
            runs,
        ))
    }

    /// Prefills `prefix` into the worker's prefix cache (untimed).
    async fn warm(&mut self, prefix: &[u32]) -> Result<(), ProfileError> {
        self.one(prefix.to_vec(), 1).await.map(drop)
    }

    /// The prefix to prefill once: at most `max_prefix` tokens, whole blocks, leaving room in
    /// the context for `tail` more tokens, and at most half the pool (the rest holds the
    /// measured requests' own blocks).
    fn prefix_len(&self, max_prefix: u32, tail: u32) -> u32 {
        let by_context = self.context_length.saturating_sub(tail + 2);
        let by_pool = self.total_blocks / 2 * self.block_size;
        max_prefix.min(by_context).min(by_pool) / self.block_size * self.block_size
    }

    /// The cached context (whole blocks of the prefix) that makes `batch` sequences decoding
    /// `decode_tokens` read `occupancy` of the pool per step, or `None` when it does not fit.
    fn decode_context(
        &self,
        batch: u32,
        occupancy: f64,
        decode_tokens: u32,
        prefix_len: u32,
    ) -> Option<u32> {
        if batch == 0 || !(occupancy > 0.0 && occupancy <= 1.0) {
            return None;
        }
        let per_seq = (occupancy * f64::from(self.total_blocks)).floor() / f64::from(batch);
        let tokens = (per_seq * f64::from(self.block_size)) as u32;
        let context =
            tokens.saturating_sub(2 + decode_tokens / 2) / self.block_size * self.block_size;
        // The prefix plus every sequence's own blocks (its fresh token and generated ones).
        let own = batch * (decode_tokens + 1).div_ceil(self.block_size).max(1) + batch;
        let fits = prefix_len / self.block_size + own <= self.total_blocks
            && context + 1 + decode_tokens <= self.context_length;
        (context > 0 && context <= prefix_len && fits).then_some(context)
    }

    fn id(&mut self) -> String {
        self.next_id += 1;
        format!("{}-{}", self.tag, self.next_id)
    }

    async fn one(&mut self, prompt: Vec<u32>, max_tokens: u32) -> Result<Outcome, ProfileError> {
        let id = self.id();
        one(self.client.clone(), id, prompt, max_tokens).await
    }
}

/// Runs one request to its end; what the worker reported.
async fn one(
    mut client: DecodeWorkerClient<Channel>,
    request_id: String,
    token_ids: Vec<u32>,
    max_tokens: u32,
) -> Result<Outcome, ProfileError> {
    let request = v1::DecodeRequest {
        request_id,
        token_ids,
        sampling: Some(v1::SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..Default::default()
        }),
        remote: None,
    };
    let mut stream = client
        .decode(request)
        .await
        .map_err(|s| ProfileError::worker("Decode", &s))?
        .into_inner();
    let mut last = None;
    while let Some(msg) = stream
        .message()
        .await
        .map_err(|s| ProfileError::worker("Decode", &s))?
    {
        if msg.timings.is_some() {
            last = Some(msg);
        }
    }
    let msg = last
        .ok_or_else(|| ProfileError::Measure("the worker's stream ended without timings".into()))?;
    if msg.finish_reason == v1::FinishReason::Error as i32 {
        return Err(ProfileError::Measure(
            "the worker ended a request with an error".into(),
        ));
    }
    let t = msg.timings.unwrap_or_default();
    Ok(Outcome {
        cached: msg.usage.map_or(0, |u| u.cached_tokens),
        ttft_ms: t.ttft_us as f64 / 1e3,
        tpot_ms: t.tpot_us as f64 / 1e3,
    })
}

fn sample(shape: StepShape, runs: Vec<f64>) -> StepSample {
    let mut sorted = runs.clone();
    StepSample {
        shape,
        ms: median(&mut sorted),
        runs_ms: runs,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn median_u32(v: &mut [u32]) -> u32 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Random token ids no cache has seen (xorshift, seeded by the clock and the process), away
/// from the low ids where tokenizers keep their special tokens.
struct Tokens {
    state: u64,
    low: u32,
    span: u32,
}

impl Tokens {
    fn new(vocab: u32) -> Self {
        let clock = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let low = (vocab / 16).min(256);
        Self {
            state: (clock ^ u64::from(std::process::id()).rotate_left(32)) | 1,
            low,
            span: vocab - low,
        }
    }

    fn fresh(&mut self, n: u32) -> Vec<u32> {
        (0..n)
            .map(|_| {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                self.low + (self.state % u64::from(self.span)) as u32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(total_blocks: u32, block_size: u32, context_length: u32) -> Probe {
        let channel = Channel::from_static("http://127.0.0.1:1").connect_lazy();
        Probe {
            client: DecodeWorkerClient::new(channel),
            tokens: Tokens::new(1000),
            next_id: 0,
            tag: "t".into(),
            block_size,
            total_blocks,
            context_length,
            reps: 1,
            warmup: 0,
        }
    }

    #[tokio::test]
    async fn decode_contexts_read_the_asked_share_of_the_pool() {
        let p = probe(728, 16, 8192);
        let prefix = p.prefix_len(2048, 256);
        assert_eq!(prefix, 2048);
        // 16 sequences at half the pool: 364 / 16 = 22.75 blocks each, 364 tokens; whole
        // blocks of the prefix below what 16 decode tokens add.
        let c = p.decode_context(16, 0.5, 16, prefix).expect("fits");
        assert_eq!(c % 16, 0);
        let read = 16 * (c + 1 + 8 + 1).div_ceil(16);
        let share = f64::from(read) / 728.0;
        assert!((share - 0.5).abs() < 0.05, "{c}: {share}");
        // One sequence at the whole pool would need a context past the prefix.
        assert_eq!(p.decode_context(1, 1.0, 16, prefix), None);
        assert_eq!(p.decode_context(0, 0.5, 16, prefix), None);
        assert_eq!(p.decode_context(4, 1.5, 16, prefix), None);
    }

    #[tokio::test]
    async fn the_prefix_fits_the_context_and_half_the_pool() {
        assert_eq!(probe(100, 16, 8192).prefix_len(4096, 256), 800);
        assert_eq!(probe(10_000, 16, 1000).prefix_len(4096, 256), 736);
        assert_eq!(probe(10_000, 16, 8192).prefix_len(1000, 256), 992);
    }

    #[test]
    fn one_step_prompts_follow_the_workers_limits() {
        let info = |chunk, budget, ctx| v1::WorkerInfo {
            prefill_chunk_tokens: chunk,
            max_batched_tokens: budget,
            context_length: ctx,
            ..Default::default()
        };
        assert_eq!(one_step_prompt(&info(256, 2048, 8192)), 256);
        assert_eq!(one_step_prompt(&info(0, 2048, 8192)), 2048);
        assert_eq!(one_step_prompt(&info(0, 0, 1000)), 998);
    }

    #[test]
    fn fresh_tokens_stay_in_the_vocabulary_and_do_not_repeat_a_prompt() {
        let mut t = Tokens::new(49_152);
        let a = t.fresh(64);
        let b = t.fresh(64);
        assert!(a.iter().chain(&b).all(|&x| (256..49_152).contains(&x)));
        assert_ne!(a, b);
    }
}

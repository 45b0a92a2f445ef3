//! Generate calls through the router's gRPC API, timed from the client's side: when the request
//! was sent, when its first token arrived, when the stream ended, plus the timings and routing
//! the router reports on the last message. [`run_batch`] runs several at once and turns them
//! into a decode rate; each moment is also stamped with a worker process's CPU time.

use std::time::{Duration, Instant};

use dolphin_proto::v1::generate_request::Input;
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::{
    FinishReason, GenerateRequest, PrefillMode, RoutingInfo, SamplingParams, Timings, TokenIds,
};
use tonic::transport::Channel;

use crate::BenchError;
use crate::proc_stat::CpuClock;

/// A moment by the wall clock and by a process's CPU time.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    /// Wall clock.
    pub at: Instant,
    /// The watched process's CPU time so far.
    pub cpu: Duration,
}

impl Stamp {
    /// Now, with `clock`'s process CPU time.
    pub fn now(clock: &CpuClock) -> Result<Stamp, BenchError> {
        Ok(Stamp {
            at: Instant::now(),
            cpu: clock.cpu_time()?,
        })
    }

    /// `tokens` per second from `self` to `end`: (wall, cpu); a zero interval gives 0.
    pub fn rate(self, end: Stamp, tokens: f64) -> (f64, f64) {
        let per = |d: Duration| {
            let s = d.as_secs_f64();
            if s > 0.0 { tokens / s } else { 0.0 }
        };
        (
            per(end.at.saturating_duration_since(self.at)),
            per(end.cpu.saturating_sub(self.cpu)),
        )
    }
}

/// One Generate call as the client saw it.
#[derive(Clone, Debug)]
pub struct Timed {
    /// Just before the call.
    pub sent: Stamp,
    /// When the first token arrived.
    pub first_token: Option<Stamp>,
    /// When the stream ended.
    pub done: Stamp,
    /// Tokens received.
    pub tokens: u32,
    /// The last message's finish reason.
    pub finish_reason: FinishReason,
    /// The last message's timings (router view; worker fields passed through).
    pub timings: Timings,
    /// The last message's routing.
    pub routing: Option<RoutingInfo>,
}

impl Timed {
    /// Time to first token by the client's clock.
    pub fn ttft(&self) -> Duration {
        self.first_token.map_or(Duration::ZERO, |f| {
            f.at.saturating_duration_since(self.sent.at)
        })
    }

    /// Whether a remote prefill fell back to local.
    pub fn fell_back(&self) -> bool {
        self.routing.as_ref().is_some_and(|r| r.fell_back)
    }
}

/// A greedy request for `max_tokens` tokens past any end-of-sequence, on path `mode`.
pub fn token_request(
    model: &str,
    id: String,
    prompt: Vec<u32>,
    max_tokens: u32,
    mode: PrefillMode,
) -> GenerateRequest {
    GenerateRequest {
        request_id: id,
        model: model.to_owned(),
        input: Some(Input::TokenIds(TokenIds { ids: prompt })),
        sampling: Some(SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::default()
        }),
        force_mode: mode as i32,
        ..GenerateRequest::default()
    }
}

/// Deterministic token ids in the ordinary-text range of a 49k vocabulary, different for each
/// `salt` (so prompts share no cached prefix).
pub fn synthetic_prompt(n: usize, salt: u64) -> Vec<u32> {
    let mut x = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            200 + (x % 30_000) as u32
        })
        .collect()
}

/// Sends `req` and drains its stream, stamping with `clock`'s process.
pub async fn timed_generate(
    mut client: InferenceClient<Channel>,
    req: GenerateRequest,
    clock: &CpuClock,
) -> Result<Timed, BenchError> {
    let rpc = |s: tonic::Status| BenchError::Rpc(Box::new(s));
    let sent = Stamp::now(clock)?;
    let mut stream = client.generate(req).await.map_err(rpc)?.into_inner();
    let mut first_token = None;
    let mut tokens = 0u32;
    let mut last = None;
    while let Some(msg) = stream.message().await.map_err(rpc)? {
        if !msg.token_ids.is_empty() && first_token.is_none() {
            first_token = Some(Stamp::now(clock)?);
        }
        tokens += msg.token_ids.len() as u32;
        if msg.finish_reason != FinishReason::Unspecified as i32 {
            last = Some(msg);
        }
    }
    let done = Stamp::now(clock)?;
    let last = last.ok_or_else(|| BenchError::Setup("stream ended without a finish".into()))?;
    Ok(Timed {
        sent,
        first_token,
        done,
        tokens,
        finish_reason: FinishReason::try_from(last.finish_reason)
            .unwrap_or(FinishReason::Unspecified),
        timings: last.timings.unwrap_or_default(),
        routing: last.routing,
    })
}

/// A decode rate: tokens after each stream's first, from the moment every stream had its first
/// token until the last one ended (so prefills stay out of it).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct DecodeRate {
    /// By the wall clock.
    pub wall: f64,
    /// Per second of the decode worker's CPU time.
    pub cpu: f64,
    /// Mean of the router-reported time per output token, in ms.
    pub tpot_ms: f64,
}

/// Runs `requests` at once (one stream each) and measures their joint decode rate.
pub async fn run_batch(
    client: &InferenceClient<Channel>,
    requests: Vec<GenerateRequest>,
    clock: &CpuClock,
) -> Result<DecodeRate, BenchError> {
    let n = requests.len();
    let mut tasks = tokio::task::JoinSet::new();
    for req in requests {
        let (client, clock) = (client.clone(), clock.clone());
        tasks.spawn(async move { timed_generate(client, req, &clock).await });
    }
    let mut runs = Vec::with_capacity(n);
    while let Some(run) = tasks.join_next().await {
        let run = run.map_err(|e| BenchError::Setup(format!("request task: {e}")))??;
        runs.push(run);
    }
    let start = runs
        .iter()
        .filter_map(|r| r.first_token)
        .max_by_key(|s| s.at)
        .ok_or_else(|| BenchError::Setup("no stream produced a token".into()))?;
    let end = runs
        .iter()
        .map(|r| r.done)
        .max_by_key(|s| s.at)
        .ok_or_else(|| BenchError::Setup("no stream".into()))?;
    let tokens: u32 = runs.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    let (wall, cpu) = start.rate(end, f64::from(tokens));
    let tpot_ms =
        runs.iter().map(|r| r.timings.tpot_us as f64).sum::<f64>() / n.max(1) as f64 / 1e3;
    Ok(DecodeRate { wall, cpu, tpot_ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_differ_by_salt_and_stay_in_range() {
        let (a, b) = (synthetic_prompt(64, 1), synthetic_prompt(64, 2));
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert_eq!(a, synthetic_prompt(64, 1));
        assert!(a.iter().all(|&t| (200..30_200).contains(&t)));
    }

    #[test]
    fn rates_by_both_clocks() {
        let t0 = Instant::now();
        let s = Stamp {
            at: t0,
            cpu: Duration::from_millis(100),
        };
        let e = Stamp {
            at: t0 + Duration::from_secs(2),
            cpu: Duration::from_millis(1100),
        };
        assert_eq!(s.rate(e, 100.0), (50.0, 100.0));
        assert_eq!(s.rate(s, 100.0), (0.0, 0.0));
    }
}

//! Replay against a running router over `dolphin.v1.Inference`: every request streamed, timed
//! at the client, and described by the router's `RoutingInfo`.
//!
//! Open-loop arrivals send each request at its arrival time, with at most `max_in_flight` in
//! flight (a request due while the bound is reached waits, and its latencies count from when
//! it was actually sent). Closed-loop arrivals keep `concurrency` requests in flight, sending
//! the next one as each completes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::client::AuthChannel as Channel;
use dolphin_proto::v1::generate_request::Input;
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::{
    FinishReason, GenerateRequest, ListModelsRequest, PrefillMode, PrefillPath, RoutingInfo,
    SamplingParams, SloClass, TokenIds,
};
use dolphin_workload::{Arrivals, RequestOutcome, Slo, Workload, WorkloadRequest};
use tokio::task::JoinSet;

use super::progress::{Progress, Stats};
use super::{ReplayError, ReplayRun};
use crate::client;
use crate::error::CtlError;

/// If every one of this many first completions failed, the replay stops: the router is down
/// or refuses everything, and the rest would fail the same way.
pub const FAIL_FAST_AFTER: usize = 20;
/// Requests per HTTP/2 connection at most: servers cap concurrent streams per connection
/// (hyper's default is 200), and a stream over the cap would wait in the client, inflating
/// its TTFT.
const STREAMS_PER_CONNECTION: u32 = 100;

/// How to reach the live cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveConfig {
    /// The router's gRPC URL ("http://host:port" or "host:port").
    pub router_grpc: String,
    /// The model to ask for (default: the first the router lists).
    pub model: Option<String>,
    /// Prompt token ids are below this (default: the vocabulary the router reports; a larger
    /// value is refused).
    pub vocab_size: Option<u32>,
    /// Most requests in flight under open-loop arrivals.
    pub max_in_flight: u32,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Send each workload's `max_tokens` cap (not the output length) and end each request at
    /// its traced length through `replay_output_tokens`, which the router does not read.
    pub cap_max_tokens: bool,
}

/// What every wire request of one replay shares.
#[derive(Clone, Debug)]
pub struct WireShape {
    /// The model to ask for.
    pub model: String,
    /// Prompt token ids are below this.
    pub vocab: u32,
    /// The model's context length (0: unknown); a capped `max_tokens` fits in what the prompt
    /// leaves, as a client sizes it.
    pub context: u32,
    /// See [`LiveConfig::cap_max_tokens`].
    pub cap_max_tokens: bool,
}

/// What the client saw of one request, times in ms since it was sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// Index in the (arrivals-applied) workload.
    pub index: usize,
    /// Sent, ms since the replay started.
    pub sent_ms: f64,
    /// First message carrying tokens.
    pub first_ms: Option<f64>,
    /// Last message carrying tokens.
    pub last_ms: Option<f64>,
    /// Tokens received.
    pub tokens: u32,
    /// The latest routing info received.
    pub routing: Option<RoutingInfo>,
    /// Why it failed: (status code name, message).
    pub error: Option<(String, String)>,
}

impl Measured {
    /// The outcome of request `r`, judged against `slo`: TTFT at the first token, TPOT the mean
    /// gap after it (`(last - first) / (tokens - 1)`), e2e at the last token; path, cluster and
    /// features as the router reported them.
    pub fn outcome(&self, r: &WorkloadRequest, slo: &Slo) -> RequestOutcome {
        let ttft = self.first_ms.unwrap_or(0.0);
        let e2e = self.last_ms.unwrap_or(0.0);
        let tpot = if self.tokens > 1 {
            (e2e - ttft) / f64::from(self.tokens - 1)
        } else {
            0.0
        };
        let routing = self.routing.as_ref();
        let features = routing.and_then(|r| r.features).map_or([0; 4], |f| {
            [
                f.isl,
                f.eff_isl_prefill,
                f.eff_isl_decode,
                f.output_len_hint,
            ]
        });
        RequestOutcome {
            index: self.index as u32,
            kind: r.kind,
            sent_ms: self.sent_ms,
            prompt_tokens: r.prompt_len,
            output_tokens: self.tokens,
            ttft_ms: ttft,
            tpot_ms: tpot,
            e2e_ms: e2e,
            features,
            cluster: routing.and_then(|r| u32::try_from(r.cluster).ok()),
            remote: routing.is_some_and(|r| r.mode == PrefillMode::Remote as i32),
            fell_back: routing.is_some_and(|r| r.fell_back),
            held: routing.is_some_and(|r| r.path == PrefillPath::LocalHeld as i32),
            ok: self.error.is_none(),
            met: false,
            met_each: false,
        }
        .judge(slo)
    }
}

/// Replays `workload` (with `arrivals` applied) against the router of `cfg` and judges every
/// request against `slo`. A request that fails (an error status, a stream cut short) is an
/// outcome with `ok = false`, counted in `failures` by status code; the replay goes on, unless
/// every one of the first [`FAIL_FAST_AFTER`] requests failed. Outcomes are in the workload's
/// order after `arrivals` is applied.
pub async fn replay_live(
    cfg: &LiveConfig,
    workload: &Workload,
    arrivals: Arrivals,
    slo: Slo,
) -> Result<ReplayRun, ReplayError> {
    let mut w = workload.clone();
    arrivals.apply(&mut w);
    let n = w.requests.len();
    let limit = arrivals.concurrency().unwrap_or(cfg.max_in_flight).max(1);
    let closed = arrivals.concurrency().is_some();
    let mut channels = Vec::new();
    for _ in 0..limit.div_ceil(STREAMS_PER_CONNECTION) {
        channels.push(client::connect(&cfg.router_grpc).await?);
    }
    let (model, reported, context) = model_card(channels[0].clone(), cfg.model.as_deref()).await?;
    let vocab = match cfg.vocab_size {
        Some(v) if v > reported => {
            return Err(ReplayError::Model(format!(
                "--vocab-size {v} exceeds the vocabulary of model {model:?} ({reported} ids)"
            )));
        }
        Some(v) => v,
        None => reported,
    };
    let beyond = beyond_context(&w, context);
    if beyond > 0 {
        eprintln!(
            "dolphinctl: warning: {beyond} of {n} requests need more than model {model:?}'s context \
             of {context} tokens (prompt and output): the router will refuse them \
             (context_length_exceeded), and they count as failed"
        );
    }
    let shape = WireShape {
        model,
        vocab,
        context,
        cap_max_tokens: cfg.cap_max_tokens,
    };

    let start = Instant::now();
    let mut set: JoinSet<Measured> = JoinSet::new();
    let mut slots: Vec<Option<RequestOutcome>> = vec![None; n];
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_error: Option<String> = None;
    let mut stats = Stats {
        total: n,
        ..Stats::default()
    };
    let mut progress = Progress::new(cfg.progress, n);
    let mut tick = tokio::time::interval(progress.period());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut next = 0;
    while stats.done < n {
        while next < n && set.len() < limit as usize {
            let due = start + offset(&w.requests[next]);
            if !closed && due > Instant::now() {
                break;
            }
            let req = generate_request(&w, next, &shape, &slo);
            let channel = channels[next % channels.len()].clone();
            set.spawn(send(InferenceClient::new(channel), req, next, start));
            next += 1;
        }
        stats.in_flight = set.len();
        let wake = (!closed && next < n && set.len() < limit as usize)
            .then(|| tokio::time::Instant::from_std(start + offset(&w.requests[next])));
        tokio::select! {
            Some(joined) = set.join_next() => {
                let m = joined.map_err(|e| ReplayError::Task(e.to_string()))?;
                let outcome = m.outcome(&w.requests[m.index], &slo);
                if let Some((code, message)) = &m.error {
                    *failures.entry(code.clone()).or_default() += 1;
                    first_error.get_or_insert_with(|| format!("{code}: {message}"));
                }
                stats.record(&outcome);
                slots[m.index] = Some(outcome);
                if stats.done == n.min(FAIL_FAST_AFTER) && stats.failed == stats.done {
                    set.abort_all();
                    progress.finish(&stats, start.elapsed());
                    return Err(ReplayError::AllFailing {
                        failed: stats.failed,
                        summary: failure_summary(&failures),
                        first: first_error.unwrap_or_default(),
                        url: client::normalize_url(&cfg.router_grpc),
                    });
                }
            }
            () = tokio::time::sleep_until(wake.unwrap_or_else(tokio::time::Instant::now)), if wake.is_some() => {}
            _ = tick.tick() => progress.draw(&stats, start.elapsed()),
        }
    }
    stats.in_flight = 0;
    progress.finish(&stats, start.elapsed());
    Ok(ReplayRun {
        outcomes: slots.into_iter().flatten().collect(),
        failures,
        wall_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

/// "Unavailable x 20, Internal x 1".
pub fn failure_summary(failures: &BTreeMap<String, u64>) -> String {
    failures
        .iter()
        .map(|(code, n)| format!("{code} x {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn offset(r: &WorkloadRequest) -> Duration {
    Duration::try_from_secs_f64(r.arrival_ms / 1e3).unwrap_or_default()
}

/// Requests whose prompt and output together exceed `context` tokens (0: unknown, none do).
fn beyond_context(w: &Workload, context: u32) -> usize {
    if context == 0 {
        return 0;
    }
    w.requests
        .iter()
        .filter(|r| u64::from(r.prompt_len) + u64::from(r.output_len) > u64::from(context))
        .count()
}

/// The model to ask for, its vocabulary size and context length, from ListModels.
async fn model_card(
    channel: Channel,
    want: Option<&str>,
) -> Result<(String, u32, u32), ReplayError> {
    let models = InferenceClient::new(channel)
        .list_models(ListModelsRequest {})
        .await
        .map_err(|s| CtlError::rpc("ListModels", s))?
        .into_inner()
        .models;
    let card = match want {
        Some(name) => models.iter().find(|m| m.id == name).ok_or_else(|| {
            let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
            ReplayError::Model(format!(
                "the router does not serve model {name:?} (it lists {ids:?})"
            ))
        })?,
        None => models
            .first()
            .ok_or_else(|| ReplayError::Model("the router lists no model".into()))?,
    };
    if card.vocab_size == 0 {
        return Err(ReplayError::Model(format!(
            "the router reports no vocabulary for model {:?}",
            card.id
        )));
    }
    Ok((card.id.clone(), card.vocab_size, card.context_length))
}

/// The wire request for request `index`: its prompt expanded into token ids below the
/// vocabulary, exactly `output_len` tokens (greedy, past end-of-sequence), and the SLO. With
/// `cap_max_tokens`, `max_tokens` is the workload's cap (within the context the prompt leaves,
/// never below the output) and the output length travels as `replay_output_tokens`.
pub fn generate_request(
    w: &Workload,
    index: usize,
    shape: &WireShape,
    slo: &Slo,
) -> GenerateRequest {
    let r = &w.requests[index];
    let ids = w.prompt_tokens(index, 0..shape.vocab);
    let (max_tokens, replay_output_tokens) = if shape.cap_max_tokens {
        let room = match shape.context {
            0 => u32::MAX,
            c => c.saturating_sub(ids.len() as u32),
        };
        let cap = r.kind.max_tokens_cap().min(room).max(r.output_len);
        (cap, Some(r.output_len))
    } else {
        (r.output_len, None)
    };
    GenerateRequest {
        model: shape.model.clone(),
        input: Some(Input::TokenIds(TokenIds { ids })),
        sampling: Some(SamplingParams {
            temperature: 0.0,
            max_tokens,
            ignore_eos: true,
            replay_output_tokens,
            ..SamplingParams::default()
        }),
        slo: Some(SloClass {
            name: "replay".to_owned(),
            ttft_ms: slo.ttft_ms.round() as u32,
            tpot_ms: slo.tpot_ms.round() as u32,
        }),
        ..GenerateRequest::default()
    }
}

/// Sends one request and times its stream.
async fn send(
    mut client: InferenceClient<Channel>,
    req: GenerateRequest,
    index: usize,
    start: Instant,
) -> Measured {
    let sent = Instant::now();
    let since = |t: Instant| t.duration_since(sent).as_secs_f64() * 1e3;
    let mut m = Measured {
        index,
        sent_ms: sent.duration_since(start).as_secs_f64() * 1e3,
        ..Measured::default()
    };
    let status = |s: tonic::Status| Some((format!("{:?}", s.code()), s.message().to_owned()));
    let mut stream = match client.generate(req).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            m.error = status(s);
            return m;
        }
    };
    loop {
        match stream.message().await {
            Ok(Some(msg)) => {
                if !msg.token_ids.is_empty() {
                    let now = since(Instant::now());
                    m.first_ms.get_or_insert(now);
                    m.last_ms = Some(now);
                    m.tokens += msg.token_ids.len() as u32;
                }
                if msg.routing.is_some() {
                    m.routing = msg.routing;
                }
                if msg.finish_reason == FinishReason::Error as i32 {
                    m.error = Some((
                        "FinishError".to_owned(),
                        "the router ended the stream with finish reason ERROR".to_owned(),
                    ));
                }
            }
            Ok(None) => break,
            Err(s) => {
                m.error = status(s);
                break;
            }
        }
    }
    if m.error.is_none() && m.tokens == 0 {
        m.error = Some((
            "NoTokens".to_owned(),
            "the stream ended without a token".to_owned(),
        ));
    }
    m
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;

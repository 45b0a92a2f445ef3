//! The response of one running request: token deltas from the decode worker, detokenized
//! incrementally, cut at stop strings, timed, and logged when it ends.
//!
//! Dropping a [`ResponseStream`] before it finished drops the worker's gRPC stream, which cancels
//! the request on the worker, and logs the request as cancelled. When the worker fails
//! mid-stream, the stream moves the request to another worker ([`crate::migration`]) and goes on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use dolphin_proto::v1::{self, FinishReason};
use futures::Stream;

use crate::dispatch::{Attempt, RouteDecision};
use crate::dolphin::online_service::{Finished, OnlineSink};
use crate::error::DispatchError;
use crate::grpc_call::GrpcStream;
use crate::metrics as m;
use crate::migration::Migration;
use crate::policy::{Decision, PrefillPath};
use crate::request_log::{RequestLog, RequestRecord};
use crate::stop::StopMatcher;
use crate::tokenizer::{IncrementalDetokenizer, Specials, Tokenizer};
use crate::workers::InflightGuard;
use dolphin_cluster::hot_metrics as hot;

/// The front end a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI-compatible HTTP.
    Http,
    /// `dolphin.v1.Inference`.
    Grpc,
}

impl Api {
    /// "http" / "grpc".
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Http => "http",
            Api::Grpc => "grpc",
        }
    }
}

/// What the dispatcher knows about a request when its stream starts.
#[derive(Debug)]
pub(crate) struct RequestMeta {
    pub(crate) request_id: String,
    pub(crate) api: Api,
    pub(crate) arrived: Instant,
    pub(crate) ts_ms: u64,
    pub(crate) retries: u32,
    pub(crate) slo: Option<v1::SloClass>,
    pub(crate) prompt_tokens: u32,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    /// Why generation stopped.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: v1::Usage,
    /// Router-measured TTFT, TPOT and e2e, plus the worker's queue, prefill and transfer times.
    pub timings: v1::Timings,
    /// The decode worker's remote prefill failed and it prefilled locally.
    pub fell_back: bool,
    /// Where the request ended: the last decode worker after migrations.
    pub routing: v1::RoutingInfo,
    /// The stop string that ended the output (`reason` is then `Stop`), if one did.
    pub stop_sequence: Option<String>,
}

/// Output since the previous delta.
#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    /// Token ids received.
    pub token_ids: Vec<u32>,
    /// Their log probabilities, pairwise, where the request asked for them (else empty).
    pub logprobs: Vec<v1::TokenLogprobs>,
    /// With the first tokens of a request that asked for them: the prompt's log
    /// probabilities (its tokens after the first; else empty).
    pub prompt_logprobs: Vec<v1::TokenLogprobs>,
    /// Their text (may be empty while a character or a possible stop string is incomplete).
    pub text: String,
    /// Set on the last delta.
    pub finish: Option<Finish>,
    /// Which of a request's choices (OpenAI's `n`) it belongs to; 0 but where the HTTP API
    /// merges the streams of several.
    pub choice: u32,
    /// Where a delta gathered from several of the worker's messages joins them, as the
    /// tokens and text bytes before each later message, so that a reader that splits the text
    /// (the Responses API's) can give each piece the log probabilities of the tokens that
    /// brought it out. Kept only where log probabilities were asked; else empty.
    pub joins: Vec<(usize, usize)>,
}

/// A running request's output.
///
/// Boxed: its state is about 1 KB, and every future that hands the stream on (the dispatcher's,
/// the handlers') held a copy of it and moved it on; with the rest of those futures the HTTP
/// handler's future was 45 KB (rust-lang/rust#62958: a future moved into a wrapper is laid out
/// twice in its parent), copied whole when hyper boxed it.
#[derive(Debug)]
pub struct ResponseStream(Box<Running>);

impl ResponseStream {
    pub(crate) fn new(
        meta: RequestMeta,
        attempt: Attempt,
        tokenizer: Arc<dyn Tokenizer>,
        log: RequestLog,
        online: OnlineSink,
        migration: Migration,
        deadline: Option<tokio::time::Instant>,
    ) -> Self {
        Self(Box::new(Running {
            meta,
            route: attempt.route,
            stream: Some(attempt.stream),
            pending: Some(attempt.first),
            tokenizer,
            detok: IncrementalDetokenizer::new(),
            held_end: None,
            stop: StopMatcher::new(migration.stop_strings(), migration.include_stop_string()),
            log,
            online,
            _guard: attempt.guard,
            migration,
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            first_token_at: None,
            last_token_at: None,
            completion_tokens: 0,
            fell_back: false,
            path: None,
            done: false,
            deferred: None,
        }))
    }

    /// The stream writing out `specials` in its text (the control tokens a tool call parser
    /// reads, or every special token); before any output.
    pub(crate) fn with_specials(mut self, specials: Specials) -> Self {
        self.0.detok = IncrementalDetokenizer::with(specials);
        self
    }

    /// The request id.
    pub fn request_id(&self) -> &str {
        &self.0.meta.request_id
    }

    /// How the request was routed.
    pub fn route(&self) -> &RouteDecision {
        &self.0.route
    }

    /// The prompt's tokens.
    pub fn prompt_tokens(&self) -> &[u32] {
        self.0.migration.prompt()
    }

    /// Whether the request asked for the prompt's log probabilities.
    pub fn asked_prompt_logprobs(&self) -> bool {
        self.0.migration.sampling().prompt_logprobs.is_some()
    }

    /// Times the request moved to another decode worker.
    pub fn migrations(&self) -> u32 {
        self.0.migration.count()
    }

    /// The prefill path the request really took: as its decode worker reported it, else what
    /// the decision and a reported fallback imply.
    pub fn path(&self) -> PrefillPath {
        self.0.path()
    }

    /// Routing info as the public API reports it.
    pub fn routing(&self) -> v1::RoutingInfo {
        self.0.routing()
    }

    /// The error for a stream that ended before its last delta: its decode worker's answer
    /// was cut short.
    pub fn truncated(&self) -> DispatchError {
        DispatchError::Truncated {
            worker: self.0.route.decode.worker.id.0.clone(),
        }
    }

    /// The next delta; `None` after the last one. Errors end the stream.
    pub async fn next(&mut self) -> Option<Result<Delta, DispatchError>> {
        std::future::poll_fn(|cx| self.0.poll_delta(cx)).await
    }

    /// Turns the stream into a `futures::Stream` (it is one already; kept for callers that want
    /// an opaque type).
    pub fn into_stream(self) -> impl Stream<Item = Result<Delta, DispatchError>> + Send + 'static {
        self
    }
}

/// A [`ResponseStream`]'s state.
#[derive(Debug)]
struct Running {
    meta: RequestMeta,
    /// The current decode worker's route (another one's after a migration).
    route: RouteDecision,
    /// `None` once finished: dropping it is what cancels the worker's request.
    stream: Option<GrpcStream<v1::DecodeResponse>>,
    pending: Option<v1::DecodeResponse>,
    tokenizer: Arc<dyn Tokenizer>,
    detok: IncrementalDetokenizer,
    /// A message's last token that may have ended the output, held back until the next
    /// message tells ([`Running::text_of`]).
    held_end: Option<u32>,
    stop: StopMatcher,
    log: RequestLog,
    /// The online learner's inbox (used when the route has a learn ticket).
    online: OnlineSink,
    /// The request's load on the current decode worker.
    _guard: InflightGuard,
    migration: Migration,
    /// Fires at the request's deadline: the stream then ends with DEADLINE_EXCEEDED (and the
    /// worker's request is cancelled with its stream).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    completion_tokens: u32,
    fell_back: bool,
    /// The prefill path the current decode worker reported (`None`: not reported yet, or a
    /// worker that predates the field).
    path: Option<PrefillPath>,
    done: bool,
    /// An error that arrived behind output not yet returned: the next poll returns it.
    deferred: Option<DispatchError>,
}

impl Running {
    fn path(&self) -> PrefillPath {
        self.path.unwrap_or(if self.fell_back {
            PrefillPath::LocalFallback
        } else {
            PrefillPath::of(self.route.decision)
        })
    }

    fn routing(&self) -> v1::RoutingInfo {
        let r = &self.route;
        let remote = r.decision == Decision::Remote;
        v1::RoutingInfo {
            decode_worker: r.decode.worker.id.0.clone(),
            prefill_worker: if remote {
                r.prefill
                    .as_ref()
                    .map(|p| p.worker.id.0.clone())
                    .unwrap_or_default()
            } else {
                String::new()
            },
            mode: if remote {
                v1::PrefillMode::Remote as i32
            } else {
                v1::PrefillMode::Local as i32
            },
            cluster: crate::dolphin::routing::wire_cluster(r.cluster),
            policy: r.decided_by.label().to_string(),
            fell_back: self.fell_back,
            features: Some(v1::RoutingFeatures {
                isl: r.features.isl,
                eff_isl_prefill: r.features.eff_isl_prefill,
                eff_isl_decode: r.features.eff_isl_decode,
                output_len_hint: r.features.output_len_hint,
            }),
            migrations: self.migration.count(),
            path: wire_path(self.path()) as i32,
        }
    }

    /// Polls for the next delta. Every message the worker has already sent is merged into it, so
    /// a burst of tokens (and the final usage) goes to the client as one message and one write
    /// instead of one per token (with the poll-based stream replacing `stream::unfold`, which
    /// moved the whole `ResponseStream` on every item: about -5% router instructions per request
    /// under callgrind). An error behind buffered output is returned on the next poll.
    fn poll_delta(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Delta, DispatchError>>> {
        if let Some(e) = self.deferred.take() {
            return Poll::Ready(Some(Err(self.fail(e))));
        }
        let mut out: Option<Delta> = None;
        if !self.done
            && let Some(sleep) = self.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            self.deadline = None;
            return self.end_with(DispatchError::DeadlineExceeded, out);
        }
        while !self.done {
            if self.migration.running() {
                match self.migration.poll(cx) {
                    Poll::Pending => break,
                    Poll::Ready(Ok(attempt)) => {
                        self.resume(attempt);
                        continue;
                    }
                    Poll::Ready(Err(e)) => return self.end_with(e, out),
                }
            }
            let msg = match self.pending.take() {
                Some(m) => m,
                None => {
                    let Some(stream) = self.stream.as_mut() else {
                        break;
                    };
                    let worker = || self.route.decode.worker.id.0.clone();
                    let err = match Pin::new(stream).poll_next(cx) {
                        Poll::Pending => break,
                        Poll::Ready(Some(Ok(m))) => {
                            self.absorb_into(m, &mut out);
                            continue;
                        }
                        Poll::Ready(None) => DispatchError::Truncated { worker: worker() },
                        Poll::Ready(Some(Err(status))) => {
                            DispatchError::from_worker_status(worker(), status)
                        }
                    };
                    match self.migrate(err) {
                        // Either the move is under way or the request turned out complete.
                        Ok(None) => continue,
                        Ok(Some(last)) => last,
                        Err(e) => return self.end_with(e, out),
                    }
                }
            };
            self.absorb_into(msg, &mut out);
        }
        match out {
            Some(d) => Poll::Ready(Some(Ok(d))),
            None if self.done => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    /// Ends the stream with `e`, after the output already gathered if there is some.
    fn end_with(
        &mut self,
        e: DispatchError,
        out: Option<Delta>,
    ) -> Poll<Option<Result<Delta, DispatchError>>> {
        match out {
            Some(d) => {
                self.deferred = Some(e);
                Poll::Ready(Some(Ok(d)))
            }
            None => Poll::Ready(Some(Err(self.fail(e)))),
        }
    }

    /// The current worker's stream failed with `err`: starts moving the request to another
    /// worker, or gives back the final message when every token was already streamed (the
    /// worker died between its last token and its finish), or gives back the error.
    fn migrate(&mut self, err: DispatchError) -> Result<Option<v1::DecodeResponse>, DispatchError> {
        self.stream = None;
        if err.worker_unreachable() {
            self.route.decode.worker.mark_unreachable();
        }
        if self.migration.streamed() >= self.migration.max_tokens() {
            return Ok(Some(v1::DecodeResponse {
                finish_reason: FinishReason::Length as i32,
                ..Default::default()
            }));
        }
        self.migration.start(&self.route.decode.worker.id, err)?;
        Ok(None)
    }

    /// Continues on the worker a migration found.
    fn resume(&mut self, attempt: Attempt) {
        self.route = attempt.route;
        self._guard = attempt.guard;
        self.stream = Some(attempt.stream);
        self.pending = Some(attempt.first);
    }

    /// Absorbs `msg` and appends its delta to `out` (skipping empty ones).
    fn absorb_into(&mut self, msg: v1::DecodeResponse, out: &mut Option<Delta>) {
        let d = self.absorb(msg);
        if d.finish.is_none() && d.text.is_empty() && d.token_ids.is_empty() {
            return;
        }
        match out {
            None => *out = Some(d),
            Some(acc) => {
                if !acc.logprobs.is_empty() {
                    acc.joins.push((acc.token_ids.len(), acc.text.len()));
                }
                acc.token_ids.extend_from_slice(&d.token_ids);
                acc.logprobs.extend(d.logprobs);
                acc.prompt_logprobs.extend(d.prompt_logprobs);
                acc.text.push_str(&d.text);
                acc.finish = d.finish;
            }
        }
    }

    fn absorb(&mut self, msg: v1::DecodeResponse) -> Delta {
        let now = Instant::now();
        if !msg.token_ids.is_empty() {
            self.first_token_at.get_or_insert(now);
            self.last_token_at = Some(now);
            self.completion_tokens += msg.token_ids.len() as u32;
            self.migration.streamed_tokens(&msg.token_ids);
        }
        self.fell_back |= msg.fell_back;
        if let Some(path) = path_of_wire(msg.path) {
            self.path = Some(path);
        }
        let reason = FinishReason::try_from(msg.finish_reason).unwrap_or(FinishReason::Unspecified);
        let finished = reason != FinishReason::Unspecified;
        let mut text = self.text_of(&msg.token_ids, reason);
        if finished {
            text.push_str(&self.detok.flush(self.tokenizer.as_ref()));
        }
        let released = self.stop.push(&text);
        let mut text = released.text;
        let finish = if released.stopped {
            // Drop the worker stream: the worker cancels the rest of the generation.
            self.stream = None;
            Some(self.finish(FinishReason::Stop, msg.usage, msg.timings, now))
        } else if finished {
            text.push_str(&self.stop.finish());
            Some(self.finish(reason, msg.usage, msg.timings, now))
        } else {
            None
        };
        Delta {
            token_ids: msg.token_ids,
            logprobs: msg.logprobs,
            prompt_logprobs: msg.prompt_logprobs,
            text,
            finish,
            choice: 0,
            joins: Vec::new(),
        }
    }

    /// The text `ids` add, a message's tokens finished by `reason`. The token that ended the
    /// output (one of the model's end tokens or of the request's stop tokens) is not text
    /// unless the request keeps its stop in the text (vLLM's `include_stop_str_in_output`).
    /// The worker says so in the message after it, so a message's last token that may be one
    /// is held back until then. Decoding leaves special tokens out anyway: this keeps out an
    /// ordinary stop token, and a special one where the request writes them out.
    fn text_of(&mut self, ids: &[u32], reason: FinishReason) -> String {
        let (shown, held) = match ids.split_last() {
            Some((&last, rest)) if !self.migration.include_stop_string() && self.may_end(last) => {
                match reason {
                    FinishReason::Unspecified => (rest, Some(last)),
                    FinishReason::Stop => (rest, None),
                    _ => (ids, None),
                }
            }
            _ => (ids, None),
        };
        let mut text = String::new();
        if let Some(earlier) = std::mem::replace(&mut self.held_end, held)
            && !(reason == FinishReason::Stop && ids.is_empty())
        {
            // It did not end the output.
            text = self.detok.push(self.tokenizer.as_ref(), &[earlier]);
        }
        text.push_str(&self.detok.push(self.tokenizer.as_ref(), shown));
        text
    }

    /// Whether `token` ends the output when drawn: one of the model's end tokens or the
    /// request's stop tokens.
    fn may_end(&self, token: u32) -> bool {
        self.tokenizer.end_tokens().contains(&token)
            || self
                .migration
                .sampling()
                .logits
                .as_ref()
                .is_some_and(|r| r.stop_token_ids.contains(&token))
    }

    fn finish(
        &mut self,
        reason: FinishReason,
        usage: Option<v1::Usage>,
        worker: Option<v1::Timings>,
        now: Instant,
    ) -> Finish {
        self.done = true;
        self.stream = None;
        let usage = usage.unwrap_or_default();
        let worker = worker.unwrap_or_default();
        let arrived = self.meta.arrived;
        let us = |d: std::time::Duration| d.as_micros() as u64;
        let ttft = self.first_token_at.map(|t| t - arrived);
        let tpot = match (self.first_token_at, self.last_token_at) {
            (Some(f), Some(l)) if self.completion_tokens > 1 => {
                Some((l - f) / (self.completion_tokens - 1))
            }
            _ => None,
        };
        let e2e = now - arrived;
        let finish = Finish {
            reason,
            usage: v1::Usage {
                prompt_tokens: self.meta.prompt_tokens,
                completion_tokens: self.completion_tokens,
                cached_tokens: usage.cached_tokens,
                // A model group's split of the tokens, as its decode worker reported it.
                by_model: usage.by_model.clone(),
                handoffs: usage.handoffs,
                handoff_algorithm: usage.handoff_algorithm.clone(),
            },
            timings: v1::Timings {
                queued_us: worker.queued_us,
                prefill_us: worker.prefill_us,
                kv_transfer_us: worker.kv_transfer_us,
                ttft_us: ttft.map_or(0, us),
                e2e_us: us(e2e),
                tpot_us: tpot.map_or(0, us),
                kv_bytes: worker.kv_bytes,
            },
            fell_back: self.fell_back,
            routing: self.routing(),
            stop_sequence: self.stop.matched().map(str::to_owned),
        };
        let outcome = if reason == FinishReason::Error {
            "error_worker"
        } else {
            "ok"
        };
        self.record(outcome, Some(&finish));
        finish
    }

    fn fail(&mut self, e: DispatchError) -> DispatchError {
        self.done = true;
        self.stream = None;
        tracing::warn!(request_id = %self.meta.request_id, error = %e, "request failed mid-stream");
        self.record(e.outcome(), None);
        e
    }

    /// Metrics and the request-log line of a request that ended (or was dropped).
    fn record(&self, outcome: &'static str, finish: Option<&Finish>) {
        let mode = self.route.decision.as_str();
        hot::counter(
            m::REQUESTS_TOTAL,
            [("api", self.meta.api.as_str()), ("outcome", outcome)],
        )
        .increment(1);
        hot::counter(
            m::PREFILL_PATHS_TOTAL,
            [("mode", mode), ("path", self.path().as_str())],
        )
        .increment(1);
        hot::counter(m::COMPLETION_TOKENS_TOTAL, []).increment(u64::from(self.completion_tokens));
        let e2e = self.meta.arrived.elapsed();
        let ttft = self.first_token_at.map(|t| t - self.meta.arrived);
        let tpot =
            finish.and_then(|f| (f.timings.tpot_us > 0).then_some(f.timings.tpot_us as f64 / 1e6));
        if outcome == "ok" {
            if let Some(t) = ttft {
                hot::histogram(m::TTFT_SECONDS, [("mode", mode)]).record(t.as_secs_f64());
            }
            if let Some(t) = tpot {
                hot::histogram(m::TPOT_SECONDS, [("mode", mode)]).record(t);
            }
            hot::histogram(m::E2E_SECONDS, [("mode", mode)]).record(e2e.as_secs_f64());
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        if let Some(ticket) = &self.route.learn
            && outcome != "cancelled"
        {
            let arrived_ms = self.meta.ts_ms as f64;
            self.online.send(Finished {
                ticket: ticket.clone(),
                cluster: self.route.cluster,
                decision: self.route.decision,
                decided_by: self.route.decided_by,
                decode_worker: Arc::from(self.route.decode.worker.id.0.as_str()),
                arrived_ms,
                done_ms: arrived_ms + ms(e2e),
                ttft_ms: ttft.map_or(f64::INFINITY, ms),
                tpot_ms: tpot.map_or(0.0, |t| t * 1e3),
                tokens: self.completion_tokens,
                ok: outcome == "ok",
            });
        }
        if !self.log.enabled() {
            return;
        }
        let r = &self.route;
        self.log.record(RequestRecord {
            ts_ms: self.meta.ts_ms,
            request_id: self.meta.request_id.clone(),
            api: self.meta.api.as_str(),
            policy: r.decided_by.label(),
            features: r.features,
            decision: r.decision,
            cluster: crate::dolphin::routing::wire_cluster(r.cluster),
            table_version: r.table_version.as_deref().map(str::to_owned),
            output_class: crate::dolphin::classifier::CLASS_NAMES
                .get(r.output_class)
                .copied()
                .unwrap_or("unknown"),
            admission: r.admission.to_record(),
            decode_worker: r.decode.worker.id.0.clone(),
            prefill_worker: (r.decision == Decision::Remote)
                .then(|| r.prefill.as_ref().map(|p| p.worker.id.0.clone()))
                .flatten(),
            fell_back: self.fell_back,
            path: self.path(),
            retries: self.meta.retries,
            migrations: self.migration.count(),
            ttft_ms: ttft.map(ms),
            tpot_ms: tpot.map(|s| s * 1e3),
            e2e_ms: ms(e2e),
            prompt_tokens: self.meta.prompt_tokens,
            completion_tokens: self.completion_tokens,
            cached_tokens: finish.map_or(0, |f| f.usage.cached_tokens),
            by_model: finish.map_or_else(Vec::new, |f| {
                f.usage.by_model.iter().map(Into::into).collect()
            }),
            handoffs: finish.map_or(0, |f| f.usage.handoffs),
            handoff_algorithm: finish
                .map_or_else(String::new, |f| f.usage.handoff_algorithm.clone()),
            outcome,
            slo_met: slo_met(
                self.meta.slo.as_ref(),
                ttft.map(ms),
                tpot.map(|s| s * 1e3),
                ms(e2e),
                self.completion_tokens,
                outcome,
            ),
        });
    }
}

impl Stream for ResponseStream {
    type Item = Result<Delta, DispatchError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().0.poll_delta(cx)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            // The client went away: the worker stream is dropped with us, cancelling the request.
            tracing::debug!(request_id = %self.meta.request_id, "request cancelled by the client");
            self.done = true;
            self.record("cancelled", None);
        }
    }
}

/// Whether a request met its SLO: `e2e <= TTFT_slo + (output - 1) * TPOT_slo` when both targets
/// are set, otherwise the one target that is. `None` when there is no SLO.
pub(crate) fn slo_met(
    slo: Option<&v1::SloClass>,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    e2e_ms: f64,
    output_tokens: u32,
    outcome: &str,
) -> Option<bool> {
    let slo = slo?;
    if slo.ttft_ms == 0 && slo.tpot_ms == 0 {
        return None;
    }
    if outcome != "ok" {
        return Some(false);
    }
    let (t, p) = (f64::from(slo.ttft_ms), f64::from(slo.tpot_ms));
    Some(match (slo.ttft_ms > 0, slo.tpot_ms > 0) {
        (true, true) => e2e_ms <= t + f64::from(output_tokens.saturating_sub(1)) * p,
        (true, false) => ttft_ms.is_some_and(|x| x <= t),
        _ => tpot_ms.is_none_or(|x| x <= p),
    })
}

/// The wire's prefill path (`None` for unspecified or unknown values).
fn path_of_wire(path: i32) -> Option<PrefillPath> {
    match v1::PrefillPath::try_from(path).ok()? {
        v1::PrefillPath::Unspecified => None,
        v1::PrefillPath::Local => Some(PrefillPath::Local),
        v1::PrefillPath::Remote => Some(PrefillPath::Remote),
        v1::PrefillPath::LocalHeld => Some(PrefillPath::LocalHeld),
        v1::PrefillPath::LocalFallback => Some(PrefillPath::LocalFallback),
    }
}

/// `path` on the wire.
fn wire_path(path: PrefillPath) -> v1::PrefillPath {
    match path {
        PrefillPath::Local => v1::PrefillPath::Local,
        PrefillPath::Remote => v1::PrefillPath::Remote,
        PrefillPath::LocalHeld => v1::PrefillPath::LocalHeld,
        PrefillPath::LocalFallback => v1::PrefillPath::LocalFallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slo(ttft: u32, tpot: u32) -> v1::SloClass {
        v1::SloClass {
            name: "x".into(),
            ttft_ms: ttft,
            tpot_ms: tpot,
        }
    }

    #[test]
    fn slo_uses_the_e2e_formula() {
        // 11 tokens: budget 100 + 10 * 10 = 200 ms.
        assert_eq!(
            slo_met(Some(&slo(100, 10)), Some(150.0), Some(5.0), 200.0, 11, "ok"),
            Some(true)
        );
        assert_eq!(
            slo_met(Some(&slo(100, 10)), Some(150.0), Some(5.0), 201.0, 11, "ok"),
            Some(false)
        );
        assert_eq!(
            slo_met(Some(&slo(100, 0)), Some(150.0), None, 201.0, 11, "ok"),
            Some(false)
        );
        assert_eq!(
            slo_met(Some(&slo(0, 10)), Some(150.0), Some(9.0), 1000.0, 11, "ok"),
            Some(true)
        );
        assert_eq!(slo_met(Some(&slo(0, 0)), None, None, 1.0, 1, "ok"), None);
        assert_eq!(slo_met(None, None, None, 1.0, 1, "ok"), None);
        assert_eq!(
            slo_met(Some(&slo(100, 10)), Some(1.0), None, 1.0, 1, "cancelled"),
            Some(false)
        );
    }
}

//! One request inside a model group: the canonical sequence, which subserver holds it, what each
//! subserver has seen, and the algorithm's state. Its [`Driver`]s are the engines' view of it:
//! they run `route` the moment a token is sampled (inside the engine's step, under its lock) and
//! hand the peer's work to the inter-model loop, so no engine ever calls another.

use std::sync::Arc;
use std::time::Instant;

use dolphin_engine::{
    DrivenEnd, DrivenToken, FinishReason, Generated, ModelTokens, SeqDriver, SeqId, SeqOutput,
    SeqUsage, Steer,
};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::mpsc;

use crate::algorithm::{HandoffAlgorithm, ModelIndex, Route, StepView};
use crate::inter::{InterModel, Work};
use crate::stats::GroupStats;

/// Fixed facts of a request.
#[derive(Debug)]
pub(crate) struct RequestInfo {
    pub request_id: String,
    pub prompt_len: u32,
    pub max_tokens: u32,
    /// Trace replay's end (`Sampling::end_after`).
    pub end_after: Option<u32>,
    /// Tokens that end the request (end of sequence unless ignored, stop tokens).
    pub stops: Vec<u32>,
    /// Subserver names, by index.
    pub names: Arc<[String]>,
    /// The algorithm's spec, for usage reports.
    pub algorithm: String,
    /// Keep paused subservers within this many tokens of the active one (appending without
    /// resuming, so they compute the KV in the background); 0: only at handoffs.
    pub sync_tokens: u32,
}

/// A request's mutable state.
#[derive(Debug)]
struct State {
    algorithm: Box<dyn HandoffAlgorithm>,
    /// Prompt, then every accepted token.
    tokens: Vec<u32>,
    /// The subserver decoding now.
    active: ModelIndex,
    /// Per subserver: how many of `tokens` its sequence holds.
    seen: Vec<usize>,
    /// Per subserver: its sequence id, once started.
    seqs: Vec<Option<SeqId>>,
    /// Per subserver: whether its sequence holds a token without KV (the last prompt token, or
    /// a token it kept when it handed off), from which it can sample again. A subserver that
    /// dropped its last token holds none: it can only resume with at least one new token.
    holds_pending: Vec<bool>,
    /// Per subserver: accepted tokens it wrote.
    written: Vec<u32>,
    /// Where the active subserver's span began in `tokens`.
    span_start: usize,
    handoffs: u32,
    /// When the last handoff was sent (for the resume latency).
    handed_at: Option<Instant>,
    /// Prompt tokens the start subserver found cached.
    cached_tokens: u32,
    out: Option<mpsc::Sender<SeqOutput>>,
    done: bool,
}

/// A request in a model group.
#[derive(Debug)]
pub(crate) struct Request {
    info: RequestInfo,
    state: Mutex<State>,
    inter: InterModel,
    stats: Arc<GroupStats>,
}

/// What the request's output became, after a state change.
enum Ended {
    No,
    /// Cancel the request in these subservers.
    Cancel(Vec<ModelIndex>),
}

impl Request {
    pub(crate) fn new(
        info: RequestInfo,
        prompt: Vec<u32>,
        algorithm: Box<dyn HandoffAlgorithm>,
        out: mpsc::Sender<SeqOutput>,
        inter: InterModel,
        stats: Arc<GroupStats>,
        holder: Option<ModelIndex>,
    ) -> Arc<Self> {
        let n = info.names.len();
        let active = holder.unwrap_or_else(|| algorithm.start()).min(n - 1);
        let len = prompt.len();
        stats.started(active);
        Arc::new(Self {
            state: Mutex::new(State {
                algorithm,
                tokens: prompt,
                active,
                seen: vec![len; n],
                seqs: vec![None; n],
                holds_pending: vec![true; n],
                written: vec![0; n],
                span_start: len,
                handoffs: 0,
                handed_at: None,
                cached_tokens: 0,
                out: Some(out),
                done: false,
            }),
            info,
            inter,
            stats,
        })
    }

    /// The subserver that starts the request.
    pub(crate) fn active(&self) -> ModelIndex {
        self.state.lock().active
    }

    /// Records subserver `model`'s sequence id.
    pub(crate) fn set_seq(&self, model: ModelIndex, seq: SeqId) {
        self.state.lock().seqs[model] = Some(seq);
    }

    /// The engine-facing driver for subserver `model`.
    pub(crate) fn driver(self: &Arc<Self>, model: ModelIndex) -> Arc<dyn SeqDriver> {
        Arc::new(Driver {
            request: self.clone(),
            model,
        })
    }

    /// Ends the request with an error (a subserver call failed); cancels it everywhere.
    pub(crate) fn fail(&self, message: String) {
        let ended = {
            let mut s = self.state.lock();
            self.end(&mut s, SeqOutput::Error(message))
        };
        self.after(ended);
    }

    fn after(&self, ended: Ended) {
        if let Ended::Cancel(models) = ended {
            self.inter.send(Work::Cancel {
                request_id: self.info.request_id.clone(),
                models,
            });
        }
    }

    /// Sends the last message once; the other subservers are then cancelled.
    fn end(&self, s: &mut State, last: SeqOutput) -> Ended {
        if s.done {
            return Ended::No;
        }
        s.done = true;
        if let Some(out) = s.out.take() {
            let _ = out.try_send(last);
        }
        self.stats.finished(&s.written);
        self.stats.ended(s.active);
        Ended::Cancel((0..self.info.names.len()).collect())
    }

    fn usage(&self, s: &State) -> SeqUsage {
        SeqUsage {
            prompt_tokens: self.info.prompt_len,
            completion_tokens: s.tokens.len() as u32 - self.info.prompt_len,
            cached_tokens: s.cached_tokens,
            by_model: self
                .info
                .names
                .iter()
                .zip(&s.written)
                .map(|(model, &tokens)| ModelTokens {
                    model: model.clone(),
                    tokens,
                })
                .collect(),
            handoffs: s.handoffs,
            handoff_algorithm: self.info.algorithm.clone(),
        }
    }

    /// Accepts `token` from the active subserver: part of the answer, streamed; paused
    /// subservers more than `sync_tokens` behind get the suffix without resuming.
    fn accept(self: &Arc<Self>, s: &mut State, model: ModelIndex, token: Generated) -> bool {
        s.tokens.push(token.id);
        s.seen[model] = s.tokens.len();
        s.written[model] += 1;
        let every = self.info.sync_tokens as usize;
        if every > 0 {
            for peer in (0..s.seen.len()).filter(|&p| p != model) {
                let Some(seq) = s.seqs[peer] else { continue };
                if s.tokens.len() - s.seen[peer] < every {
                    continue;
                }
                let suffix = s.tokens[s.seen[peer]..].to_vec();
                let tokens = s.algorithm.send(peer, &suffix);
                s.seen[peer] = s.tokens.len();
                s.holds_pending[peer] = true;
                self.inter.send(Work::Append {
                    request: self.clone(),
                    model: peer,
                    seq,
                    tokens,
                    resume: false,
                });
            }
        }
        let sent = s
            .out
            .as_ref()
            .is_some_and(|out| out.try_send(SeqOutput::Token(token)).is_ok());
        if let Some(at) = s.handed_at.take() {
            self.stats.resumed(model, at.elapsed());
        }
        sent
    }

    /// Whether accepting `token` ends the request (the engine then finishes it).
    fn ends(&self, s: &State, token: u32) -> bool {
        let generated = s.tokens.len() as u32 + 1 - self.info.prompt_len;
        self.info.stops.contains(&token)
            || generated >= self.info.max_tokens
            || self.info.end_after.is_some_and(|n| generated >= n)
    }

    /// Ends the request with `message` from inside a step: the sequence pauses, and every
    /// subserver is told to drop it once the state lock is released.
    fn abort(&self, mut s: MutexGuard<'_, State>, message: String) -> Steer {
        let ended = self.end(&mut s, SeqOutput::Error(message));
        drop(s);
        self.after(ended);
        Steer::DropAndPause
    }

    fn on_token(self: &Arc<Self>, model: ModelIndex, t: DrivenToken<'_>) -> Steer {
        let mut s = self.state.lock();
        if s.done || model != s.active {
            return Steer::DropAndPause;
        }
        let n = self.info.names.len();
        let start = s.algorithm.start().min(n - 1);
        let first = s.handoffs == 0 && s.tokens.len() as u32 == self.info.prompt_len;
        let route = match t.stats {
            // The first token written elsewhere than the algorithm's start model (a prefill
            // worker's, or a reservation's local fallback): the start model takes over, keeping
            // a prefill worker's token (it is the answer's first) and rewriting a local one.
            _ if first && start != model => Route::Handoff {
                to: start,
                keep: t.stats.is_none(),
            },
            None => Route::Stay,
            Some(stats) => {
                let since = s.tokens.len() - s.span_start + 1;
                let position = s.tokens.len() as u32 - self.info.prompt_len;
                let State {
                    algorithm, tokens, ..
                } = &mut *s;
                algorithm.route(&StepView {
                    model,
                    models: n,
                    token: t.token,
                    prob: stats.prob,
                    entropy: stats.entropy,
                    margin: stats.margin,
                    position,
                    since_switch: since as u32,
                    tokens,
                    prompt_len: self.info.prompt_len,
                })
            }
        };
        let (to, keep) = match route {
            Route::Handoff { to, keep } if to != model && to < n => (to, keep),
            _ => (model, true),
        };
        // A token that ends the request is kept where it is: nothing is left to hand off.
        let (to, keep) = if keep && self.ends(&s, t.token) {
            (model, true)
        } else if !keep && to != model && !s.holds_pending[to] && s.seen[to] == s.tokens.len() {
            // The peer dropped its last token and nothing was accepted since: it could not
            // resume from an empty suffix, so this token is kept.
            (to, true)
        } else {
            (to, keep)
        };
        let generated = Generated {
            id: t.token,
            logprobs: t.logprobs.map(|lp| Box::new(lp.clone())),
            prompt_logprobs: Vec::new(),
        };
        if keep && !self.accept(&mut s, model, generated) {
            // The client is gone.
            return self.abort(s, "client gone".into());
        }
        if to == model {
            return Steer::Keep;
        }
        // Hand off: the span the active model wrote goes back through `receive`.
        let span = s.tokens[s.span_start..].to_vec();
        let accepted = s.algorithm.receive(model, &span);
        if accepted != span.len() {
            let msg = format!(
                "handoff algorithm accepted {accepted} of {} tokens: rolling back accepted \
                 tokens is not supported",
                span.len()
            );
            return self.abort(s, msg);
        }
        let suffix = s.tokens[s.seen[to]..].to_vec();
        let payload = s.algorithm.send(to, &suffix);
        let Some(seq) = s.seqs[to] else {
            let msg = format!(
                "subserver {} holds no sequence for the request",
                self.info.names[to]
            );
            return self.abort(s, msg);
        };
        s.seen[to] = s.tokens.len();
        s.holds_pending[model] = keep;
        s.holds_pending[to] = true;
        s.active = to;
        s.span_start = s.tokens.len();
        s.handoffs += 1;
        s.handed_at = Some(Instant::now());
        self.stats.handoff(model, to);
        drop(s);
        self.inter.send(Work::Append {
            request: self.clone(),
            model: to,
            seq,
            tokens: payload,
            resume: true,
        });
        if keep {
            Steer::KeepAndPause
        } else {
            Steer::DropAndPause
        }
    }

    fn on_end(&self, model: ModelIndex, end: DrivenEnd) {
        let ended = {
            let mut s = self.state.lock();
            match end {
                DrivenEnd::Finished { reason, usage } => {
                    if model == s.algorithm.start().min(self.info.names.len() - 1) {
                        s.cached_tokens = usage.cached_tokens;
                    }
                    let usage = self.usage(&s);
                    self.end(&mut s, SeqOutput::Finished { reason, usage })
                }
                DrivenEnd::Cancelled => {
                    let usage = self.usage(&s);
                    self.end(
                        &mut s,
                        SeqOutput::Finished {
                            reason: FinishReason::Cancelled,
                            usage,
                        },
                    )
                }
                DrivenEnd::Failed(msg) => self.end(
                    &mut s,
                    SeqOutput::Error(format!(
                        "subserver {} failed: {msg}",
                        self.info.names[model]
                    )),
                ),
            }
        };
        self.after(ended);
    }
}

/// A request as one subserver's engine sees it.
#[derive(Debug)]
struct Driver {
    request: Arc<Request>,
    model: ModelIndex,
}

impl SeqDriver for Driver {
    fn on_token(&self, token: DrivenToken<'_>) -> Steer {
        self.request.on_token(self.model, token)
    }

    fn on_end(&self, end: DrivenEnd) {
        self.request.on_end(self.model, end);
    }
}

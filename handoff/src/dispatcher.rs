//! The external-dispatcher baseline: one server per model and a dispatcher in front. Every span
//! is a fresh request to the model that writes it (the whole sequence so far as its prompt:
//! admission, prefix matching and cache bookkeeping each time), cancelled when the algorithm
//! hands off. What TokenRouter measured against; handoff-resume removes that per-span work.

use std::sync::Arc;

use dolphin_engine::{
    DriveStart, DrivenEnd, DrivenToken, EngineError, FinishReason, Generated, ModelTokens,
    OutputStream, SeqDriver, SeqOutput, SeqRequest, SeqUsage, Steer,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::algorithm::{HandoffAlgorithm, ModelIndex, Route, StepView};
use crate::group::Subserver;
use crate::spec::AlgorithmSpec;

/// One server per model with a dispatcher in front (a baseline, not for serving).
#[derive(Debug)]
pub struct Dispatcher {
    subservers: Vec<Subserver>,
    default: AlgorithmSpec,
}

/// What a span reports to its request's dispatcher task.
#[derive(Debug)]
enum Event {
    Token(Generated),
    /// The span ended by a handoff to `to` (after the last token reported).
    Handoff(ModelIndex),
    End(DrivenEnd),
}

/// The algorithm and span bookkeeping, shared by the request's task and its current span.
#[derive(Debug)]
struct Shared {
    algorithm: Box<dyn HandoffAlgorithm>,
    /// Prompt and accepted tokens.
    tokens: Vec<u32>,
    prompt_len: u32,
    max_tokens: u32,
    /// Trace replay's end (`Sampling::end_after`).
    end_after: Option<u32>,
    stops: Vec<u32>,
    span_start: usize,
    models: usize,
}

#[derive(Debug)]
struct SpanDriver {
    model: ModelIndex,
    shared: Arc<Mutex<Shared>>,
    events: mpsc::UnboundedSender<Event>,
}

impl SeqDriver for SpanDriver {
    fn on_token(&self, t: DrivenToken<'_>) -> Steer {
        let mut s = self.shared.lock();
        let stats = t.stats.unwrap_or_default();
        let since = (s.tokens.len() - s.span_start + 1) as u32;
        let position = s.tokens.len() as u32 - s.prompt_len;
        let (models, prompt_len) = (s.models, s.prompt_len);
        let Shared {
            algorithm, tokens, ..
        } = &mut *s;
        let route = algorithm.route(&StepView {
            model: self.model,
            models,
            token: t.token,
            prob: stats.prob,
            entropy: stats.entropy,
            margin: stats.margin,
            position,
            since_switch: since,
            tokens,
            prompt_len,
        });
        let generated = s.tokens.len() as u32 + 1 - s.prompt_len;
        let ends = s.stops.contains(&t.token)
            || generated >= s.max_tokens
            || s.end_after.is_some_and(|n| generated >= n);
        let (to, keep) = match route {
            Route::Handoff { to, keep } if to != self.model && to < models && !(keep && ends) => {
                (to, keep)
            }
            _ => (self.model, true),
        };
        if keep {
            s.tokens.push(t.token);
            let _ = self.events.send(Event::Token(Generated {
                id: t.token,
                logprobs: t.logprobs.map(|lp| Box::new(lp.clone())),
                prompt_logprobs: Vec::new(),
            }));
        }
        if to == self.model {
            return Steer::Keep;
        }
        s.span_start = s.tokens.len();
        let _ = self.events.send(Event::Handoff(to));
        if keep {
            Steer::KeepAndPause
        } else {
            Steer::DropAndPause
        }
    }

    fn on_end(&self, end: DrivenEnd) {
        let _ = self.events.send(Event::End(end));
    }
}

impl Dispatcher {
    /// A dispatcher over one server per model.
    pub fn new(subservers: Vec<Subserver>, default: AlgorithmSpec) -> Self {
        Self {
            subservers,
            default,
        }
    }

    /// Serves a request: spans as fresh requests until one finishes. The output has the group's
    /// shape (usage by model, handoffs).
    pub async fn generate(&self, req: SeqRequest) -> Result<OutputStream, EngineError> {
        let seed = req.sampling.seed.unwrap_or(0);
        let algorithm = self
            .default
            .build(seed)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let mut stops = req.sampling.stop_token_ids.clone();
        if !req.sampling.ignore_eos
            && let Some(eos) = self.subservers[0].engine.info().eos_token_id
        {
            stops.push(eos);
        }
        let active = algorithm.start().min(self.subservers.len() - 1);
        let shared = Arc::new(Mutex::new(Shared {
            algorithm,
            tokens: req.prompt.clone(),
            prompt_len: req.prompt.len() as u32,
            max_tokens: req.sampling.max_tokens,
            end_after: req.sampling.end_after,
            stops,
            span_start: req.prompt.len(),
            models: self.subservers.len(),
        }));
        let (out, rx) = mpsc::channel(req.sampling.max_tokens as usize + 2);
        let subservers = self.subservers.clone();
        tokio::spawn(run(subservers, req, shared, active, out));
        Ok(rx)
    }
}

/// One request: a fresh request per span.
async fn run(
    subservers: Vec<Subserver>,
    req: SeqRequest,
    shared: Arc<Mutex<Shared>>,
    mut active: ModelIndex,
    out: mpsc::Sender<SeqOutput>,
) {
    let prompt_len = req.prompt.len() as u32;
    let mut written = vec![0u32; subservers.len()];
    let mut handoffs = 0;
    let mut span = 0u32;
    let usage = |written: &[u32], handoffs: u32, tokens: usize| SeqUsage {
        prompt_tokens: prompt_len,
        completion_tokens: tokens as u32 - prompt_len,
        cached_tokens: 0,
        by_model: subservers
            .iter()
            .zip(written)
            .map(|(s, &tokens)| ModelTokens {
                model: s.name.clone(),
                tokens,
            })
            .collect(),
        handoffs,
        handoff_algorithm: String::new(),
    };
    loop {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let span_id = format!("{}#{span}", req.request_id);
        span += 1;
        let (prompt, generated) = {
            let s = shared.lock();
            (s.tokens.clone(), s.tokens.len() as u32 - prompt_len)
        };
        let mut sampling = req.sampling.clone();
        sampling.max_tokens = req.sampling.max_tokens - generated;
        // The span's prompt ends with the output so far: penalties, `min_tokens` and a format
        // read it as output.
        sampling.output_in_prompt = req.sampling.output_in_prompt + generated;
        sampling.end_after = req
            .sampling
            .end_after
            .map(|n| n.saturating_sub(generated).max(1));
        let span_req = SeqRequest {
            request_id: span_id.clone(),
            prompt,
            sampling,
        };
        let driver = Arc::new(SpanDriver {
            model: active,
            shared: shared.clone(),
            events: events_tx,
        });
        let engine = &subservers[active].engine;
        if let Err(e) = engine.drive(span_req, DriveStart::Active, driver).await {
            let _ = out.send(SeqOutput::Error(e.to_string())).await;
            return;
        }
        let next = loop {
            match events.recv().await {
                Some(Event::Token(t)) => {
                    written[active] += 1;
                    if out.send(SeqOutput::Token(t)).await.is_err() {
                        engine.cancel(&span_id);
                        return;
                    }
                }
                Some(Event::Handoff(to)) => break to,
                Some(Event::End(DrivenEnd::Finished { reason, .. })) => {
                    let n = shared.lock().tokens.len();
                    let _ = out
                        .send(SeqOutput::Finished {
                            reason,
                            usage: usage(&written, handoffs, n),
                        })
                        .await;
                    return;
                }
                Some(Event::End(DrivenEnd::Cancelled)) | None => {
                    let n = shared.lock().tokens.len();
                    let _ = out
                        .send(SeqOutput::Finished {
                            reason: FinishReason::Cancelled,
                            usage: usage(&written, handoffs, n),
                        })
                        .await;
                    return;
                }
                Some(Event::End(DrivenEnd::Failed(msg))) => {
                    let _ = out.send(SeqOutput::Error(msg)).await;
                    return;
                }
            }
        };
        // The span's request is done: drop it (its full blocks stay in the prefix cache).
        engine.cancel(&span_id);
        handoffs += 1;
        active = next;
    }
}

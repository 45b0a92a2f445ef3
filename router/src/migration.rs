//! Request migration: when the decode worker streaming a request dies or its connection breaks,
//! the request moves to another decode worker with its prompt plus every token already
//! streamed, and the client's stream goes on where it stopped.
//!
//! The new worker prefills the longer prompt (its prefix cache or a prefill worker may hold
//! part of it) and generates the tokens that remain of `max_tokens`. Sampling draws are a
//! function of the seed and the token's position, so greedy and seeded output equal an
//! uninterrupted run. The stream keeps its detokenizer and stop-string state, so the text goes
//! on without a gap or a repeat. Each move counts against `--max-migrations`.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use dolphin_cluster::WorkerId;
use dolphin_proto::v1;
use futures::FutureExt;
use futures::future::BoxFuture;
use tracing::Instrument;

use crate::dispatch::{Attempt, Dispatcher};
use crate::error::DispatchError;
use crate::metrics as m;
use crate::policy::Decision;

/// What a running request needs to move to another decode worker.
pub(crate) struct Migration {
    dispatcher: Arc<Dispatcher>,
    /// The prompt, then every token streamed so far.
    tokens: Vec<u32>,
    prompt_len: usize,
    sampling: v1::SamplingParams,
    force: Option<Decision>,
    limit: u32,
    migrations: u32,
    /// Workers that failed this request; a move never goes back to one.
    failed: Vec<WorkerId>,
    /// The request's deadline: a move has no more time than the request.
    deadline: Option<tokio::time::Instant>,
    /// The request's trace span: a move's route and dispatch spans go under it.
    span: tracing::Span,
    /// The move in progress and the failure that started it.
    running: Option<(
        BoxFuture<'static, Result<Attempt, DispatchError>>,
        DispatchError,
    )>,
}

impl fmt::Debug for Migration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Migration")
            .field("prompt_len", &self.prompt_len)
            .field("streamed", &self.streamed())
            .field("migrations", &self.migrations)
            .field("limit", &self.limit)
            .field("failed", &self.failed)
            .field("running", &self.running.is_some())
            .finish()
    }
}

/// What bounds a request wherever it runs: its forced path, its deadline and its trace span.
#[derive(Debug)]
pub(crate) struct RequestScope {
    pub(crate) force: Option<Decision>,
    pub(crate) deadline: Option<tokio::time::Instant>,
    pub(crate) span: tracing::Span,
}

impl Migration {
    /// For a request with `prompt` whose earlier attempts failed on `failed`, moving at most
    /// `limit` times.
    pub(crate) fn new(
        dispatcher: Arc<Dispatcher>,
        prompt: Vec<u32>,
        sampling: v1::SamplingParams,
        limit: u32,
        failed: Vec<WorkerId>,
        scope: RequestScope,
    ) -> Self {
        let RequestScope {
            force,
            deadline,
            span,
        } = scope;
        Self {
            dispatcher,
            prompt_len: prompt.len(),
            tokens: prompt,
            sampling,
            force,
            limit,
            migrations: 0,
            failed,
            deadline,
            span,
            running: None,
        }
    }

    /// Remembers tokens the current worker streamed.
    pub(crate) fn streamed_tokens(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
    }

    /// The request's sampling settings.
    pub(crate) fn sampling(&self) -> &v1::SamplingParams {
        &self.sampling
    }

    /// The request's prompt.
    pub(crate) fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    /// Tokens streamed so far.
    pub(crate) fn streamed(&self) -> u32 {
        (self.tokens.len() - self.prompt_len) as u32
    }

    /// The request's `max_tokens`.
    pub(crate) fn max_tokens(&self) -> u32 {
        self.sampling.max_tokens
    }

    /// The request's stop strings.
    pub(crate) fn stop_strings(&self) -> &[String] {
        &self.sampling.stop
    }

    /// Whether the stop string that ends the output stays in its text.
    pub(crate) fn include_stop_string(&self) -> bool {
        self.sampling.include_stop_str_in_output
    }

    /// Moves made so far.
    pub(crate) fn count(&self) -> u32 {
        self.migrations
    }

    /// Whether a move is in progress.
    pub(crate) fn running(&self) -> bool {
        self.running.is_some()
    }

    /// Starts moving the request after `err` ended its stream on `worker`; gives `err` back
    /// when the request may not move (the failure is the request's own, or the limit is
    /// reached).
    pub(crate) fn start(
        &mut self,
        worker: &WorkerId,
        err: DispatchError,
    ) -> Result<(), DispatchError> {
        // Not the worker's failure but the request's, or migration is off: the error as is.
        if !err.retryable() || self.limit == 0 {
            return Err(err);
        }
        if self.migrations >= self.limit {
            let reason = format!(
                "the limit of {} migrations per request is reached",
                self.limit
            );
            return Err(self.failure(err, reason));
        }
        self.migrations += 1;
        self.failed.push(worker.clone());
        tracing::warn!(worker = %worker, error = %err, streamed = self.streamed(), migration = self.migrations, "decode worker failed mid-stream; moving the request to another worker");
        let mut sampling = self.sampling.clone();
        sampling.max_tokens = self.sampling.max_tokens.saturating_sub(self.streamed());
        // The streamed tokens end the new prompt, and are output to the penalties,
        // `min_tokens` and the format.
        sampling.output_in_prompt = self.streamed();
        if self.streamed() > 0 {
            // Delivered with the first token; the longer prompt's would be another's.
            sampling.prompt_logprobs = None;
        }
        let dispatcher = Arc::clone(&self.dispatcher);
        let (tokens, force, exclude) = (self.tokens.clone(), self.force, self.failed.clone());
        let deadline = self.deadline;
        let call = async move {
            dispatcher
                .dispatch_once(&tokens, &sampling, force, &exclude, deadline)
                .await
        };
        self.running = Some((call.instrument(self.span.clone()).boxed(), err));
        Ok(())
    }

    /// Drives the move in progress: the new worker's attempt, or the error for the client.
    /// Must only be called while [`Migration::running`].
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Attempt, DispatchError>> {
        let Some((call, _)) = self.running.as_mut() else {
            return Poll::Ready(Err(DispatchError::NoDecodeWorkers));
        };
        let result = std::task::ready!(call.as_mut().poll(cx));
        let Some((_, cause)) = self.running.take() else {
            unreachable!("checked above");
        };
        Poll::Ready(match result {
            Ok(attempt) => {
                metrics::counter!(m::MIGRATIONS_TOTAL, "outcome" => "ok").increment(1);
                tracing::info!(worker = %attempt.route.decode.worker.id, streamed = self.streamed(), "request moved to another decode worker");
                Ok(attempt)
            }
            Err(reason) => Err(self.failure(cause, reason.to_string())),
        })
    }

    fn failure(&self, cause: DispatchError, reason: String) -> DispatchError {
        metrics::counter!(m::MIGRATIONS_TOTAL, "outcome" => "failed").increment(1);
        DispatchError::MigrationFailed {
            cause: Box::new(cause),
            reason,
            tokens: self.streamed(),
            migrations: self.migrations,
        }
    }
}

//! Helpers shared by the group tests.

#![allow(dead_code)]

use std::sync::Arc;

use dolphin_engine::{OutputStream, SeqOutput, SeqUsage};
use dolphin_handoff::{HandoffAlgorithm, ModelIndex, Route, StepView};
use parking_lot::Mutex;

/// Wraps an algorithm and records, per kept token, which model wrote it (by generated position).
#[derive(Debug)]
pub struct Recording {
    pub inner: Box<dyn HandoffAlgorithm>,
    pub writers: Arc<Mutex<Vec<ModelIndex>>>,
}

impl Recording {
    pub fn new(inner: Box<dyn HandoffAlgorithm>) -> (Self, Arc<Mutex<Vec<ModelIndex>>>) {
        let writers = Arc::new(Mutex::new(Vec::new()));
        (
            Self {
                inner,
                writers: writers.clone(),
            },
            writers,
        )
    }
}

impl HandoffAlgorithm for Recording {
    fn start(&self) -> ModelIndex {
        self.inner.start()
    }

    fn route(&mut self, step: &StepView<'_>) -> Route {
        let route = self.inner.route(step);
        let kept = !matches!(route, Route::Handoff { keep: false, .. });
        if kept {
            let mut w = self.writers.lock();
            assert_eq!(
                w.len() as u32,
                step.position,
                "positions are written in order"
            );
            w.push(step.model);
        }
        route
    }
}

/// Hands off at fixed generated positions (dropping on the way to the large model, keeping on
/// the way back), whatever the statistics say.
#[derive(Debug)]
pub struct Scripted {
    /// Positions at which the small model hands off (its token there is discarded).
    pub to_large: Vec<u32>,
    /// Tokens the large model writes per span.
    pub span: u32,
}

impl HandoffAlgorithm for Scripted {
    fn route(&mut self, step: &StepView<'_>) -> Route {
        match step.model {
            0 if self.to_large.contains(&step.position) => Route::Handoff { to: 1, keep: false },
            1 if step.since_switch >= self.span => Route::Handoff { to: 0, keep: true },
            _ => Route::Stay,
        }
    }
}

/// Reads a stream to its end: tokens, and the usage of `Finished` (or the error).
pub async fn collect(mut rx: OutputStream) -> Result<(Vec<u32>, SeqUsage), String> {
    let mut tokens = Vec::new();
    while let Some(item) = rx.recv().await {
        match item {
            SeqOutput::Token(t) => tokens.push(t.id),
            SeqOutput::Finished { usage, .. } => return Ok((tokens, usage)),
            SeqOutput::Error(e) => return Err(e),
        }
    }
    Err("stream ended without Finished".into())
}

//! The inter-model loop: the third loop beside the client and decoding loops. Engines report
//! handoffs from inside their steps; this task carries them out (appending the suffix to the
//! peer's paused sequence, cancelling a finished request's other sequences), so no engine calls
//! another while it holds its own lock.

use std::sync::Arc;

use dolphin_engine::{Engine, SeqId};
use tokio::sync::mpsc;

use crate::algorithm::ModelIndex;
use crate::request::Request;

/// Work for the inter-model loop.
#[derive(Debug)]
pub(crate) enum Work {
    /// Append `tokens` to `model`'s paused sequence; resume it (a handoff) or not (keeping its
    /// KV in step in the background).
    Append {
        request: Arc<Request>,
        model: ModelIndex,
        seq: SeqId,
        tokens: Vec<u32>,
        resume: bool,
    },
    /// Drop the request in these subservers.
    Cancel {
        request_id: String,
        models: Vec<ModelIndex>,
    },
}

/// Handle on the inter-model loop.
#[derive(Clone, Debug)]
pub(crate) struct InterModel {
    tx: mpsc::UnboundedSender<Work>,
}

impl InterModel {
    /// Starts the loop over `engines` (on the current Tokio runtime); it ends when every handle
    /// is dropped.
    pub(crate) fn spawn(engines: Vec<Arc<dyn Engine>>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(engines, rx));
        Self { tx }
    }

    pub(crate) fn send(&self, work: Work) {
        // The loop outlives every request (it holds no handle of its own), so this only fails
        // while the group is being dropped, when there is nothing left to do.
        let _ = self.tx.send(work);
    }
}

async fn run(engines: Vec<Arc<dyn Engine>>, mut rx: mpsc::UnboundedReceiver<Work>) {
    while let Some(work) = rx.recv().await {
        match work {
            Work::Append {
                request,
                model,
                seq,
                tokens,
                resume,
            } => {
                if let Err(e) = engines[model].append(seq, &tokens, resume) {
                    request.fail(format!("handoff to subserver {model} failed: {e}"));
                }
            }
            Work::Cancel { request_id, models } => {
                for m in models {
                    engines[m].cancel(&request_id);
                }
            }
        }
    }
}

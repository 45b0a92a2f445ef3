//! Ending sequences: release (blocks back to the pool, deferred while the sequence is in the
//! running step), fail, finish, cancel, and failing everything at shutdown.

use super::seq::{Phase, Seq};
use super::state::Core;
use crate::backend::Backend;
use crate::drive::DrivenEnd;
use crate::error::{BackendError, EngineError};
use crate::types::{FinishReason, SeqId, SeqOutput};

impl<B: Backend> Core<B> {
    /// Removes a sequence and returns its blocks and reservation to the pool. The blocks of a
    /// sequence in the running step go back only when the step returns (the backend may still
    /// write them). The returned sequence has an empty table.
    pub(super) fn release(&mut self, id: SeqId) -> Option<Seq> {
        let mut seq = self.seqs.remove(&id)?;
        self.by_request.remove(&seq.request_id);
        let table = std::mem::take(&mut seq.table);
        if seq.in_step {
            self.deferred.push(table);
        } else {
            self.pool.release(&table);
        }
        // Reserved blocks are not allocated yet, so no step can touch them.
        self.pool.unreserve(seq.reserved);
        match seq.phase {
            Phase::Waiting => self.waiting.retain(|&w| w != id),
            Phase::Running => self.to_release.push(id),
            Phase::AwaitingKv { .. } => {}
        }
        Some(seq)
    }

    /// Ends a sequence with an error: the caller's reply or stream gets it.
    pub(super) fn fail(&mut self, id: SeqId, error: BackendError) {
        if let Some(mut seq) = self.release(id) {
            let msg = error.to_string();
            seq.fail(|| EngineError::Backend(error), SeqOutput::Error(msg));
        }
    }

    /// Ends a sequence normally: sends `Finished` and frees it.
    pub(super) fn finish(&mut self, id: SeqId, reason: FinishReason) {
        let Some(seq) = self.release(id) else {
            return;
        };
        if let Some(driver) = seq.driver() {
            driver.on_end(DrivenEnd::Finished {
                reason,
                usage: seq.usage(),
            });
        } else if let Some(out) = &seq.out {
            tracing::debug!(seq = id, request_id = %seq.request_id, ?reason, tokens = seq.generated, "finished");
            let _ = out.try_send(SeqOutput::Finished {
                reason,
                usage: seq.usage(),
            });
        }
    }

    /// Drops `running` entries released since (keeps admission order).
    pub(super) fn tidy(&mut self) {
        let seqs = &self.seqs;
        self.running.retain(|id| seqs.contains_key(id));
    }

    /// Drops a request wherever it is; an open stream gets `Finished { Cancelled }`, a pending
    /// `prefill` / `reserve` gets `Cancelled`.
    pub(super) fn cancel(&mut self, request_id: &str) -> bool {
        let Some(&id) = self.by_request.get(request_id) else {
            return false;
        };
        if let Some(mut seq) = self.release(id) {
            let usage = seq.usage();
            seq.fail(
                || EngineError::Cancelled,
                SeqOutput::Finished {
                    reason: FinishReason::Cancelled,
                    usage,
                },
            );
        }
        self.tidy();
        self.admit_waiting();
        true
    }

    /// Fails every sequence (the engine is going away).
    pub(super) fn shutdown(&mut self) {
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            if let Some(mut seq) = self.release(id) {
                seq.fail(
                    || EngineError::Shutdown,
                    SeqOutput::Error("engine shut down".into()),
                );
            }
        }
        self.tidy();
    }
}

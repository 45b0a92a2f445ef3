//! Driven sequences in the scheduler (see `crate::drive`): start one, append tokens another
//! model wrote, and turn a reservation whose KV arrived into one.

use std::sync::Arc;

use super::seq::Kind;
use super::state::{Core, commit_blocks};
use crate::backend::Backend;
use crate::drive::{DriveStart, DrivenToken, SeqDriver, Steer};
use crate::error::EngineError;
use crate::types::{Generated, SeqId, SeqRequest};

impl<B: Backend> Core<B> {
    /// Queues a driven sequence (admission as for `generate`: prompt plus `max_tokens` reserved).
    pub(super) fn drive(
        &mut self,
        req: SeqRequest,
        start: DriveStart,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<SeqId, EngineError> {
        let kind = Kind::Driven {
            driver,
            paused: start == DriveStart::Passive,
        };
        Ok(self.enqueue(req, kind)?.0)
    }

    /// Appends `tokens` to a paused driven sequence; with `resume` it computes them in one
    /// catch-up chunk, samples after the last and decodes on, else it stays paused (computing all
    /// but the last appended token when the loop has room).
    pub(super) fn append(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        resume: bool,
    ) -> Result<(), EngineError> {
        let vocab = self.info.vocab_size;
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(EngineError::UnknownSequence(id))?;
        let invalid = |msg: String| Err(EngineError::InvalidRequest(msg));
        let Kind::Driven { paused, .. } = &mut seq.kind else {
            return invalid(format!("sequence {id} is not driven"));
        };
        if !*paused {
            return invalid(format!("sequence {id} is not paused"));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t >= vocab) {
            return invalid(format!("token {t} is outside the vocabulary of {vocab}"));
        }
        let limit = seq.prompt_len as usize + seq.sampling.max_tokens as usize;
        if seq.tokens.len() + tokens.len() > limit {
            return invalid(format!(
                "appending {} tokens to sequence {id} passes its prompt plus max_tokens ({limit})",
                tokens.len()
            ));
        }
        if resume && seq.tokens.len() + tokens.len() == limit {
            return invalid(format!(
                "sequence {id} would resume with no token left to write"
            ));
        }
        seq.tokens.extend_from_slice(tokens);
        seq.generated = seq.tokens.len() as u32 - seq.prompt_len;
        *paused = !resume;
        Ok(())
    }

    /// All blocks of a reservation imported: it becomes a driven sequence that decodes on from
    /// the prefill worker's `first_token` (shown to the driver without statistics).
    pub(super) fn resume_driven(
        &mut self,
        id: SeqId,
        first: Generated,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        let first_token = first.id;
        self.check_imported(id, first_token)?;
        let bs = self.info.block_size;
        let eos = self.info.eos_token_id;
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(EngineError::UnknownSequence(id))?;
        seq.computed = seq.prompt_len;
        let steer = driver.on_token(DrivenToken {
            token: first_token,
            stats: None,
            logprobs: first.logprobs.as_deref(),
            tokens: &seq.tokens,
            prompt_len: seq.prompt_len,
        });
        let paused = steer != Steer::Keep;
        if steer != Steer::DropAndPause {
            seq.tokens.push(first_token);
            seq.generated = 1;
        }
        commit_blocks(&mut self.pool, seq, bs);
        let stop = (steer != Steer::DropAndPause)
            .then(|| seq.stop_reason(first_token, eos))
            .flatten();
        self.start_reserved(id, Kind::Driven { driver, paused });
        self.start_running(id);
        if let Some(reason) = stop {
            self.finish(id, reason);
        }
        Ok(())
    }

    /// Remote prefill failed: prefill the reservation here as a driven, active sequence.
    pub(super) fn resume_local_driven(
        &mut self,
        id: SeqId,
        driver: Arc<dyn SeqDriver>,
    ) -> Result<(), EngineError> {
        self.prefill_here(
            id,
            Kind::Driven {
                driver,
                paused: false,
            },
        )
    }
}

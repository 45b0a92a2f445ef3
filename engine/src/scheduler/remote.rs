//! The decode worker's remote path: import blocks into a reservation, then resume decoding with
//! the prefill worker's first token, or fall back to prefilling locally.

use tokio::sync::mpsc;

use super::seq::{Kind, Phase};
use super::state::{Core, commit_blocks};
use crate::backend::{Backend, ImportBlock, KvBlocks};
use crate::error::{BackendError, EngineError};
use crate::types::{Generated, OutputStream, SeqId, SeqOutput};

impl<B: Backend> Core<B> {
    /// Writes relative block `index` of a reservation after the backend checked the bytes.
    pub(super) fn import(&mut self, id: SeqId, index: u32, data: &[u8]) -> Result<(), EngineError> {
        let bs = self.info.block_size;
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(EngineError::UnknownSequence(id))?;
        let Phase::AwaitingKv { imported } = &mut seq.phase else {
            return Err(EngineError::InvalidRequest(format!(
                "sequence {id} is not awaiting KV"
            )));
        };
        let corrupt = |detail: String| EngineError::CorruptKv {
            seq: id,
            index,
            detail,
        };
        let Some(slot) = imported.get_mut(index as usize) else {
            return Err(corrupt(format!(
                "block index beyond the {} expected",
                imported.len()
            )));
        };
        let abs = seq.committed + index; // committed == cached blocks until resume
        let start = (abs * bs) as usize;
        let end = (start + bs as usize).min(seq.prompt_len as usize);
        let import = ImportBlock {
            seq: id,
            index: abs,
            block: seq.table[abs as usize],
            parent: (abs as usize).checked_sub(1).map(|p| seq.hashes[p]),
            tokens: &seq.tokens[start..end],
        };
        // Under the lock, concurrently with a running step: the block belongs to this reservation
        // alone, which no batch includes (see `crate::backend` for the rule).
        match self.kv.import_block(import, data) {
            Ok(()) => {
                *slot = true;
                Ok(())
            }
            Err(BackendError::Corrupt(detail)) => Err(corrupt(detail)),
            Err(e) => Err(EngineError::Backend(e)),
        }
    }

    /// Every block imported: the sequence decodes from `first_token` (streamed first).
    /// Prompt tokens whose KV sequence `id` awaits from elsewhere (after its cached blocks).
    pub(super) fn awaited_tokens(&self, id: SeqId) -> Result<u32, EngineError> {
        let seq = self.seqs.get(&id).ok_or(EngineError::UnknownSequence(id))?;
        Ok(seq
            .prompt_len
            .saturating_sub(seq.committed * self.info.block_size))
    }

    pub(super) fn resume(
        &mut self,
        id: SeqId,
        first: Generated,
    ) -> Result<OutputStream, EngineError> {
        let first_token = first.id;
        self.check_imported(id, first_token)?;
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(EngineError::UnknownSequence(id))?;
        seq.computed = seq.prompt_len;
        self.start_reserved(id, Kind::Generate);
        let rx = self.open_stream(id)?;
        let bs = self.info.block_size;
        let eos = self.info.eos_token_id;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return Ok(rx);
        };
        commit_blocks(&mut self.pool, seq, bs);
        seq.tokens.push(first_token);
        seq.generated = 1;
        if let Some(out) = &seq.out {
            let _ = out.try_send(SeqOutput::Token(first));
        }
        match seq.stop_reason(first_token, eos) {
            Some(reason) => self.finish(id, reason),
            None => self.start_running(id),
        }
        Ok(rx)
    }

    /// Checks that a reservation may resume with `first_token`: every block imported.
    pub(super) fn check_imported(&self, id: SeqId, first_token: u32) -> Result<(), EngineError> {
        if first_token >= self.info.vocab_size {
            return Err(EngineError::InvalidRequest(format!(
                "first token {first_token} is outside the vocabulary"
            )));
        }
        let seq = self.seqs.get(&id).ok_or(EngineError::UnknownSequence(id))?;
        let Phase::AwaitingKv { imported } = &seq.phase else {
            return Err(EngineError::InvalidRequest(format!(
                "sequence {id} is not awaiting KV"
            )));
        };
        let missing = imported.iter().filter(|&&ok| !ok).count();
        if missing > 0 {
            return Err(EngineError::InvalidRequest(format!(
                "{missing} of {} blocks not imported",
                imported.len()
            )));
        }
        Ok(())
    }

    /// Remote prefill failed: prefill the reservation here (whatever was imported is recomputed).
    pub(super) fn resume_local(&mut self, id: SeqId) -> Result<OutputStream, EngineError> {
        self.prefill_here(id, Kind::Generate)?;
        self.open_stream(id)
    }

    /// A reservation whose remote prefill failed computes its prompt here, as `kind`.
    pub(super) fn prefill_here(&mut self, id: SeqId, kind: Kind) -> Result<(), EngineError> {
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(EngineError::UnknownSequence(id))?;
        if !matches!(seq.phase, Phase::AwaitingKv { .. }) {
            return Err(EngineError::InvalidRequest(format!(
                "sequence {id} is not awaiting KV"
            )));
        }
        seq.computed = seq.cached_tokens;
        self.start_reserved(id, kind);
        self.start_running(id);
        Ok(())
    }

    /// Turns an awaiting sequence into a computing one of `kind` at `computed` tokens of KV; the
    /// backend starts it before its first step.
    pub(super) fn start_reserved(&mut self, id: SeqId, kind: Kind) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.kind = kind;
            seq.phase = Phase::Running;
            self.to_start.push(id);
        }
    }

    /// Opens a sequence's output stream (room for every token and the final message).
    fn open_stream(&mut self, id: SeqId) -> Result<OutputStream, EngineError> {
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(EngineError::UnknownSequence(id))?;
        let (tx, rx) = mpsc::channel(seq.sampling.max_tokens as usize + 2);
        seq.out = Some(tx);
        Ok(rx)
    }
}

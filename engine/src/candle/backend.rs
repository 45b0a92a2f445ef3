//! `CandleBackend`: the [`Backend`] over a real llama model and its paged KV memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use candle_core::{DType, Device};

use super::attention::Span;
use super::config::{CandleConfig, DeviceKind};
use super::error::LoadError;
use super::kv_store::{KvStore, compute};
use super::model::{Llama, LoadOptions};
use super::sampler::{Sampler, token_stats};
use super::vocab::token_space;
use crate::backend::{Backend, Batch, ImportBlock, KvBlocks, SeqStart};
use crate::error::BackendError;
use crate::types::{BlockId, EngineInfo, Sampled, SeqId};
use dolphin_grammar::{GrammarError, TokenSpace};

/// A llama model on candle with its KV memory, under the shared scheduler.
#[derive(Debug)]
pub struct CandleBackend {
    info: EngineInfo,
    model: Llama,
    kv: Arc<CandleBlocks>,
    /// Per started sequence: its sampler and whether it wants token statistics.
    samplers: HashMap<SeqId, (Sampler, bool)>,
    /// The model's vocabulary for structured output, or why there is none.
    formats: Result<Arc<TokenSpace>, GrammarError>,
    /// Sequences of the last step that failed alone.
    failures: Vec<(SeqId, BackendError)>,
    /// Per-step buffers, kept to avoid reallocating.
    tokens: Vec<u32>,
    logit_rows: Vec<usize>,
    /// What each logits row is for: the entry it belongs to, and the prompt position it
    /// scores (`None`: the entry's draw).
    row_uses: Vec<(usize, Option<u32>)>,
}

impl CandleBackend {
    /// Loads the model of `cfg` and allocates its KV memory.
    pub fn load(cfg: &CandleConfig) -> Result<CandleBackend, LoadError> {
        let cfg = &cfg.resolved()?;
        let device = match cfg.device {
            DeviceKind::Cpu => Device::Cpu,
            DeviceKind::Cuda(i) => Device::new_cuda(i)?,
        };
        if cfg.block_size == 0 {
            return Err(LoadError::Config("block_size must be at least 1".into()));
        }
        let opts = LoadOptions {
            format: cfg.weights,
            pad: cfg.pads(),
            block_size: cfg.block_size as usize,
            max_context: cfg.max_context.map(|c| c as usize),
            layers: cfg.layers.map(|n| n as usize),
            tiled: cfg.tiled(),
        };
        let model = Llama::load(&cfg.model_path, opts, &device)?;
        let p = &model.params;
        let per_token = p.kv_bytes_per_token();
        let total_blocks = cfg.total_blocks(per_token);
        if total_blocks == 0 {
            return Err(LoadError::Config(format!(
                "a KV budget of {} bytes holds no block of {} tokens ({per_token} bytes per token)",
                cfg.kv_bytes, cfg.block_size
            )));
        }
        let total_blocks = u32::try_from(total_blocks)
            .map_err(|_| LoadError::Config(format!("{total_blocks} KV blocks is too many")))?;
        let kv = KvStore::new(
            p.n_layer,
            total_blocks as usize,
            cfg.block_size as usize,
            p.kv_dim(),
            &device,
        )?;
        let info = EngineInfo {
            model: cfg.model.clone(),
            engine: "candle",
            block_size: cfg.block_size,
            total_blocks,
            kv_bytes_per_token: per_token,
            kv_layout: p.kv_layout(),
            context_length: model.max_positions() as u32,
            vocab_size: p.vocab_size as u32,
            eos_token_id: p.eos_token_id,
            step_limits: None,
        };
        let formats = token_space(&cfg.model_path, cfg.tokenizer.as_ref(), &info);
        tracing::info!(model = %info.model, path = %cfg.model_path.display(), weights = %cfg.weights,
            padded = cfg.pads(), layers = p.n_layer, hidden = p.hidden, total_blocks,
            kv_bytes_per_token = per_token, "candle model loaded");
        Ok(CandleBackend {
            info,
            model,
            kv: Arc::new(CandleBlocks(kv)),
            samplers: HashMap::new(),
            formats,
            failures: Vec::new(),
            tokens: Vec::new(),
            logit_rows: Vec::new(),
            row_uses: Vec::new(),
        })
    }

    /// Checks that `table` covers `tokens` positions with blocks inside the pool.
    fn check_table(
        &self,
        seq: SeqId,
        table: &[BlockId],
        tokens: usize,
    ) -> Result<(), BackendError> {
        let bs = self.info.block_size as usize;
        let needed = tokens.div_ceil(bs);
        let Some(used) = table.get(..needed) else {
            return Err(BackendError::Invalid(format!(
                "sequence {seq}: {} blocks do not cover {tokens} tokens",
                table.len()
            )));
        };
        if let Some(b) = used.iter().find(|&&b| b >= self.info.total_blocks) {
            return Err(BackendError::Invalid(format!(
                "sequence {seq}: block {b} is outside the pool"
            )));
        }
        if tokens > self.model.max_positions() {
            return Err(BackendError::Invalid(format!(
                "sequence {seq}: position {tokens} is past the context length"
            )));
        }
        Ok(())
    }
}

/// A request's format that cannot be served, as the sequence's failure.
pub(crate) fn invalid(e: GrammarError) -> BackendError {
    BackendError::Invalid(e.to_string())
}

/// A seed for requests that name none: differs per sequence and per run.
fn fallback_seed(seq: SeqId) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    xxhash_rust::xxh3::xxh3_64_with_seed(&seq.to_le_bytes(), nanos)
}

/// The candle backend's KV memory as the scheduler sees it. Export and import go straight to the
/// KV tensors: each read or write of a layer's storage takes that tensor's lock, so they may run
/// beside a step (on other blocks, by the scheduler's rule; see `crate::backend`).
#[derive(Debug)]
pub struct CandleBlocks(KvStore);

impl KvBlocks for CandleBlocks {
    fn export_block(
        &self,
        block: BlockId,
        _index: u32,
        filled: u32,
    ) -> Result<Bytes, BackendError> {
        self.0.export_block(block, filled as usize)
    }

    fn import_block(&self, import: ImportBlock<'_>, data: &[u8]) -> Result<(), BackendError> {
        self.0.import_block(import.block, import.tokens.len(), data)
    }
}

impl Backend for CandleBackend {
    type Blocks = CandleBlocks;

    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn blocks(&self) -> Arc<CandleBlocks> {
        self.kv.clone()
    }

    fn start(&mut self, start: SeqStart<'_>) -> Result<(), BackendError> {
        self.check_table(start.seq, start.table, start.computed as usize)?;
        let mut sampler = Sampler::new(start.sampling, fallback_seed(start.seq));
        if let Some(format) = &start.sampling.format {
            let space = self.formats.as_ref().map_err(|e| invalid(e.clone()))?;
            let constraint = space.constrain(format).map_err(invalid)?;
            sampler = sampler.following(constraint, start.sampling.format_after.clone());
        }
        let sampler = sampler.for_text(
            start.prompt,
            start.output,
            start.computed,
            self.info
                .eos_token_id
                .filter(|_| !start.sampling.ignore_eos),
        );
        self.samplers.insert(start.seq, (sampler, start.stats));
        Ok(())
    }

    fn step(
        &mut self,
        batch: &Batch,
        sampled: &mut [Option<Sampled>],
    ) -> Result<Duration, BackendError> {
        self.tokens.clear();
        self.logit_rows.clear();
        self.row_uses.clear();
        let mut spans = Vec::with_capacity(batch.len());
        for (i, e) in batch.entries().iter().enumerate() {
            let table = batch.table(e);
            let len = e.len() as usize;
            self.check_table(e.seq, table, e.position as usize + len)?;
            let Some((sampler, _)) = self.samplers.get_mut(&e.seq) else {
                return Err(BackendError::Invalid(format!(
                    "sequence {} was not started",
                    e.seq
                )));
            };
            // The penalties count what the model reads, whoever drew it.
            sampler.observe(e.position, batch.tokens(e));
            let start = self.tokens.len();
            self.tokens.extend_from_slice(batch.tokens(e));
            spans.push(Span {
                start,
                len,
                position: e.position as usize,
                table,
            });
            // Rows that score the prompt (a request for its log probabilities), then the draw.
            for p in sampler.prompt_rows(e.position, e.len())? {
                self.logit_rows.push(start + (p - e.position) as usize);
                self.row_uses.push((i, Some(p)));
            }
            if e.sample {
                self.logit_rows.push(start + len - 1);
                self.row_uses.push((i, None));
            }
        }
        let logits = self
            .model
            .forward(&self.kv.0, &self.tokens, &spans, &self.logit_rows)
            .map_err(compute)?;
        let Some(logits) = logits else {
            return Ok(Duration::ZERO);
        };
        let vocab = self.info.vocab_size as usize;
        let logits = logits
            .to_dtype(DType::F32)
            .and_then(|l| l.flatten_all())
            .and_then(|l| l.to_vec1::<f32>())
            .map_err(compute)?;
        let entries = batch.entries();
        for (r, &(i, scores)) in self.row_uses.iter().enumerate() {
            let e = &entries[i];
            let (sampler, stats) = self.samplers.get_mut(&e.seq).ok_or_else(|| {
                BackendError::Invalid(format!("sequence {} was not started", e.seq))
            })?;
            let row = &logits[r * vocab..(r + 1) * vocab];
            if let Some(p) = scores {
                sampler.score_prompt(p, row);
                continue;
            }
            let token = match sampler.sample(row, e.position + e.len())? {
                Ok(token) => token,
                Err(why) => {
                    self.failures.push((e.seq, why));
                    continue;
                }
            };
            sampled[i] = Some(Sampled {
                token,
                stats: if *stats {
                    token_stats(row, token)
                } else {
                    Default::default()
                },
                logprobs: sampler.logprobs(row, token),
                prompt_logprobs: sampler.take_prompt_scores(),
            });
        }
        Ok(Duration::ZERO)
    }

    fn release(&mut self, seq: SeqId) {
        self.samplers.remove(&seq);
    }

    fn take_failures(&mut self, failed: &mut Vec<(SeqId, BackendError)>) {
        failed.append(&mut self.failures);
    }
}

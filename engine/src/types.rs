//! Plain data exchanged between the engine and its callers (the workers).

use std::num::NonZeroU32;
use std::time::Duration;

use dolphin_cluster::BlockHash;
pub use dolphin_grammar::Format;
use dolphin_kv_block::KvBlock;

use crate::scheduler::policy::StepLimits;

/// Engine-internal id of a request, unique for the engine's lifetime.
pub type SeqId = u64;

/// Index of a KV block in an engine's block pool.
pub type BlockId = u32;

/// How to pick the next token. Mirrors `dolphin.v1.SamplingParams`, with stop strings already
/// turned into token ids by the caller.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens (`None`: all).
    pub top_k: Option<NonZeroU32>,
    /// Keep the most likely tokens whose probabilities add up to this share, in (0, 1)
    /// (`None`: all).
    pub top_p: Option<f32>,
    /// Seed for reproducible sampling; `None` means the engine picks one.
    pub seed: Option<u64>,
    /// Generate at most this many tokens (at least 1).
    pub max_tokens: u32,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Stop (reason `Stop`) after producing any of these tokens; the token is still streamed.
    pub stop_token_ids: Vec<u32>,
    /// On a model group: the handoff algorithm for this request (`None`: the group's default).
    /// Engines serving one model ignore it.
    pub handoff: Option<HandoffChoice>,
    /// Trace replay: end (reason `Stop`, as at end of sequence) after this many tokens, the
    /// traced output's length; admission still reserves `max_tokens`, the client's cap.
    pub end_after: Option<u32>,
    /// Penalties on tokens already in the text and other changes to the logits before a draw.
    pub logits: LogitRules,
    /// Produce at least this many tokens: end-of-sequence and `stop_token_ids` cannot be drawn
    /// before (and do not stop the sequence).
    pub min_tokens: u32,
    /// Report each generated token's log probability and those of the `k` most likely tokens
    /// of its step (`None`: no log probabilities; at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<u32>,
    /// Report the prompt's log probabilities too (each prompt token's after the first, with
    /// this many alternatives): the prompt is then computed whole, never read from the prefix
    /// cache, and they come with the first generated token. At most [`MAX_TOP_LOGPROBS`].
    pub prompt_logprobs: Option<u32>,
    /// The format the output must follow (structured output): every draw is masked to the
    /// tokens that continue it, and once it is complete only the end of sequence may follow.
    /// `None`: free text.
    pub format: Option<Format>,
    /// The format starts once the output has these tokens (a reasoning model's `</think>`):
    /// before them the output is free and the format reads nothing. Empty: at once.
    pub format_after: Vec<u32>,
    /// The prompt's last this many tokens are output an earlier worker generated (a migrated
    /// request): the penalties, `min_tokens` and the format count them as output. Less than
    /// the prompt's length.
    pub output_in_prompt: u32,
    /// The seed of the sequence's first block hash where the request has a cache salt
    /// ([`dolphin_cluster::salted_root`]): its blocks are shared only with requests of the same
    /// salt. `None`: [`dolphin_cluster::ROOT_SEED`], shared with every unsalted request.
    pub cache_root: Option<u64>,
    /// Where the request queues among others (vLLM's `priority`): lower first, under a
    /// scheduler with [`SchedulingPolicy::Priority`](crate::SchedulingPolicy); 0
    /// under the default, which refuses any other value.
    pub priority: i32,
}

/// Most alternatives a request may ask log probabilities for (vLLM's default `max_logprobs`
/// and OpenAI's `top_logprobs` cap).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Changes to a draw's logits, applied in this order before temperature, top-k and top-p (as
/// vLLM orders them). The default changes nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogitRules {
    /// Added to these tokens' logits (OpenAI's `logit_bias`).
    pub bias: Vec<(u32, f32)>,
    /// Every token of the prompt and of the output so far: a positive logit divided by it, a
    /// negative one multiplied (`None`: 1, no penalty).
    pub repetition_penalty: Option<f32>,
    /// Subtracted from the logit of every token the output holds.
    pub presence_penalty: f32,
    /// Times the number of times the output holds a token, subtracted from its logit.
    pub frequency_penalty: f32,
    /// After temperature: tokens less likely than this share of the most likely one's
    /// probability are dropped (`None`: none).
    pub min_p: Option<f32>,
    /// Only these tokens may be drawn, sorted and distinct (vLLM's `allowed_token_ids`);
    /// empty: any.
    pub allowed: Vec<u32>,
    /// Token sequences the output may not hold (vLLM's `bad_words`, tokenized): a sequence's
    /// last token is masked where the output ends with the rest of it (always, for one token).
    pub bad_words: Vec<Vec<u32>>,
}

impl LogitRules {
    /// Whether a draw must know the tokens already in the text.
    pub fn needs_history(&self) -> bool {
        self.repetition_penalty.is_some()
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// How many of the output's last tokens the bad words compare (their longest less one).
    pub fn bad_word_context(&self) -> usize {
        self.bad_words
            .iter()
            .map(|w| w.len().saturating_sub(1))
            .max()
            .unwrap_or(0)
    }

    /// Whether the rules change anything.
    pub fn is_empty(&self) -> bool {
        *self == LogitRules::default()
    }
}

/// A request's choice of token-level handoff algorithm.
#[derive(Clone, Debug, PartialEq)]
pub struct HandoffChoice {
    /// Algorithm, optionally with parameters: `entropy`, `confidence:threshold=0.4,span=4`.
    /// Empty: the group's default algorithm.
    pub algorithm: String,
    /// Overrides the algorithm's main threshold.
    pub threshold: Option<f64>,
}

impl Default for Sampling {
    /// Greedy, 16 tokens, stop at end-of-sequence.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: None,
            max_tokens: 16,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            handoff: None,
            end_after: None,
            logits: LogitRules::default(),
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            format: None,
            format_after: Vec::new(),
            output_in_prompt: 0,
            cache_root: None,
            priority: 0,
        }
    }
}

/// What a request asks of the engine.
#[derive(Clone, Debug)]
pub struct SeqRequest {
    /// Caller's id (unique among the requests live in one engine); `cancel` takes it.
    pub request_id: String,
    /// Prompt token ids (non-empty, each below the vocabulary size).
    pub prompt: Vec<u32>,
    /// How to generate.
    pub sampling: Sampling,
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// Reached `max_tokens`.
    Length,
    /// Produced end-of-sequence or one of `stop_token_ids`.
    Stop,
    /// Cancelled by the caller.
    Cancelled,
}

/// Tokens one model of a group wrote for a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelTokens {
    /// The subserver's name.
    pub model: String,
    /// Completion tokens it wrote.
    pub tokens: u32,
}

/// Token counts of a finished request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqUsage {
    /// Prompt length.
    pub prompt_tokens: u32,
    /// Tokens generated (streamed) for the request.
    pub completion_tokens: u32,
    /// Prompt tokens whose KV came from this engine's prefix cache.
    pub cached_tokens: u32,
    /// On a model group: completion tokens by model (empty for one model).
    pub by_model: Vec<ModelTokens>,
    /// On a model group: handoffs between models.
    pub handoffs: u32,
    /// On a model group: the handoff algorithm the request ran (its spec); empty for one model.
    pub handoff_algorithm: String,
}

/// Log probabilities at one step, from the model's raw logits (before the request's logit
/// rules, temperature and truncation: vLLM's default `raw_logprobs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenLogprobs {
    /// The drawn token's.
    pub logprob: f32,
    /// The most likely tokens' (as many as the request asked for), most likely first.
    pub top: Vec<(u32, f32)>,
    /// The drawn token's rank: 1 for the most likely, 1 + the number of tokens with a higher
    /// probability (0: unknown).
    pub rank: u32,
}

/// A generated token as it is streamed.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// The token id.
    pub id: u32,
    /// Its log probabilities, when the request asked for them.
    pub logprobs: Option<Box<TokenLogprobs>>,
    /// On the first token of a request that asked for them (`Sampling::prompt_logprobs`): the
    /// log probabilities of the prompt's tokens after the first, in order. Empty otherwise.
    pub prompt_logprobs: Vec<TokenLogprobs>,
}

impl From<u32> for Generated {
    /// A token without log probabilities.
    fn from(id: u32) -> Self {
        Self {
            id,
            logprobs: None,
            prompt_logprobs: Vec::new(),
        }
    }
}

/// One event of a request's output stream. The stream ends after `Finished` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum SeqOutput {
    /// The next generated token.
    Token(Generated),
    /// The request is done.
    Finished {
        /// Why it stopped.
        reason: FinishReason,
        /// Token counts.
        usage: SeqUsage,
    },
    /// The request failed after it started streaming.
    Error(String),
}

/// A request's output, in order. Dropping it cancels the request at the engine's next step.
pub type OutputStream = tokio::sync::mpsc::Receiver<SeqOutput>;

/// Cache events emitted by the KV pool (converted to proto by the worker).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks newly stored in the prefix cache, as chained hashes in prompt order; `parent` is
    /// the hash of the block before the first one listed (`None` at the start of a prompt).
    Stored {
        /// Hash of the block preceding `hashes[0]`.
        parent: Option<BlockHash>,
        /// Consecutive chained block hashes.
        hashes: Vec<BlockHash>,
    },
    /// Blocks evicted from the prefix cache.
    Removed {
        /// Hashes no longer cached.
        hashes: Vec<BlockHash>,
    },
    /// Every cached block was dropped.
    Cleared,
}

/// Load of an engine at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadSnapshot {
    /// Admitted requests (prefilling, decoding, or holding a reservation for remote KV).
    pub running: u32,
    /// Requests queued for admission.
    pub waiting: u32,
    /// Blocks a new request can still get: free or evictable (cached, unreferenced), minus
    /// those reserved for admitted requests' future tokens.
    pub free_blocks: u32,
    /// Blocks in the pool.
    pub total_blocks: u32,
    /// Tokens held by admitted requests (prompt plus generated).
    pub active_tokens: u64,
    /// Prompt tokens queued or admitted and not yet prefilled.
    pub queued_prefill_tokens: u64,
}

/// What an engine serves, as its backend reports it (the pool geometry is the backend's: it
/// sized the KV memory) and the scheduler passes it on.
#[derive(Clone, Debug)]
pub struct EngineInfo {
    /// Served model name.
    pub model: String,
    /// Implementation: "sim" or "candle".
    pub engine: &'static str,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Blocks of KV memory in the pool.
    pub total_blocks: u32,
    /// Bytes of one token's KV as exported and moved on the wire (after the sim's byte scale).
    pub kv_bytes_per_token: u64,
    /// How exported KV blocks are laid out (engine, dtype, geometry), e.g.
    /// `candle/f32/layers=30/kv_heads=3/head_dim=64`: blocks move only between equal layouts.
    pub kv_layout: String,
    /// Longest prompt plus output the engine accepts.
    pub context_length: u32,
    /// Token ids are below this.
    pub vocab_size: u32,
    /// End-of-sequence token, if the model has one.
    pub eos_token_id: Option<u32>,
    /// What one step may compute, fixed when the scheduler that runs the backend starts (it
    /// sets them; a backend reports `None`). Static, so they are here and not in
    /// [`LoadSnapshot`], and reading them takes no lock.
    pub step_limits: Option<StepLimits>,
}

/// KV blocks of a prompt prefilled here, ready to push to a decode worker.
#[derive(Clone, Debug)]
pub struct PrefillOutput {
    /// The first generated token.
    pub first_token: u32,
    /// Its log probabilities, when the request asked for them.
    pub first_logprobs: Option<Box<TokenLogprobs>>,
    /// Prompt tokens found in this engine's prefix cache.
    pub cached_tokens: u32,
    /// Blocks `[skip_blocks, ceil(prompt / block_size))` of the prompt; the last may be partial.
    /// Each carries the checksum taken when it was exported.
    pub blocks: Vec<KvBlock>,
    /// Time from arrival to admission.
    pub queued: Duration,
    /// Time from admission to the first token.
    pub prefill: Duration,
}

/// Blocks reserved on a decode worker for a prompt whose KV comes from elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Sequence to pass to `import`, `resume`, `resume_local` (and whose request id `cancel` takes).
    pub seq: SeqId,
    /// Leading prompt blocks already held here (the prefill worker's `skip_blocks`).
    pub cached_blocks: u32,
    /// Blocks to import: `ceil(prompt / block_size) - cached_blocks` (at least 1).
    pub blocks_expected: u32,
}

/// Statistics of the distribution a token was drawn from (softmax of the step's logits at
/// temperature 1, before top-k / top-p): what token-level routing algorithms gate on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TokenStats {
    /// Probability of the drawn token.
    pub prob: f32,
    /// Entropy of the distribution, in nats.
    pub entropy: f32,
    /// Probability of the most likely token minus that of the second.
    pub margin: f32,
}

/// A token a backend sampled, with its step's statistics (all zero unless the sequence asked
/// for them: `SeqStart::stats`) and log probabilities (where its sampling asks for them).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its distribution's statistics.
    pub stats: TokenStats,
    /// Its log probabilities (`Sampling::logprobs`).
    pub logprobs: Option<Box<TokenLogprobs>>,
    /// With a sequence's first token: its prompt's log probabilities
    /// (`Sampling::prompt_logprobs`).
    pub prompt_logprobs: Vec<TokenLogprobs>,
}

impl Sampled {
    /// A token without statistics or log probabilities.
    pub fn token(token: u32) -> Self {
        Self {
            token,
            stats: TokenStats::default(),
            logprobs: None,
            prompt_logprobs: Vec::new(),
        }
    }
}

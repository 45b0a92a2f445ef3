//! Running one request: validate, tokenize, route, call the decode worker.
//!
//! Routing (block hashing, index lookups in both pools, selection, features, policy) is plain
//! synchronous code over thread-local scratch buffers, so it allocates nothing per request beyond
//! the prompt itself. The decode call is retried once on another worker when it fails before any
//! token arrived; after that, the response streams through [`ResponseStream`], which moves the
//! request to another worker if its worker fails mid-stream ([`crate::migration`]).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dolphin_cluster::{Role, WorkerId, otel};
use dolphin_proto::{deadline, v1};
use http::{HeaderName, HeaderValue};
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::dolphin::online;
use crate::dolphin::online_service::{
    Finished, LearnTicket, OnlineHost, OnlineService, OnlineSink,
};
use crate::dolphin::{Admission, DolphinRouting, MemoryStore, TableStore};
use crate::error::DispatchError;
use crate::grpc_call::GrpcStream;
use crate::metrics as m;
use crate::migration::{Migration, RequestScope};
use crate::policy::{DecidedBy, Decision, Features, Policy};
use crate::prompt_blocks::PromptBlocks;
use crate::request_log::RequestLog;
use crate::route::{PrefillChoice, Route, RouteError, RouteInput, route};
use crate::stream::{Api, RequestMeta, ResponseStream};
use crate::tokenizer::{ChatMessage, Specials, Tokenizer};
use crate::workers::{InflightGuard, RouteScratch, Routed, WorkerRegistry};
use dolphin_cluster::hot_metrics as hot;

/// Limits and weights of the dispatcher.
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// The served model.
    pub model: String,
    /// Longest prompt, in tokens.
    pub max_prompt_tokens: u32,
    /// Largest `max_tokens`.
    pub max_output_tokens: u32,
    /// Weight of uncached blocks against load in selection.
    pub overlap_weight: f64,
    /// Tokens per block.
    pub block_size: u32,
    /// Moves of one request to another decode worker after its worker failed mid-stream.
    pub max_migrations: u32,
    /// How chat answers are read for the calls a model chose to make (`None`: `tool_choice:
    /// "auto"` is refused).
    pub tool_call_parser: Option<crate::tools::ToolCallParser>,
    /// How chat answers are split into a reasoning model's thinking and its answer (`None`:
    /// not split).
    pub reasoning_parser: Option<crate::reasoning::ReasoningParser>,
    /// Whether a request may bring its own chat template (`chat_template`); refused when not.
    pub trust_request_chat_template: bool,
    /// Longest a request may run, first token to last, when the client sets no shorter limit
    /// (`None`: no limit).
    pub request_timeout: Option<Duration>,
}

/// The prompt of a request, in whichever form the client sent it.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Raw text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Chat messages, rendered with the tokenizer's template.
    Chat {
        /// The conversation.
        messages: Vec<ChatMessage>,
        /// What the request adds for the template: the tools the model may call, the
        /// template's own variables.
        extras: Box<crate::tokenizer::ChatExtras>,
    },
}

impl Prompt {
    /// Bytes of text the tokenizer has to read (0 for token ids).
    fn text_bytes(&self) -> usize {
        match self {
            Prompt::Text(t) => t.len(),
            // Tool schemas and calls are rendered into the prompt as JSON, which takes longer
            // than their size says: such requests always go to the blocking pool.
            // So do a request's own template (compiled for it) and documents.
            Prompt::Chat { extras, .. }
                if extras.tools.is_some()
                    || extras.template.is_some()
                    || extras.documents.is_some() =>
            {
                usize::MAX
            }
            Prompt::Chat { messages, .. } if messages.iter().any(|m| !m.tool_calls.is_empty()) => {
                usize::MAX
            }
            Prompt::Chat { messages, .. } => messages
                .iter()
                .map(|m| m.content.len() + m.role.len())
                .sum(),
            Prompt::Tokens(_) => 0,
        }
    }
}

/// Prompts with more text than this are tokenized on the blocking pool, not on the runtime
/// thread that serves the connection: a long prompt takes milliseconds to encode, which would
/// stall every other request on that thread. Shorter ones stay inline, where the hop to another
/// thread (tens of microseconds) would cost more than the encoding.
pub const INLINE_TOKENIZE_BYTES: usize = 4096;

/// How much longer than the router's own deadline the decode worker's copy of it runs. The
/// router is the authority: its timer fires first, answers DEADLINE_EXCEEDED and cancels the
/// worker's request. A worker timing out at the same instant answers CANCELLED ("Timeout
/// expired", tonic's status for a server-side timeout), which read as a worker failure and was
/// retried on another worker (seen replaying the Mooncake trace on the candle cluster: the
/// client got UNAVAILABLE for a request that had simply run out of time).
pub const WORKER_DEADLINE_SLACK: Duration = Duration::from_millis(50);

/// The `grpc-timeout` a decode worker is sent when `left` remains of the request's time.
pub(crate) fn worker_timeout(left: Duration) -> Duration {
    left + WORKER_DEADLINE_SLACK
}

/// One generation request, API-independent.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Request id (empty: the router assigns one).
    pub request_id: String,
    /// Model named by the client (empty: the served one).
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Sampling parameters (passed to the worker; `stop` strings are applied by the router).
    pub sampling: v1::SamplingParams,
    /// `sampling.max_tokens` is the server's default, not the client's: where the prompt
    /// leaves less room in the model's context, it shrinks to that room instead of being
    /// refused (as vLLM does).
    pub max_tokens_is_default: bool,
    /// A path forced by the client, bypassing the policy.
    pub force: Option<Decision>,
    /// SLO the request is measured against.
    pub slo: Option<v1::SloClass>,
    /// Which front end it came through.
    pub api: Api,
    /// The client's own time limit (gRPC `grpc-timeout`); the router's default applies too,
    /// whichever ends first.
    pub timeout: Option<Duration>,
    /// The W3C trace context the client sent: the request's trace continues it.
    pub trace: TraceHeaders,
    /// The request's field that `sampling.structured` came from, named when the format does
    /// not compile (`structured` over gRPC; `response_format`, `tools`, ... over HTTP).
    pub format_field: &'static str,
    /// Keep only the prompt's last this many tokens (vLLM's `truncate_prompt_tokens`); `None`:
    /// the whole prompt, refused when longer than the limit.
    pub truncate_prompt_tokens: Option<u32>,
    /// The answer is read for the calls the model chooses (`tool_choice: "auto"`): the
    /// control tokens that mark them are written out in its text.
    pub keep_call_markers: bool,
    /// Words the output may not contain (vLLM's `bad_words`): tokenized before routing into
    /// `sampling.logits.bad_words` ([`crate::bad_words`]).
    pub bad_words: Vec<String>,
    /// Whether the prompt starts with the model's BOS token where its tokenizer adds one
    /// (vLLM's `add_special_tokens`); `None`: a text prompt does (as vLLM's and llama.cpp's
    /// completions), a conversation does not (its template writes it).
    pub add_special_tokens: Option<bool>,
    /// Special tokens are written out in the text (vLLM's `skip_special_tokens: false`), but
    /// for the token that ended the output.
    pub keep_special_tokens: bool,
}

/// The W3C trace context headers of a request (`traceparent`, `tracestate`).
#[derive(Clone, Debug, Default)]
pub struct TraceHeaders {
    /// `traceparent`.
    pub traceparent: Option<String>,
    /// `tracestate`.
    pub tracestate: Option<String>,
}

impl TraceHeaders {
    /// Reads both from `get` (a header or metadata lookup).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Self {
        Self {
            traceparent: get("traceparent"),
            tracestate: get("tracestate"),
        }
    }

    fn get(&self, key: &str) -> Option<String> {
        match key {
            "traceparent" => self.traceparent.clone(),
            "tracestate" => self.tracestate.clone(),
            _ => None,
        }
    }
}

/// The outcome of routing one prompt.
#[derive(Clone, Debug)]
pub struct RouteDecision {
    /// The decode worker.
    pub decode: Routed,
    /// The prefill worker chosen (used only when `decision` is remote).
    pub prefill: Option<Routed>,
    /// The request's features.
    pub features: Features,
    /// Local or remote.
    pub decision: Decision,
    /// Who decided the path.
    pub decided_by: DecidedBy,
    /// Routing-table cluster of the request (`None`: no table decided).
    pub cluster: Option<u32>,
    /// Version of the routing table that decided.
    pub table_version: Option<Arc<str>>,
    /// What was known about the request at admission (the classifier's input).
    pub admission: Admission,
    /// The predicted output class (index into `dolphin::classifier::CLASS_NAMES`).
    pub output_class: usize,
    /// Set when the online learner takes the request's outcome.
    pub learn: Option<LearnTicket>,
}

thread_local! {
    /// Block hashes and per-slot match counts, reused by every request on this thread.
    static SCRATCH: RefCell<(Vec<u64>, RouteScratch)> = RefCell::new(Default::default());
}

/// Routes and runs requests.
#[derive(Debug)]
pub struct Dispatcher {
    registry: Arc<WorkerRegistry>,
    tokenizer: Arc<dyn Tokenizer>,
    policy: RwLock<Policy>,
    cfg: DispatchConfig,
    log: RequestLog,
    dolphin: Arc<DolphinRouting>,
    /// Where the admin API keeps tables: the router's memory until an etcd store is set.
    table_store: RwLock<Arc<dyn TableStore>>,
    /// Finished requests for the online learner, and its end until it is started.
    online: OnlineSink,
    online_rx: parking_lot::Mutex<Option<tokio::sync::mpsc::Receiver<Finished>>>,
    /// The ids of the control tokens the router's tool call parser reads, which the answers
    /// of `"auto"` requests write out.
    call_markers: Vec<u32>,
    /// Mistral's control tokens in the model's vocabulary (strict tools' grammar).
    call_tokens: crate::tools::CallTokens,
}

impl Dispatcher {
    /// A dispatcher over `registry`.
    pub fn new(
        registry: Arc<WorkerRegistry>,
        tokenizer: Arc<dyn Tokenizer>,
        policy: Policy,
        cfg: DispatchConfig,
        log: RequestLog,
    ) -> Self {
        let dolphin = Arc::new(DolphinRouting::new());
        let (online, online_rx) = OnlineSink::channel();
        let call_markers = cfg
            .tool_call_parser
            .map_or(&[][..], |p| p.control_tokens())
            .iter()
            .filter_map(|t| tokenizer.token_id(t))
            .collect();
        let call_tokens = crate::tools::CallTokens::find(|t| tokenizer.token_id(t));
        Self {
            call_markers,
            call_tokens,
            online,
            online_rx: parking_lot::Mutex::new(Some(online_rx)),
            registry,
            tokenizer,
            policy: RwLock::new(policy),
            cfg,
            log,
            table_store: RwLock::new(Arc::new(MemoryStore::new(dolphin.clone()))),
            dolphin,
        }
    }

    /// The table store the admin API uses.
    pub fn table_store(&self) -> Arc<dyn TableStore> {
        self.table_store.read().clone()
    }

    /// Replaces the table store (at start, with the etcd store when the router uses etcd).
    pub fn set_table_store(&self, store: Arc<dyn TableStore>) {
        *self.table_store.write() = store;
    }

    /// Starts the online learner's task (once; it idles unless the `dolphin` policy has
    /// online learning on). Call after the table store is set.
    pub fn spawn_online(self: &Arc<Self>, shutdown: CancellationToken) {
        let Some(rx) = self.online_rx.lock().take() else {
            return;
        };
        let (policy, store) = (Arc::downgrade(self), Arc::downgrade(self));
        let service = OnlineService::new(OnlineHost {
            routing: self.dolphin.clone(),
            policy: Box::new(move || policy.upgrade().map_or(Policy::AlwaysLocal, |d| d.policy())),
            store: Box::new(move || match store.upgrade() {
                Some(d) => d.table_store(),
                None => Arc::new(MemoryStore::new(Arc::new(DolphinRouting::new()))),
            }),
        });
        tokio::spawn(service.run(rx, shutdown));
    }

    /// DolphinRouting's tables and classifier (fed by the table store).
    pub fn dolphin(&self) -> &Arc<DolphinRouting> {
        &self.dolphin
    }

    /// The worker registry.
    pub fn registry(&self) -> &Arc<WorkerRegistry> {
        &self.registry
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.tokenizer
    }

    /// The format strict tools under `"auto"` draw `request`'s answer under, if any
    /// ([`crate::tools::ToolRequest::strict_format`], with this model's Mistral tokens).
    pub fn strict_tools(
        &self,
        request: &crate::tools::ToolRequest,
    ) -> Option<dolphin_grammar::Format> {
        request.strict_format(self.call_tokens)
    }

    /// The dispatcher's limits.
    pub fn config(&self) -> &DispatchConfig {
        &self.cfg
    }

    /// The active policy.
    pub fn policy(&self) -> Policy {
        *self.policy.read()
    }

    /// Replaces the active policy (takes effect for the next request).
    pub fn set_policy(&self, p: Policy) {
        tracing::info!(policy = p.name(), params = %p.params_json(), "policy changed");
        *self.policy.write() = p;
    }

    /// Checks the model name and sampling parameters.
    pub fn validate(&self, p: &GenerateParams) -> Result<(), DispatchError> {
        if !p.model.is_empty() && p.model != self.cfg.model {
            return Err(DispatchError::ModelNotFound(p.model.clone()));
        }
        let s = &p.sampling;
        let bad = |m: String| Err(DispatchError::InvalidRequest(m));
        let bad_field = |field, message| Err(DispatchError::InvalidField { field, message });
        if s.max_tokens == 0 {
            return bad_field("max_tokens", "max_tokens must be at least 1".into());
        }
        if s.max_tokens > self.cfg.max_output_tokens {
            return bad_field(
                "max_tokens",
                format!(
                    "max_tokens {} exceeds the limit of {}",
                    s.max_tokens, self.cfg.max_output_tokens
                ),
            );
        }
        if !s.temperature.is_finite() || s.temperature < 0.0 {
            return bad_field(
                "temperature",
                format!("temperature must be >= 0, got {}", s.temperature),
            );
        }
        if !s.top_p.is_finite() || !(0.0..=1.0).contains(&s.top_p) {
            return bad_field("top_p", format!("top_p must be in [0, 1], got {}", s.top_p));
        }
        dolphin_proto::sampling::check_logit_rules(s, self.tokenizer.vocab_size())?;
        // Whether the format compiles is checked with the tokenizing (`generate`), off the
        // serving thread: a large schema takes milliseconds.
        if let Some(w) = s.structured.as_deref() {
            dolphin_grammar::Format::from_wire(w).map_err(|source| DispatchError::BadFormat {
                field: p.format_field,
                source,
            })?;
            if s.ignore_eos {
                return bad_field(
                    "ignore_eos",
                    "ignore_eos cannot be set with structured".into(),
                );
            }
        }
        if s.output_in_prompt > 0 {
            return bad("output_in_prompt is set by the router when it migrates a request".into());
        }
        if s.prompt_logprobs.is_some() && p.force == Some(Decision::Remote) {
            return bad(
                "prompt_logprobs needs a local prefill (the decode worker computes them)".into(),
            );
        }
        Ok(())
    }

    /// The longest sequence a request may ask for (prompt plus generated tokens): the live
    /// workers' shortest context, or the router's prompt limit while no worker reported one.
    pub fn context_length(&self) -> u32 {
        self.registry
            .context_length()
            .unwrap_or(self.cfg.max_prompt_tokens)
    }

    /// Checks that a `prompt`-token prompt and `p`'s max_tokens fit in the live workers'
    /// context (a worker would refuse it after routing); a default max_tokens shrinks to fit.
    /// Nothing to check while no worker reported its context.
    fn fit_context(&self, prompt: usize, p: &mut GenerateParams) -> Result<(), DispatchError> {
        let Some(context) = self.registry.context_length() else {
            return Ok(());
        };
        let room = (context as usize).saturating_sub(prompt);
        let asked = p.sampling.max_tokens;
        if asked as usize <= room {
            return Ok(());
        }
        // A default max_tokens shrinks to fit, but never below the request's min_tokens.
        let min_tokens = p.sampling.logits.as_ref().map_or(0, |r| r.min_tokens);
        if p.max_tokens_is_default && room > 0 && room >= min_tokens as usize {
            p.sampling.max_tokens = room as u32;
            return Ok(());
        }
        Err(DispatchError::ContextExceeded {
            prompt,
            max_tokens: asked,
            context,
        })
    }

    /// The prompt's token ids, checked against the vocabulary and the length limit; with
    /// `keep_last`, only its last that many (the start is dropped, as vLLM truncates). A text
    /// prompt, or a conversation where `add_special` says so, starts with the model's BOS
    /// token where its tokenizer adds one ([`GenerateParams::add_special_tokens`]); not twice.
    pub fn tokenize(
        &self,
        prompt: Prompt,
        keep_last: Option<u32>,
        add_special: Option<bool>,
    ) -> Result<Vec<u32>, DispatchError> {
        let bos = match (&prompt, add_special) {
            (Prompt::Tokens(_), _) | (_, Some(false)) => None,
            (Prompt::Chat { .. }, None) => None,
            (Prompt::Text(_), _) | (Prompt::Chat { .. }, Some(true)) => self.tokenizer.bos_to_add(),
        };
        let mut tokens = match prompt {
            Prompt::Text(t) => self.tokenizer.encode(&t).map_err(internal)?,
            Prompt::Chat { messages, extras } => {
                if messages.is_empty() {
                    return Err(DispatchError::InvalidField {
                        field: "messages",
                        message: "messages must not be empty".into(),
                    });
                }
                let text = self
                    .tokenizer
                    .render_chat(&messages, &extras)
                    .map_err(|e| DispatchError::InvalidRequest(e.to_string()))?;
                self.tokenizer.encode(&text).map_err(internal)?
            }
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size();
                if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                    return Err(DispatchError::InvalidRequest(format!(
                        "token id {bad} is outside the vocabulary (size {vocab})"
                    )));
                }
                ids
            }
        };
        if let Some(bos) = bos
            && tokens.first() != Some(&bos)
        {
            tokens.insert(0, bos);
        }
        if let Some(keep) = keep_last {
            let cut = tokens.len().saturating_sub(keep as usize);
            tokens.drain(..cut);
        }
        if tokens.is_empty() {
            return Err(DispatchError::InvalidRequest("the prompt is empty".into()));
        }
        if tokens.len() > self.cfg.max_prompt_tokens as usize {
            return Err(DispatchError::PromptTooLong {
                tokens: tokens.len(),
                limit: self.cfg.max_prompt_tokens,
            });
        }
        Ok(tokens)
    }

    /// Routes a prompt: picks the decode and prefill workers, computes the features (the output
    /// length from the classifier) and asks the policy (or applies `force`). Skips `exclude` in
    /// the decode pool.
    pub fn route(
        &self,
        tokens: &[u32],
        max_tokens: u32,
        force: Option<Decision>,
        exclude: &[WorkerId],
    ) -> Result<RouteDecision, DispatchError> {
        self.route_from(
            dolphin_cluster::ROOT_SEED,
            tokens,
            max_tokens,
            force,
            exclude,
        )
    }

    /// [`route`](Self::route) for a prompt whose blocks are named from `root` (a cache salt's,
    /// [`dolphin_cluster::salted_root`]): only blocks cached under the same salt count.
    pub fn route_from(
        &self,
        root: u64,
        tokens: &[u32],
        max_tokens: u32,
        force: Option<Decision>,
        exclude: &[WorkerId],
    ) -> Result<RouteDecision, DispatchError> {
        let bs = self.cfg.block_size;
        let w = self.cfg.overlap_weight;
        let admission = Admission::new(tokens, max_tokens);
        let predicted = self.dolphin.classify(&admission);
        SCRATCH.with(|s| {
            let (hashes, scratch) = &mut *s.borrow_mut();
            let mut blocks = PromptBlocks::new(root, tokens, bs as usize, hashes);
            let (decode, prefill) = self
                .registry
                .route_pair(&mut blocks, w, exclude, scratch)
                .ok_or(DispatchError::NoDecodeWorkers)?;
            let input = RouteInput {
                isl: tokens.len() as u32,
                block_size: bs,
                decode_cached_blocks: decode.cached_blocks,
                prefill: prefill.as_ref().map(|p| {
                    let (pending_tokens, max_batched_tokens) = p.worker.prefill_backlog();
                    PrefillChoice {
                        cached_blocks: p.cached_blocks,
                        queue: p.worker.waiting(),
                        pending_tokens,
                        max_batched_tokens,
                    }
                }),
                output_len_hint: predicted.length,
                decode_kv_usage: decode.worker.kv_usage(),
            };
            let policy = self.policy();
            let decided = match policy {
                Policy::Dolphin(cfg) => {
                    let split = self.registry.split();
                    self.dolphin.with_table(split, |t| {
                        let version = t.and_then(|t| t.version.cloned());
                        let mut r = route(&input, &policy, t, force)?;
                        if !cfg.online.enabled {
                            return Ok((r, None));
                        }
                        if let Some(e) = version
                            .as_deref()
                            .and_then(|v| self.dolphin.explorer(split, v))
                        {
                            online::explore(&mut r, input.pool_state(), &e);
                        }
                        Ok((r, Some(LearnTicket { split, version })))
                    })
                }
                _ => route(&input, &policy, None, force).map(|r| (r, None)),
            };
            let (
                Route {
                    features,
                    decision,
                    decided_by,
                    cluster,
                    table_version,
                },
                learn,
            ) = decided.map_err(|RouteError::NoPrefillWorker| DispatchError::NoPrefillWorkers)?;
            // Workers whose event stream is down remember what they were sent (approximate
            // index); a no-op for live ones.
            self.registry
                .note_routed(Role::Decode, &decode, &mut blocks);
            if let (Decision::Remote, Some(p)) = (decision, &prefill) {
                self.registry.note_routed(Role::Prefill, p, &mut blocks);
            }
            Ok(RouteDecision {
                decode,
                prefill,
                features,
                decision,
                decided_by,
                cluster,
                table_version,
                admission,
                output_class: predicted.class,
                learn,
            })
        })
    }

    /// Starts a request: on success the first token has arrived and the rest streams from the
    /// returned [`ResponseStream`]. Dropping the stream cancels the request on the worker.
    pub async fn generate(
        self: &Arc<Self>,
        p: GenerateParams,
    ) -> Result<ResponseStream, DispatchError> {
        let api = p.api;
        // The request's trace span: its children are tokenize, route and dispatch (one per
        // decode call, migrations included); it ends with the response stream.
        let span = tracing::trace_span!(
            target: otel::TARGET,
            "router.request",
            api = api.as_str(),
            request_id = tracing::field::Empty,
        );
        otel::set_parent(&span, &|k| p.trace.get(k));
        // Boxed, as the decode call below: a future moved into a wrapper (here the span's) is
        // laid out twice in its parent (rust-lang/rust#62958), and every caller's future held
        // this one whole (the HTTP handler's was 45 KB, copied when hyper boxed it).
        let result = Box::pin(self.start(p, span.clone()).instrument(span)).await;
        if let Err(e) = &result {
            // Requests that never streamed; the stream records the others when it ends.
            hot::counter(
                m::REQUESTS_TOTAL,
                [("api", api.as_str()), ("outcome", e.outcome())],
            )
            .increment(1);
        }
        result
    }

    async fn start(
        self: &Arc<Self>,
        mut p: GenerateParams,
        span: tracing::Span,
    ) -> Result<ResponseStream, DispatchError> {
        let arrived = Instant::now();
        let ts_ms = crate::request_log::unix_ms();
        if p.request_id.is_empty() {
            p.request_id = new_request_id();
        }
        span.record("request_id", p.request_id.as_str());
        if !p.bad_words.is_empty() {
            let words = crate::bad_words::token_ids(&*self.tokenizer, &p.bad_words)?;
            p.sampling
                .logits
                .get_or_insert_default()
                .bad_words
                .extend(words);
        }
        self.validate(&p)?;
        if p.sampling.prompt_logprobs.is_some() {
            // The decode worker computes the prompt's log probabilities over the whole prompt.
            p.force = Some(Decision::Local);
        }
        let deadline = [p.timeout, self.cfg.request_timeout]
            .into_iter()
            .flatten()
            .min()
            .map(|t| tokio::time::Instant::from_std(arrived) + t);
        let tokenize = tracing::trace_span!(target: otel::TARGET, "router.tokenize");
        // The prompt leaves the request here: its text (or ids) is not held while the request
        // waits for its first token, only the tokens.
        let prompt = std::mem::replace(&mut p.prompt, Prompt::Tokens(Vec::new()));
        // A reasoning model's chat answer thinks first: its format starts after the thinking.
        let gate_format =
            matches!(prompt, Prompt::Chat { .. }) && self.cfg.reasoning_parser.is_some();
        // A format is compiled once before routing, so that a malformed one is the client's
        // 400, not a failure on the worker: on the blocking pool with the tokenizing.
        let format = p.sampling.structured.clone().map(|w| (p.format_field, w));
        let keep_last = p.truncate_prompt_tokens;
        let add_special = p.add_special_tokens;
        let tokens = if prompt.text_bytes() > INLINE_TOKENIZE_BYTES || format.is_some() {
            let d = Arc::clone(self);
            tokio::task::spawn_blocking(move || {
                tokenize.in_scope(|| {
                    if let Some((field, wire)) = format {
                        check_format(field, &wire)?;
                    }
                    d.tokenize(prompt, keep_last, add_special)
                })
            })
            .await
            .map_err(|e| DispatchError::Internal(format!("tokenizing failed: {e}")))??
        } else {
            let tokens = tokenize.in_scope(|| self.tokenize(prompt, keep_last, add_special));
            drop(tokenize);
            tokens?
        };
        self.fit_context(tokens.len(), &mut p)?;
        if gate_format && let Some(format) = p.sampling.structured.as_mut() {
            format.after_tokens = crate::reasoning::format_gate(&*self.tokenizer, &tokens);
        }
        hot::counter(m::PROMPT_TOKENS_TOTAL, []).increment(tokens.len() as u64);
        let mut exclude: Vec<WorkerId> = Vec::new();
        let mut failed: Option<DispatchError> = None;
        let attempt = loop {
            match self
                .dispatch_once(&tokens, &p.sampling, p.force, &exclude, deadline)
                .await
            {
                Ok(a) => break a,
                // Out of time: whatever the worker answered, there is none left to retry in.
                Err(_) if deadline.is_some_and(|at| tokio::time::Instant::now() >= at) => {
                    return Err(DispatchError::DeadlineExceeded);
                }
                // Nobody left to retry on: the first worker's error is the informative one.
                Err(DispatchError::NoDecodeWorkers) if failed.is_some() => {
                    return Err(failed.take().unwrap_or(DispatchError::NoDecodeWorkers));
                }
                Err(e) if exclude.is_empty() && e.retryable() => {
                    let worker = e.worker().unwrap_or_default();
                    tracing::warn!(request_id = %p.request_id, worker, error = %e, "decode call failed before the first token; retrying on another worker");
                    metrics::counter!(m::RETRIES_TOTAL).increment(1);
                    exclude.push(WorkerId::from(worker));
                    failed = Some(e);
                }
                Err(e) => return Err(e),
            }
        };
        hot::counter(
            m::DECISIONS_TOTAL,
            [("mode", attempt.route.decision.as_str())],
        )
        .increment(1);
        count_dolphin_decision(&attempt.route);
        let meta = RequestMeta {
            request_id: p.request_id,
            api: p.api,
            arrived,
            ts_ms,
            retries: exclude.len() as u32,
            slo: p.slo,
            prompt_tokens: tokens.len() as u32,
        };
        let migration = Migration::new(
            Arc::clone(self),
            tokens,
            p.sampling,
            self.cfg.max_migrations,
            exclude,
            RequestScope {
                force: p.force,
                deadline,
                span,
            },
        );
        let specials = if p.keep_special_tokens {
            Specials::All
        } else if p.keep_call_markers {
            Specials::Keep(self.call_markers.clone())
        } else {
            Specials::Skip
        };
        Ok(ResponseStream::new(
            meta,
            attempt,
            self.tokenizer.clone(),
            self.log.clone(),
            self.online.clone(),
            migration,
            deadline,
        )
        .with_specials(specials))
    }

    /// Routes `tokens` to a decode worker outside `exclude`, calls it and waits for its first
    /// message, until `deadline` at most (the worker gets what remains as its `grpc-timeout`).
    /// Each call gets a fresh engine key from the router, so a client's request id never meets
    /// another request's on a worker (nor an earlier attempt of its own).
    pub(crate) async fn dispatch_once(
        &self,
        tokens: &[u32],
        sampling: &v1::SamplingParams,
        force: Option<Decision>,
        exclude: &[WorkerId],
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Attempt, DispatchError> {
        let started = Instant::now();
        let route = tracing::trace_span!(target: otel::TARGET, "router.route").in_scope(|| {
            let root = dolphin_cluster::salted_root(&sampling.cache_salt);
            self.route_from(root, tokens, sampling.max_tokens, force, exclude)
        })?;
        hot::histogram(m::ROUTE_SECONDS, []).record(started.elapsed().as_secs_f64());
        // Count the request against the worker from now on, so a burst spreads out.
        let guard = route.decode.worker.begin_request(tokens.len() as u32);
        let engine_id = new_request_id();
        let dispatch = tracing::trace_span!(
            target: otel::TARGET,
            "router.dispatch",
            decode_worker = %route.decode.worker.id,
            mode = route.decision.as_str(),
        );
        // Boxed: the call's state (request, metadata, the h2 stream) is 2 KB, held twice over
        // here by the span and the deadline wrappers unboxed (rust-lang/rust#62958).
        let call = Box::pin(
            self.call(&engine_id, tokens, sampling, &route, deadline)
                .instrument(dispatch),
        );
        let answered = match deadline {
            // The deadline bounds the wait for the worker's first message as well.
            Some(at) => tokio::time::timeout_at(at, call)
                .await
                .unwrap_or(Err(DispatchError::DeadlineExceeded)),
            None => call.await,
        };
        let (stream, first) = answered.inspect_err(|e| {
            if e.worker_unreachable() {
                route.decode.worker.mark_unreachable();
            }
        })?;
        Ok(Attempt {
            route,
            guard,
            stream,
            first,
        })
    }

    /// Calls `Decode` on the routed worker and waits for its first message.
    async fn call(
        &self,
        engine_id: &str,
        tokens: &[u32],
        sampling: &v1::SamplingParams,
        route: &RouteDecision,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(GrpcStream<v1::DecodeResponse>, v1::DecodeResponse), DispatchError> {
        let worker = &route.decode.worker;
        let remote = match (route.decision, &route.prefill) {
            (Decision::Remote, Some(pf)) => Some(v1::RemotePrefill {
                prefill_addr: pf.worker.grpc_addr.clone(),
                prefill_worker_id: pf.worker.id.0.clone(),
                timeout_ms: 0,
            }),
            _ => None,
        };
        let req = v1::DecodeRequest {
            request_id: engine_id.to_owned(),
            token_ids: tokens.to_vec(),
            sampling: Some(sampling.clone()),
            remote,
        };
        // Unique per call: marked sensitive so HPACK sends it as a literal instead of
        // inserting it into (and evicting from) the connection's header table on every call.
        let request_id = HeaderValue::try_from(engine_id).ok().map(|mut v| {
            v.set_sensitive(true);
            v
        });
        let mut metadata: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(2);
        // The trace continues on the worker under this call's span.
        for (k, v) in otel::headers(&tracing::Span::current()) {
            if let Ok(v) = HeaderValue::from_str(&v) {
                metadata.push((HeaderName::from_static(k), v));
            }
        }
        if let Some(v) = request_id {
            metadata.push((HeaderName::from_static("x-request-id"), v));
        }
        // What remains of the request's time: the worker bounds its own work (and its call to
        // a prefill worker) by it, a little later than the router does.
        if let Some(at) = deadline {
            let left = worker_timeout(at.saturating_duration_since(tokio::time::Instant::now()));
            if let Ok(v) = HeaderValue::from_str(&deadline::format(left)) {
                metadata.push((HeaderName::from_static(deadline::GRPC_TIMEOUT), v));
            }
        }
        let fail = |status| DispatchError::Worker {
            worker: worker.id.0.clone(),
            status,
        };
        let mut stream = worker
            .channel()
            .decode_call(&req, &metadata)
            .await
            .map_err(fail)?;
        // Sent: the request's copy of the prompt is not kept through the wait for the first
        // token (the dispatcher's own tokens are, for retries and migration).
        drop((req, metadata));
        match stream.message().await {
            Ok(Some(first)) => Ok((stream, first)),
            Ok(None) => Err(DispatchError::Truncated {
                worker: worker.id.0.clone(),
            }),
            Err(status) => Err(fail(status)),
        }
    }
}

/// A decode call that answered: its route, the load it counts against the worker, and its
/// stream with the first message already read.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub(crate) route: RouteDecision,
    pub(crate) guard: InflightGuard,
    pub(crate) stream: GrpcStream<v1::DecodeResponse>,
    pub(crate) first: v1::DecodeResponse,
}

/// A failure of the router's own machinery (here: the model's tokenizer), as a request error.
fn internal(e: impl std::fmt::Display) -> DispatchError {
    DispatchError::Internal(e.to_string())
}

/// Per-cluster and fallback counters of the `dolphin` policy.
fn count_dolphin_decision(route: &RouteDecision) {
    match route.decided_by {
        DecidedBy::Table => hot::counter(
            m::DOLPHIN_DECISIONS_TOTAL,
            [
                ("cluster", m::cluster_label(route.cluster)),
                ("decision", route.decision.as_str()),
            ],
        )
        .increment(1),
        DecidedBy::TableLoad => hot::counter(
            m::DOLPHIN_LOAD_RULE_TOTAL,
            [("cluster", m::cluster_label(route.cluster))],
        )
        .increment(1),
        DecidedBy::Fallback(f) => {
            hot::counter(m::DOLPHIN_FALLBACK_TOTAL, [("fallback", f.as_str())]).increment(1);
        }
        DecidedBy::Distrusted(_, why) => hot::counter(
            m::DOLPHIN_DISTRUSTED_TOTAL,
            [
                ("cluster", m::cluster_label(route.cluster)),
                ("reason", why.as_str()),
            ],
        )
        .increment(1),
        DecidedBy::Explored => hot::counter(
            m::ONLINE_EXPLORED_TOTAL,
            [
                ("cluster", m::cluster_label(route.cluster)),
                ("decision", route.decision.as_str()),
            ],
        )
        .increment(1),
        DecidedBy::Forced | DecidedBy::Policy(_) => {}
    }
}

/// Compiles a request's format (against a byte-level vocabulary: whether it compiles does not
/// depend on the model), naming `field` when it does not.
fn check_format(field: &'static str, wire: &v1::StructuredOutput) -> Result<(), DispatchError> {
    let bad = |source| DispatchError::BadFormat { field, source };
    dolphin_grammar::Format::from_wire(wire)
        .map_err(bad)?
        .check()
        .map_err(bad)
}

/// A fresh request id, `req-` and 16 hex digits.
pub fn new_request_id() -> String {
    use rand::Rng;
    format!(
        "req-{:016x}",
        crate::selection::with_rng(|r| r.random::<u64>())
    )
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;

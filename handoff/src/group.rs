//! [`ModelGroup`]: several subservers (a small and a large model sharing a tokenizer, each a full
//! engine with its own scheduler loop, KV pool, prefix cache and batching) behind the normal
//! single-model [`Engine`] API. Every request is driven in all of them: it starts on the model
//! its algorithm names (prefill and decode), the others prefill its prompt and wait paused; at a
//! handoff the peer appends the suffix it has not seen, decodes its span and hands back the same
//! way (handoff-resume, see `crate::request`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dolphin_engine::{
    DriveStart, Engine, EngineError, EngineInfo, Generated, KvEvent, LoadSnapshot, OutputStream,
    PrefillOutput, Reservation, SeqId, SeqRequest, StepProfile,
};
use parking_lot::Mutex;
use tokio::sync::{broadcast, mpsc};

use crate::algorithm::{HandoffAlgorithm, ModelIndex};
use crate::inter::InterModel;
use crate::metrics as m;
use crate::request::{Request, RequestInfo};
use crate::spec::{AlgorithmSpec, threshold_key};
use crate::stats::GroupStats;

/// One model of a group.
#[derive(Clone)]
pub struct Subserver {
    /// Its name (`small`, `large`), in usage reports and metric labels.
    pub name: String,
    /// Its engine.
    pub engine: Arc<dyn Engine>,
}

impl Subserver {
    /// The engine `engine`, named `name`.
    pub fn new(name: impl Into<String>, engine: Arc<dyn Engine>) -> Subserver {
        Subserver {
            name: name.into(),
            engine,
        }
    }

    /// The usual two-model group: `small`, then `large`.
    pub fn small_large(small: Arc<dyn Engine>, large: Arc<dyn Engine>) -> Vec<Subserver> {
        vec![
            Subserver::new("small", small),
            Subserver::new("large", large),
        ]
    }
}

impl std::fmt::Debug for Subserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subserver")
            .field("name", &self.name)
            .field("model", &self.engine.info().model)
            .finish()
    }
}

/// Why a group cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// Fewer than two subservers.
    #[error("a model group needs at least two subservers, got {0}")]
    TooFew(usize),
    /// Subservers that do not share a vocabulary cannot hand tokens to each other.
    #[error("subserver {name} has a vocabulary of {got} tokens, {first} has {expected}")]
    Vocabulary {
        /// The mismatching subserver.
        name: String,
        /// Its vocabulary size.
        got: u32,
        /// The first subserver's name.
        first: String,
        /// The first subserver's vocabulary size.
        expected: u32,
    },
    /// Two subservers with one name.
    #[error("two subservers are named {0:?}")]
    DuplicateName(String),
    /// The default algorithm does not build.
    #[error("default handoff algorithm: {0}")]
    Algorithm(#[from] crate::spec::SpecError),
}

/// How a group runs its requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupOptions {
    /// Keep paused subservers within this many tokens of the active one: the suffix is appended
    /// without resuming, so they compute its KV in the background and a handoff only catches up
    /// the rest. 0 (the default): the suffix moves only at a handoff.
    pub sync_tokens: u32,
}

/// Several models behind one engine API.
pub struct ModelGroup {
    subservers: Vec<Subserver>,
    names: Arc<[String]>,
    info: EngineInfo,
    default: AlgorithmSpec,
    /// The subserver that takes reservations (remote prefill) and whose cache the router sees:
    /// the default algorithm's start model.
    home: ModelIndex,
    inter: InterModel,
    stats: Arc<GroupStats>,
    seeds: AtomicU64,
    options: GroupOptions,
    /// Reservations (remote prefill) waiting for their KV, by the home subserver's sequence.
    reserved: Mutex<HashMap<SeqId, SeqRequest>>,
}

impl std::fmt::Debug for ModelGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGroup")
            .field("name", &self.info.model)
            .field("subservers", &self.subservers)
            .field("default", &self.default.to_string())
            .finish()
    }
}

impl ModelGroup {
    /// A group named `name` over `subservers` (index 0 first), with `default` as the algorithm
    /// of requests that choose none. Call inside a Tokio runtime (the inter-model loop is
    /// spawned on it).
    pub fn new(
        name: impl Into<String>,
        subservers: Vec<Subserver>,
        default: AlgorithmSpec,
    ) -> Result<Arc<Self>, GroupError> {
        Self::with_options(name, subservers, default, GroupOptions::default())
    }

    /// Like [`ModelGroup::new`], with `options`.
    pub fn with_options(
        name: impl Into<String>,
        subservers: Vec<Subserver>,
        default: AlgorithmSpec,
        options: GroupOptions,
    ) -> Result<Arc<Self>, GroupError> {
        if subservers.len() < 2 {
            return Err(GroupError::TooFew(subservers.len()));
        }
        let first = &subservers[0];
        for s in &subservers[1..] {
            if s.engine.info().vocab_size != first.engine.info().vocab_size {
                return Err(GroupError::Vocabulary {
                    name: s.name.clone(),
                    got: s.engine.info().vocab_size,
                    first: first.name.clone(),
                    expected: first.engine.info().vocab_size,
                });
            }
        }
        for (i, s) in subservers.iter().enumerate() {
            if subservers[..i].iter().any(|o| o.name == s.name) {
                return Err(GroupError::DuplicateName(s.name.clone()));
            }
        }
        let home = default.build(0)?.start().min(subservers.len() - 1);
        let h = subservers[home].engine.info();
        let info = EngineInfo {
            model: name.into(),
            engine: h.engine,
            context_length: subservers
                .iter()
                .map(|s| s.engine.info().context_length)
                .min()
                .unwrap_or(h.context_length),
            ..h.clone()
        };
        let names: Arc<[String]> = subservers.iter().map(|s| s.name.clone()).collect();
        let inter = InterModel::spawn(subservers.iter().map(|s| s.engine.clone()).collect());
        Ok(Arc::new(Self {
            stats: Arc::new(GroupStats::new(names.clone())),
            names,
            subservers,
            info,
            default,
            home,
            inter,
            seeds: AtomicU64::new(1),
            options,
            reserved: Mutex::new(HashMap::new()),
        }))
    }

    /// Publishes per-subserver gauges: pending requests, and the mean batch size and step time
    /// of the steps since `last` (the step profiles of the previous call, updated here).
    pub fn publish_metrics(&self, last: &mut Vec<StepProfile>) {
        last.resize_with(self.subservers.len(), StepProfile::default);
        for (i, (s, before)) in self.subservers.iter().zip(last.iter_mut()).enumerate() {
            let label = s.name.clone();
            metrics::gauge!(m::SUBSERVER_PENDING, "subserver" => label.clone())
                .set(self.stats.pending(i) as f64);
            let now = s.engine.step_profile();
            let (mut steps, mut seqs, mut secs) = (0u64, 0u64, 0.0);
            for &(batch, n, total) in &now.by_batch {
                let (n0, t0) = before
                    .by_batch
                    .iter()
                    .find(|e| e.0 == batch)
                    .map_or((0, 0.0), |e| (e.1, e.2));
                steps += n - n0;
                seqs += u64::from(batch) * (n - n0);
                secs += total - t0;
            }
            if steps > 0 {
                metrics::gauge!(m::SUBSERVER_BATCH_SIZE, "subserver" => label.clone())
                    .set(seqs as f64 / steps as f64);
                metrics::gauge!(m::SUBSERVER_STEP_SECONDS, "subserver" => label)
                    .set(secs / steps as f64);
            }
            *before = now;
        }
    }

    /// The subservers, in index order.
    pub fn subservers(&self) -> &[Subserver] {
        &self.subservers
    }

    /// The group's counters.
    pub fn stats(&self) -> &Arc<GroupStats> {
        &self.stats
    }

    /// The default algorithm.
    pub fn default_algorithm(&self) -> &AlgorithmSpec {
        &self.default
    }

    /// The subserver that takes remote prefills (the default algorithm's start model).
    pub fn home(&self) -> ModelIndex {
        self.home
    }

    /// The algorithm spec a request runs: its own choice, else the default; a threshold
    /// overrides the algorithm's main one.
    pub fn spec_for(&self, req: &SeqRequest) -> Result<AlgorithmSpec, EngineError> {
        let invalid = |msg: String| EngineError::InvalidRequest(msg);
        let Some(choice) = &req.sampling.handoff else {
            return Ok(self.default.clone());
        };
        let mut spec = if choice.algorithm.trim().is_empty() {
            self.default.clone()
        } else {
            choice
                .algorithm
                .parse::<AlgorithmSpec>()
                .map_err(|e| invalid(e.to_string()))?
        };
        if let Some(t) = choice.threshold {
            if threshold_key(&spec.name).is_none() {
                return Err(invalid(format!(
                    "handoff algorithm {} takes no threshold",
                    spec.name
                )));
            }
            spec = spec.with_threshold(t);
        }
        spec.validate().map_err(|e| invalid(e.to_string()))?;
        Ok(spec)
    }

    /// The request's algorithm, built, and its spec.
    fn algorithm_for(
        &self,
        req: &SeqRequest,
    ) -> Result<(Box<dyn HandoffAlgorithm>, String), EngineError> {
        let spec = self.spec_for(req)?;
        let seed = req
            .sampling
            .seed
            .unwrap_or_else(|| self.seeds.fetch_add(1, Ordering::Relaxed));
        let algorithm = spec
            .build(seed)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        Ok((algorithm, spec.to_string()))
    }

    /// Serves a request with `algorithm` (any implementation, not only the named ones).
    pub async fn generate_with(
        &self,
        req: SeqRequest,
        algorithm: Box<dyn HandoffAlgorithm>,
    ) -> Result<OutputStream, EngineError> {
        refuse_prompt_logprobs(&req)?;
        let name = format!("{algorithm:?}");
        let (request, rx) = self.request_with(&req, algorithm, name, None)?;
        self.start(req, request).await?;
        Ok(rx)
    }

    async fn start(&self, req: SeqRequest, request: Arc<Request>) -> Result<(), EngineError> {
        let active = request.active();
        self.start_peers(&req, &request, active).await?;
        let engine = &self.subservers[active].engine;
        match engine
            .drive(req.clone(), DriveStart::Active, request.driver(active))
            .await
        {
            Ok(seq) => request.set_seq(active, seq),
            Err(e) => {
                self.cancel_in(&req.request_id, 0..self.subservers.len());
                return Err(e);
            }
        }
        Ok(())
    }

    /// A request's state and output channel.
    fn request(
        &self,
        req: &SeqRequest,
        holder: Option<ModelIndex>,
    ) -> Result<(Arc<Request>, OutputStream), EngineError> {
        let (algorithm, spec) = self.algorithm_for(req)?;
        self.request_with(req, algorithm, spec, holder)
    }

    fn request_with(
        &self,
        req: &SeqRequest,
        algorithm: Box<dyn HandoffAlgorithm>,
        spec: String,
        holder: Option<ModelIndex>,
    ) -> Result<(Arc<Request>, OutputStream), EngineError> {
        let s = &req.sampling;
        let mut stops = s.stop_token_ids.clone();
        if !s.ignore_eos
            && let Some(eos) = self.info.eos_token_id
        {
            stops.push(eos);
        }
        let (tx, rx) = mpsc::channel(s.max_tokens as usize + 2);
        let info = RequestInfo {
            request_id: req.request_id.clone(),
            prompt_len: req.prompt.len() as u32,
            max_tokens: s.max_tokens,
            end_after: s.end_after,
            stops,
            names: self.names.clone(),
            algorithm: spec,
            sync_tokens: self.options.sync_tokens,
        };
        let request = Request::new(
            info,
            req.prompt.clone(),
            algorithm,
            tx,
            self.inter.clone(),
            self.stats.clone(),
            holder,
        );
        Ok((request, rx))
    }

    /// Starts the request's paused sequences in every subserver but `active`.
    async fn start_peers(
        &self,
        req: &SeqRequest,
        request: &Arc<Request>,
        active: ModelIndex,
    ) -> Result<(), EngineError> {
        for (m, s) in self.subservers.iter().enumerate() {
            if m == active {
                continue;
            }
            match s
                .engine
                .drive(req.clone(), DriveStart::Passive, request.driver(m))
                .await
            {
                Ok(seq) => request.set_seq(m, seq),
                Err(e) => {
                    self.cancel_in(&req.request_id, 0..m);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn cancel_in(&self, request_id: &str, models: impl IntoIterator<Item = ModelIndex>) {
        for m in models {
            self.subservers[m].engine.cancel(request_id);
        }
    }

    /// A reservation on the home subserver goes on as the group's request: decoding from the
    /// prefill worker's `first_token`, or (`None`) prefilling here after a remote failure.
    async fn resume_home(
        &self,
        seq: SeqId,
        first: Option<Generated>,
    ) -> Result<OutputStream, EngineError> {
        let req = self
            .reserved
            .lock()
            .remove(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        let (request, rx) = self.request(&req, Some(self.home))?;
        request.set_seq(self.home, seq);
        self.start_peers(&req, &request, self.home).await?;
        let home = &self.subservers[self.home].engine;
        let driver = request.driver(self.home);
        match first {
            Some(token) => home.resume_driven(seq, token, driver).await,
            None => home.resume_local_driven(seq, driver).await,
        }
        .inspect_err(|_| self.cancel_in(&req.request_id, 0..self.subservers.len()))?;
        Ok(rx)
    }
}

#[async_trait::async_trait]
impl Engine for ModelGroup {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    async fn generate(&self, req: SeqRequest) -> Result<OutputStream, EngineError> {
        refuse_prompt_logprobs(&req)?;
        let (request, rx) = self.request(&req, None)?;
        self.start(req, request).await?;
        Ok(rx)
    }

    async fn prefill(
        &self,
        req: SeqRequest,
        skip_blocks: u32,
    ) -> Result<PrefillOutput, EngineError> {
        self.subservers[self.home]
            .engine
            .prefill(req, skip_blocks)
            .await
    }

    async fn reserve(&self, req: SeqRequest) -> Result<Reservation, EngineError> {
        // Fail fast on a bad algorithm choice, before any KV moves.
        self.spec_for(&req)?;
        let r = self.subservers[self.home]
            .engine
            .reserve(req.clone())
            .await?;
        self.reserved.lock().insert(r.seq, req);
        Ok(r)
    }

    fn import(&self, seq: SeqId, index: u32, data: &[u8]) -> Result<(), EngineError> {
        self.subservers[self.home].engine.import(seq, index, data)
    }

    async fn resume(&self, seq: SeqId, first: Generated) -> Result<OutputStream, EngineError> {
        self.resume_home(seq, Some(first)).await
    }

    async fn resume_local(&self, seq: SeqId) -> Result<OutputStream, EngineError> {
        self.resume_home(seq, None).await
    }

    fn cancel(&self, request_id: &str) {
        self.reserved
            .lock()
            .retain(|_, r| r.request_id != request_id);
        // Each subserver ends its sequence; the first to report it ends the request's stream
        // with `Cancelled`.
        self.cancel_in(request_id, 0..self.subservers.len());
    }

    fn subscribe(&self) -> (Vec<KvEvent>, broadcast::Receiver<KvEvent>) {
        self.subservers[self.home].engine.subscribe()
    }

    fn load(&self) -> LoadSnapshot {
        // A request runs in every subserver: count it once (the home model's view), with the
        // home model's memory, which is what routing to this worker draws on; waiting is the
        // longest queue of any subserver.
        let loads: Vec<LoadSnapshot> = self.subservers.iter().map(|s| s.engine.load()).collect();
        let waiting = loads.iter().map(|l| l.waiting).max().unwrap_or(0);
        LoadSnapshot {
            waiting,
            ..loads[self.home]
        }
    }

    fn step_profile(&self) -> StepProfile {
        self.subservers[self.home].engine.step_profile()
    }
}

/// The prompt's log probabilities are not served by a group: its models prefill through the
/// driven path, which does not gather them.
fn refuse_prompt_logprobs(req: &SeqRequest) -> Result<(), EngineError> {
    if req.sampling.prompt_logprobs.is_some() {
        return Err(EngineError::InvalidRequest(
            "prompt log probabilities are not served by a model group".into(),
        ));
    }
    Ok(())
}

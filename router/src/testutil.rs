//! Test helpers: an in-process fake worker serving `Worker` and `DecodeWorker` on 127.0.0.1:0,
//! and a router (dispatcher plus HTTP and gRPC servers) wired to fakes.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dolphin_cluster::{Role, WorkerId, WorkerRecord};
use dolphin_proto::v1::{
    self, decode_worker_server::DecodeWorker, worker_event::Event, worker_server::Worker,
};
use futures::Stream;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use crate::dispatch::{DispatchConfig, Dispatcher, GenerateParams, Prompt};
use crate::policy::Policy;
use crate::request_log::RequestLog;
use crate::stream::Api;
use crate::tokenizer::{SimTokenizer, Tokenizer};
use crate::workers::{RegistryConfig, WorkerRegistry};

/// The record of a worker serving the fakes' model (`sim-model`) in blocks of 16 tokens.
pub fn worker_record(id: &str, role: Role, addr: &str) -> WorkerRecord {
    WorkerRecord {
        id: WorkerId::from(id),
        role,
        grpc_addr: addr.into(),
        kv_addr: None,
        model: "sim-model".into(),
        block_size: 16,
        version: dolphin_cluster::BUILD_VERSION.into(),
        kv_layout: String::new(),
        context_length: 0,
    }
}

/// A gRPC request for `prompt` (text) with `max_tokens` and nothing else set.
pub fn params(prompt: &str, max_tokens: u32) -> GenerateParams {
    GenerateParams {
        format_field: "structured",
        request_id: String::new(),
        model: String::new(),
        prompt: Prompt::Text(prompt.into()),
        sampling: v1::SamplingParams {
            max_tokens,
            ..Default::default()
        },
        max_tokens_is_default: false,
        force: None,
        slo: None,
        api: Api::Grpc,
        timeout: None,
        trace: Default::default(),
        truncate_prompt_tokens: None,
        keep_call_markers: false,
        bad_words: Vec::new(),
        add_special_tokens: None,
        keep_special_tokens: false,
    }
}

/// How the fake answers `Decode`.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Stream `text`'s tokens (cycled) one per message up to `max_tokens`, finish with Length.
    Text(String),
    /// Stream these tokens one per message, then finish with Stop in a message of its own, as
    /// the decode worker does.
    Tokens(Vec<u32>),
    /// Fail the call with this code before any token.
    Fail(Code),
    /// Send one token, then wait until the router drops the stream.
    Hang,
    /// Send `text`'s tokens, then wait until the router drops the stream.
    TextThenHang(String),
    /// Send one token, then fail the stream with this code.
    FailAfterFirst(Code),
    /// Stream the token of each position (`positional_token`) up to `max_tokens`, as a
    /// deterministic model would, then finish with Length; with `fail_after`, fail the stream
    /// with `Unavailable` after that many tokens instead (or, when that is `max_tokens` or
    /// more, after the last token in place of the finish).
    Positional {
        /// Tokens sent before the failure.
        fail_after: Option<u32>,
    },
}

/// A gRPC `GenerateRequest` for `text`, at most `max_tokens`.
pub fn text_request(text: &str, max_tokens: u32) -> dolphin_proto::v1::GenerateRequest {
    use dolphin_proto::v1;
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Text(text.into())),
        sampling: Some(v1::SamplingParams {
            max_tokens,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Waits (at most 10 s, else fails) until `limit` counts `n` requests in flight.
pub async fn until_in_flight(limit: &crate::admission::InflightLimit, n: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while limit.in_flight() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} in flight, waiting for {n}",
            limit.in_flight()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The log probabilities a fake worker reports for token `id` with `k` alternatives: the
/// token at `-id / 100`, the alternatives `id`, `id + 1`, ... one nat apart.
pub fn fake_logprobs(id: u32, k: u32) -> v1::TokenLogprobs {
    let logprob = -(id as f32) / 100.0;
    v1::TokenLogprobs {
        logprob,
        top_ids: (0..k).map(|i| id + i).collect(),
        top_logprobs: (0..k).map(|i| logprob - i as f32).collect(),
        rank: id % 7 + 1,
    }
}

/// The token a [`Behavior::Positional`] fake writes at sequence position `pos`.
pub fn positional_token(pos: usize) -> u32 {
    // Lowercase letters, so the text is readable.
    SimTokenizer.encode(&char::from(b'a' + (pos % 26) as u8).to_string())[0]
}

/// Shared state of a fake worker.
#[derive(Debug)]
pub struct FakeState {
    pub id: String,
    pub role: Role,
    pub behavior: Mutex<Behavior>,
    pub calls: Mutex<Vec<v1::DecodeRequest>>,
    /// The `grpc-timeout` header of each call, as sent.
    pub timeouts: Mutex<Vec<Option<String>>>,
    /// Decode streams the router dropped before they ended.
    pub cancelled: AtomicU32,
    /// The prefill path it reports for a request sent remote (a local one reports `Local`).
    pub remote_path: Mutex<v1::PrefillPath>,
    /// How long a request sent remote waits before its first token (`Text` behaviour), as a
    /// slow prefill pool would make it.
    pub remote_delay: Mutex<Duration>,
    events: broadcast::Sender<Event>,
    snapshot: Mutex<Vec<u64>>,
    /// Ends event streams too, so a stopped fake looks like a dead worker.
    stop: CancellationToken,
}

/// A fake worker listening on 127.0.0.1.
#[derive(Debug)]
pub struct FakeWorker {
    pub addr: SocketAddr,
    pub state: Arc<FakeState>,
    stop: CancellationToken,
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Clone, Debug)]
struct Svc(Arc<FakeState>);

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for Svc {
    type SubscribeStream = BoxStream<v1::WorkerEvent>;

    async fn subscribe(
        &self,
        _: Request<v1::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let st = self.0.clone();
        let mut rx = st.events.subscribe();
        let snapshot = st.snapshot.lock().clone();
        let (tx, out) = mpsc::channel(64);
        tokio::spawn(async move {
            let mut seq = 0u64;
            let mut send = |ev: Event| {
                let msg = v1::WorkerEvent {
                    seq,
                    worker_id: st.id.clone(),
                    event: Some(ev),
                };
                seq += 1;
                tx.clone().try_send(Ok(msg)).is_ok()
            };
            send(Event::Stored(v1::BlocksStored {
                parent_hash: None,
                block_hashes: snapshot,
            }));
            loop {
                let ev = tokio::select! {
                    _ = st.stop.cancelled() => return,
                    ev = rx.recv() => ev,
                };
                let Ok(ev) = ev else { return };
                if !send(ev) {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn info(&self, _: Request<v1::InfoRequest>) -> Result<Response<v1::WorkerInfo>, Status> {
        Ok(Response::new(v1::WorkerInfo {
            worker_id: self.0.id.clone(),
            role: i32::from(self.0.role),
            model: "sim-model".into(),
            block_size: 4,
            ..Default::default()
        }))
    }

    async fn drain(
        &self,
        _: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        Ok(Response::new(v1::DrainResponse { running: 0 }))
    }
}

#[tonic::async_trait]
impl DecodeWorker for Svc {
    type DecodeStream = BoxStream<v1::DecodeResponse>;

    async fn decode(
        &self,
        req: Request<v1::DecodeRequest>,
    ) -> Result<Response<Self::DecodeStream>, Status> {
        let timeout = req
            .metadata()
            .get(dolphin_proto::deadline::GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.0.timeouts.lock().push(timeout);
        let req = req.into_inner();
        let max = req.sampling.as_ref().map_or(1, |s| s.max_tokens);
        let logprobs = req.sampling.as_ref().and_then(|s| s.logprobs);
        // The prompt's, as the fake scores them: each token after the first like a generated one.
        let prompt_logprobs: Vec<v1::TokenLogprobs> = req
            .sampling
            .as_ref()
            .and_then(|s| s.prompt_logprobs)
            .map(|k| {
                req.token_ids[1..]
                    .iter()
                    .map(|&id| fake_logprobs(id, k))
                    .collect()
            })
            .unwrap_or_default();
        let prompt_tokens = req.token_ids.len() as u32;
        let (path, delay) = if req.remote.is_some() {
            (*self.0.remote_path.lock(), *self.0.remote_delay.lock())
        } else {
            (v1::PrefillPath::Local, Duration::ZERO)
        };
        self.0.calls.lock().push(req);
        let behavior = self.0.behavior.lock().clone();
        let (tx, rx) = mpsc::channel(4);
        let st = self.0.clone();
        let token = move |id: u32| v1::DecodeResponse {
            token_ids: vec![id],
            logprobs: logprobs.map(|k| fake_logprobs(id, k)).into_iter().collect(),
            fell_back: path == v1::PrefillPath::LocalFallback,
            path: path as i32,
            ..Default::default()
        };
        match behavior {
            Behavior::Fail(code) => return Err(Status::new(code, "fake failure")),
            Behavior::Text(text) => {
                let ids = SimTokenizer.encode(&text);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    for i in 0..max as usize {
                        let mut msg = token(ids[i % ids.len()]);
                        if i == 0 {
                            msg.prompt_logprobs = prompt_logprobs.clone();
                        }
                        if i + 1 == max as usize {
                            msg.finish_reason = v1::FinishReason::Length as i32;
                            msg.usage = Some(v1::Usage {
                                prompt_tokens,
                                completion_tokens: max,
                                cached_tokens: 4,
                                ..Default::default()
                            });
                            msg.timings = Some(v1::Timings {
                                prefill_us: 7,
                                ..Default::default()
                            });
                        }
                        if tx.send(Ok(msg)).await.is_err() {
                            st.cancelled.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                });
            }
            Behavior::Tokens(ids) => {
                tokio::spawn(async move {
                    let end = v1::DecodeResponse {
                        finish_reason: v1::FinishReason::Stop as i32,
                        usage: Some(v1::Usage {
                            prompt_tokens,
                            completion_tokens: ids.len() as u32,
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    for msg in ids.iter().map(|&id| token(id)).chain([end]) {
                        if tx.send(Ok(msg)).await.is_err() {
                            return;
                        }
                    }
                });
            }
            Behavior::Hang => {
                tokio::spawn(async move {
                    let _ = tx.send(Ok(token(40))).await;
                    tx.closed().await;
                    st.cancelled.fetch_add(1, Ordering::SeqCst);
                });
            }
            Behavior::TextThenHang(text) => {
                tokio::spawn(async move {
                    for id in SimTokenizer.encode(&text) {
                        let _ = tx.send(Ok(token(id))).await;
                    }
                    tx.closed().await;
                    st.cancelled.fetch_add(1, Ordering::SeqCst);
                });
            }
            Behavior::Positional { fail_after } => {
                tokio::spawn(async move {
                    let died = || Err(Status::unavailable("fake worker died"));
                    for i in 0..max {
                        if fail_after == Some(i) {
                            let _ = tx.send(died()).await;
                            return;
                        }
                        let mut msg = token(positional_token(prompt_tokens as usize + i as usize));
                        if i + 1 == max && fail_after.is_none() {
                            msg.finish_reason = v1::FinishReason::Length as i32;
                        }
                        if tx.send(Ok(msg)).await.is_err() {
                            st.cancelled.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                    if fail_after.is_some() {
                        // Dies between its last token and the finish.
                        let _ = tx.send(died()).await;
                    }
                });
            }
            Behavior::FailAfterFirst(code) => {
                tokio::spawn(async move {
                    let _ = tx.send(Ok(token(40))).await;
                    let _ = tx
                        .send(Err(Status::new(code, "fake mid-stream failure")))
                        .await;
                });
            }
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl FakeWorker {
    /// Starts a fake worker.
    pub async fn start(id: &str, role: Role, behavior: Behavior) -> FakeWorker {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
        Self::start_on(any, id, role, behavior).await
    }

    /// Starts a fake worker on `addr` (a restarted worker keeps its port).
    pub async fn start_on(
        addr: SocketAddr,
        id: &str,
        role: Role,
        behavior: Behavior,
    ) -> FakeWorker {
        // A worker restarted on its port: the old server may hold it while it drains.
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("bind {addr}: {e}"),
            }
        };
        let addr = listener.local_addr().expect("addr");
        let (events, _) = broadcast::channel(256);
        let stop = CancellationToken::new();
        let state = Arc::new(FakeState {
            id: id.into(),
            role,
            behavior: Mutex::new(behavior),
            calls: Mutex::new(Vec::new()),
            timeouts: Mutex::new(Vec::new()),
            cancelled: AtomicU32::new(0),
            remote_path: Mutex::new(v1::PrefillPath::Remote),
            remote_delay: Mutex::new(Duration::ZERO),
            events,
            snapshot: Mutex::new(Vec::new()),
            stop: stop.clone(),
        });
        let svc = Svc(state.clone());
        let server = tonic::transport::Server::builder()
            .add_service(v1::worker_server::WorkerServer::new(svc.clone()))
            .add_service(v1::decode_worker_server::DecodeWorkerServer::new(svc))
            .serve_with_incoming_shutdown(
                dolphin_cluster::nodelay_incoming(listener),
                stop.clone().cancelled_owned(),
            );
        tokio::spawn(server);
        FakeWorker { addr, state, stop }
    }

    /// The record the registry needs.
    pub fn record(&self) -> WorkerRecord {
        WorkerRecord {
            id: WorkerId(self.state.id.clone()),
            role: self.state.role,
            grpc_addr: self.addr.to_string(),
            kv_addr: None,
            model: "sim-model".into(),
            block_size: 4,
            version: dolphin_cluster::BUILD_VERSION.into(),
            kv_layout: String::new(),
            context_length: 0,
        }
    }

    /// Announces cached blocks (also kept for the snapshot of later subscribers).
    pub fn store(&self, hashes: &[u64]) {
        self.state.snapshot.lock().extend_from_slice(hashes);
        let _ = self.state.events.send(Event::Stored(v1::BlocksStored {
            parent_hash: None,
            block_hashes: hashes.to_vec(),
        }));
    }

    /// Announces that the whole cache was dropped.
    pub fn clear(&self) {
        self.state.snapshot.lock().clear();
        let _ = self
            .state
            .events
            .send(Event::Cleared(v1::AllBlocksCleared {}));
    }

    /// Sends a load report.
    pub fn load(&self, report: v1::LoadReport) {
        let _ = self.state.events.send(Event::Load(report));
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// Block size used by the test router and fakes (small so short prompts have blocks).
pub const BS: u32 = 4;

/// A dispatcher over a fresh registry.
pub fn dispatcher(policy: Policy, log: RequestLog) -> Arc<Dispatcher> {
    dispatcher_with(Arc::new(SimTokenizer), policy, log)
}

/// A dispatcher over a fresh registry with `tokenizer`.
pub fn dispatcher_with(
    tokenizer: Arc<dyn Tokenizer>,
    policy: Policy,
    log: RequestLog,
) -> Arc<Dispatcher> {
    dispatcher_configured(tokenizer, policy, log, |_| {})
}

/// A dispatcher over a fresh registry with `tokenizer`, its configuration changed by `tune`.
pub fn dispatcher_configured(
    tokenizer: Arc<dyn Tokenizer>,
    policy: Policy,
    log: RequestLog,
    tune: impl FnOnce(&mut DispatchConfig),
) -> Arc<Dispatcher> {
    let registry = WorkerRegistry::new(RegistryConfig {
        model: "sim-model".into(),
        block_size: BS,
        load_interval_ms: 20,
        connector: dolphin_tls::GrpcConnector::plain(Duration::from_secs(2)),
    });
    let mut cfg = DispatchConfig {
        model: "sim-model".into(),
        max_prompt_tokens: 1000,
        max_output_tokens: 64,
        overlap_weight: 1.0,
        block_size: BS,
        max_migrations: 3,
        tool_call_parser: Some(crate::tools::ToolCallParser::Hermes),
        reasoning_parser: None,
        trust_request_chat_template: false,
        request_timeout: None,
    };
    tune(&mut cfg);
    Arc::new(Dispatcher::new(registry, tokenizer, policy, cfg, log))
}

/// Polls `cond` (every 10 ms, up to 10 s: generous, since the machine is shared).
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The request log's first record, once the writer has written it (the log is one JSON line per
/// finished request).
pub async fn first_log_record(path: &std::path::Path) -> serde_json::Value {
    let mut text = String::new();
    eventually("a request-log line", || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        !text.is_empty()
    })
    .await;
    let line = text.lines().next().unwrap_or_default();
    serde_json::from_str(line).expect("a JSON record")
}

/// Waits until the registry's index holds `n` blocks for worker `id`.
pub async fn wait_indexed(d: &Dispatcher, id: &str, n: u64) {
    eventually(&format!("{n} indexed blocks on {id}"), || {
        d.registry()
            .list()
            .iter()
            .any(|w| w.worker_id == id && w.indexed_blocks == n && w.events_live)
    })
    .await;
}

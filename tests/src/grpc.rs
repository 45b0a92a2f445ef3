//! gRPC helpers: build Generate requests, drain a Generate stream into one result.

use std::time::Duration;

use dolphin_proto::v1::generate_request::Input;
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::router_admin_client::RouterAdminClient;
use dolphin_proto::v1::{
    FinishReason, GenerateRequest, GenerateResponse, ListWorkersRequest, PrefillMode, RoutingInfo,
    SamplingParams, Timings, Usage, WorkerStatus,
};
use tonic::transport::Channel;

/// The model name every test cluster serves.
pub const MODEL: &str = "sim-model";

/// Connects to `addr` ("host:port").
pub async fn channel(addr: &str) -> anyhow::Result<Channel> {
    channel_with(addr, None).await
}

/// Connects to `addr` ("host:port"), over TLS with `tls`.
pub async fn channel_with(addr: &str, tls: Option<&dolphin_tls::Tls>) -> anyhow::Result<Channel> {
    let connector = dolphin_tls::GrpcConnector::new(tls, Duration::from_secs(10))?;
    Ok(
        tonic::transport::Endpoint::from_shared(format!("{}://{addr}", connector.scheme()))?
            .connect_with_connector(connector)
            .await?,
    )
}

/// A greedy text request for `max_tokens` tokens, forcing `mode` (Unspecified: the policy).
pub fn text_request(prompt: &str, max_tokens: u32, mode: PrefillMode) -> GenerateRequest {
    GenerateRequest {
        model: MODEL.to_owned(),
        input: Some(Input::Text(prompt.to_owned())),
        sampling: Some(SamplingParams {
            max_tokens,
            ..SamplingParams::default()
        }),
        force_mode: mode as i32,
        ..GenerateRequest::default()
    }
}

/// A whole Generate stream.
#[derive(Clone, Debug, Default)]
pub struct Generated {
    /// Messages received.
    pub messages: usize,
    /// Every token id, in order.
    pub tokens: Vec<u32>,
    /// Their log probabilities, where the request asked for them.
    pub logprobs: Vec<dolphin_proto::v1::TokenLogprobs>,
    /// The concatenated text.
    pub text: String,
    /// Finish reason of the last message.
    pub finish_reason: Option<FinishReason>,
    /// Usage of the last message that had one.
    pub usage: Option<Usage>,
    /// Routing of the first message that had one.
    pub first_routing: Option<RoutingInfo>,
    /// Routing of the last message that had one.
    pub last_routing: Option<RoutingInfo>,
    /// Timings of the last message that had them.
    pub timings: Option<Timings>,
}

/// Sends `req` and drains the stream; a status (at call time or mid-stream) is returned as is.
pub async fn generate(
    client: &mut InferenceClient<Channel>,
    req: GenerateRequest,
) -> Result<Generated, tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut out = Generated::default();
    while let Some(msg) = stream.message().await? {
        out.push(msg);
    }
    Ok(out)
}

impl Generated {
    /// Adds one message of a Generate stream.
    pub fn push(&mut self, msg: GenerateResponse) {
        self.messages += 1;
        self.tokens.extend_from_slice(&msg.token_ids);
        self.logprobs.extend(msg.logprobs);
        self.text.push_str(&msg.text);
        if msg.finish_reason != FinishReason::Unspecified as i32 {
            self.finish_reason = FinishReason::try_from(msg.finish_reason).ok();
        }
        if msg.usage.is_some() {
            self.usage = msg.usage;
        }
        if msg.timings.is_some() {
            self.timings = msg.timings;
        }
        if let Some(routing) = msg.routing {
            if self.first_routing.is_none() {
                self.first_routing = Some(routing.clone());
            }
            self.last_routing = Some(routing);
        }
    }
}

/// The router's current worker list.
pub async fn list_workers(
    admin: &mut RouterAdminClient<Channel>,
) -> anyhow::Result<Vec<WorkerStatus>> {
    list_workers_with_key(admin, None).await
}

/// The router's current worker list, asked with admin key `key`.
pub async fn list_workers_with_key(
    admin: &mut RouterAdminClient<Channel>,
    key: Option<&str>,
) -> anyhow::Result<Vec<WorkerStatus>> {
    Ok(admin
        .list_workers(with_key(ListWorkersRequest {}, key))
        .await?
        .into_inner()
        .workers)
}

/// `message` as a request carrying `authorization: Bearer KEY` when `key` is given.
pub fn with_key<T>(message: T, key: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Some(key) = key
        && let Ok(value) = format!("Bearer {key}").parse()
    {
        req.metadata_mut().insert("authorization", value);
    }
    req
}

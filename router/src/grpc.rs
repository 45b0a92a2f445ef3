//! The router's gRPC services: `dolphin.v1.Inference` (public, on the serving shards) and
//! `RouterAdmin` (operators, on the admin listener), each with `grpc.health.v1` and reflection
//! and each behind its own keys.

use std::pin::Pin;
use std::sync::Arc;

use dolphin_proto::v1::{
    self, generate_request::Input, inference_server::Inference, router_admin_server::RouterAdmin,
};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use tonic::service::interceptor::InterceptedService;
use tower::Layer;

use crate::admission::InflightLimit;
use crate::answer::{AnswerReader, Readers};
use crate::auth::{self, KeySet};
use crate::dispatch::{Dispatcher, GenerateParams, Prompt};
use crate::dolphin::admin;
use crate::policy::{Decision, Policy};
use crate::shard::ShardListener;
use crate::stream::{Api, ResponseStream};
use crate::tokenizer::{ChatMessage, ToolCall};
use crate::tools::{self, Mode, ToolCallParser, ToolRequest};

/// `dolphin.v1.Inference` over the dispatcher.
#[derive(Clone, Debug)]
pub struct InferenceService {
    dispatcher: Arc<Dispatcher>,
}

impl InferenceService {
    /// The service.
    pub fn new(dispatcher: Arc<Dispatcher>) -> Self {
        Self { dispatcher }
    }
}

/// Turns a `GenerateRequest` into dispatcher parameters, and for a chat request how its answer
/// is read for tool calls (by the router's `--tool-call-parser`; `None`: not a chat request,
/// whose answer is never read).
pub(crate) fn params(
    r: v1::GenerateRequest,
    d: &Dispatcher,
) -> Result<(GenerateParams, Option<Mode>), Status> {
    let cfg = d.config();
    let mut sampling = r.sampling.unwrap_or_default();
    let mut format_field = "structured";
    let mut mode = None;
    let prompt = match r.input {
        Some(Input::Text(t)) => Prompt::Text(t),
        Some(Input::TokenIds(t)) => Prompt::Tokens(t.ids),
        Some(Input::Chat(mut c)) => {
            let request = chat_tools(&c, cfg.tool_call_parser)?;
            if let Some(format) = request.format() {
                if sampling.structured.is_some() {
                    return Err(Status::invalid_argument(
                        "sampling.structured cannot be set with a forced tool call (chat.tool_choice \"required\" or a function's name): send one",
                    ));
                }
                sampling.structured = Some(Box::new(format.to_wire()));
                format_field = "chat.tools";
            } else if crate::tools::draw_strict(d.strict_tools(&request), &mut sampling) {
                // Strict tools under "auto", as over HTTP.
                format_field = "chat.tools";
            }
            mode = Some(request.mode);
            let extras = chat_extras(&mut c, cfg.trust_request_chat_template)?;
            Prompt::Chat {
                messages: c.messages.into_iter().map(chat_message).collect(),
                extras: Box::new(crate::tokenizer::ChatExtras {
                    tools: request.tools,
                    ..extras
                }),
            }
        }
        None => {
            return Err(Status::invalid_argument(
                "input is required: text, token_ids or chat",
            ));
        }
    };
    let force = match v1::PrefillMode::try_from(r.force_mode) {
        Ok(v1::PrefillMode::Local) => Some(Decision::Local),
        Ok(v1::PrefillMode::Remote) => Some(Decision::Remote),
        Ok(v1::PrefillMode::Unspecified) => None,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown force_mode {}",
                r.force_mode
            )));
        }
    };
    let params = GenerateParams {
        format_field,
        request_id: r.request_id,
        model: r.model,
        prompt,
        sampling,
        // gRPC has no default: 0 is refused.
        max_tokens_is_default: false,
        force,
        slo: r.slo,
        api: Api::Grpc,
        timeout: None,
        trace: Default::default(),
        keep_call_markers: matches!(mode, Some(Mode::Auto { .. })),
        bad_words: r.bad_words,
        add_special_tokens: r.add_special_tokens,
        keep_special_tokens: r.keep_special_tokens,
        truncate_prompt_tokens: match r.truncate_prompt_tokens {
            Some(0) => {
                return Err(Status::invalid_argument(
                    "truncate_prompt_tokens must be at least 1 (unset keeps the whole prompt)",
                ));
            }
            n => n,
        },
    };
    Ok((params, mode))
}

/// How a chat request's conversation is rendered, less its tools: the same fields and checks
/// as over HTTP.
fn chat_extras(
    c: &mut v1::ChatMessages,
    trust_template: bool,
) -> Result<crate::tokenizer::ChatExtras, Status> {
    let kwargs = match c.template_kwargs_json.as_str() {
        "" => serde_json::Map::new(),
        text => serde_json::from_str(text)
            .map_err(|e| e.to_string())
            .and_then(crate::tokenizer::template_kwargs)
            .map_err(|e| Status::invalid_argument(format!("chat.template_kwargs_json: {e}")))?,
    };
    // The messages name the request's fields: over gRPC they are `chat.`'s.
    let ending = crate::tokenizer::ending(c.continue_final_message, c.add_generation_prompt)
        .map_err(|e| Status::invalid_argument(format!("chat.{e}")))?;
    let documents = match c.documents_json.as_str() {
        "" => None,
        text => Some(
            serde_json::from_str(text)
                .map_err(|e| e.to_string())
                .and_then(crate::tokenizer::documents)
                .map_err(|e| Status::invalid_argument(format!("chat.documents_json {e}")))?,
        ),
    };
    let template =
        crate::tokenizer::request_template(std::mem::take(&mut c.chat_template), trust_template)
            .map_err(|e| Status::invalid_argument(format!("chat.{e}")))?;
    Ok(crate::tokenizer::ChatExtras {
        tools: None,
        kwargs,
        documents,
        ending,
        template,
    })
}

/// A chat message of the request, its earlier calls' arguments as objects (as templates
/// write them) where they parse.
fn chat_message(m: v1::ChatMessage) -> ChatMessage {
    ChatMessage {
        role: m.role,
        content: m.content,
        tool_calls: m
            .tool_calls
            .into_iter()
            .map(|c| ToolCall::from_text(c.id, c.name, c.arguments))
            .collect(),
        tool_call_id: (!m.tool_call_id.is_empty()).then_some(m.tool_call_id),
        name: (!m.name.is_empty()).then_some(m.name),
        reasoning_content: (!m.reasoning_content.is_empty()).then_some(m.reasoning_content),
    }
}

/// A chat request's tools, read as OpenAI's fields are over HTTP (the same checks and
/// refusals): `tools` from each `Tool`, `tool_choice` from the choice or function name.
fn chat_tools(c: &v1::ChatMessages, parser: Option<ToolCallParser>) -> Result<ToolRequest, Status> {
    use serde_json::{Value, json};
    if c.tools.is_empty() && c.tool_choice.is_empty() {
        return Ok(ToolRequest::default());
    }
    let mut list = Vec::with_capacity(c.tools.len());
    for (i, t) in c.tools.iter().enumerate() {
        let mut function = json!({"name": t.name});
        if !t.description.is_empty() {
            function["description"] = json!(t.description);
        }
        if !t.parameters_json.is_empty() {
            let parameters: Value = serde_json::from_str(&t.parameters_json).map_err(|e| {
                Status::invalid_argument(format!(
                    "chat.tools[{i}].parameters_json is not JSON: {e}"
                ))
            })?;
            function["parameters"] = parameters;
        }
        if t.strict {
            function["strict"] = json!(true);
        }
        list.push(json!({"type": "function", "function": function}));
    }
    let choice = match c.tool_choice.as_str() {
        "" => Value::Null,
        "none" | "auto" | "required" => json!(c.tool_choice),
        name => json!({"type": "function", "function": {"name": name}}),
    };
    let fields =
        json!({"tools": list, "tool_choice": choice, "parallel_tool_calls": !c.single_tool_call});
    let mut fields = serde_json::from_value(fields)
        .map_err(|e| Status::internal(format!("tool fields: {e}")))?;
    tools::take(&mut fields, parser)
        .map_err(|(_, message)| Status::invalid_argument(format!("chat: {message}")))
}

pub(crate) type GenerateStream =
    Pin<Box<dyn Stream<Item = Result<v1::GenerateResponse, Status>> + Send>>;

/// Maps the response stream to `GenerateResponse`s: routing on the first message (where the
/// request started) and the last (where it ended, after any migration or fallback); a chat
/// answer read for calls as `tools` says and, as `readers` say, split into thinking and text.
pub(crate) fn responses(stream: ResponseStream, tools: Mode, readers: Readers) -> GenerateStream {
    let request_id = stream.request_id().to_string();
    let routing = stream.routing();
    let mut first = true;
    let mut reader = AnswerReader::new(&tools, readers);
    Box::pin(stream.into_stream().map(move |item| {
        let delta = item.map_err(Status::from)?;
        let mut msg = v1::GenerateResponse {
            request_id: request_id.clone(),
            token_ids: delta.token_ids,
            logprobs: delta.logprobs,
            prompt_logprobs: delta.prompt_logprobs,
            text: delta.text,
            ..Default::default()
        };
        if std::mem::take(&mut first) {
            msg.routing = Some(routing.clone());
        }
        if let Some(reader) = reader.as_mut() {
            let read = reader.read(&msg.text, delta.finish.is_some());
            msg.text = read.text;
            msg.reasoning_text = read.reasoning;
            msg.tool_calls = read
                .calls
                .into_iter()
                .map(|c| v1::ToolCall {
                    index: c.index,
                    id: c.id.unwrap_or_default(),
                    name: c.name.unwrap_or_default(),
                    arguments: c.arguments,
                })
                .collect();
        }
        if let Some(f) = delta.finish {
            msg.finish_reason = match &reader {
                Some(r) if r.ends_in_calls() => v1::FinishReason::ToolCalls as i32,
                _ => f.reason as i32,
            };
            msg.usage = Some(f.usage);
            msg.timings = Some(f.timings);
            msg.routing = Some(f.routing);
        }
        Ok(msg)
    }))
}

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        req: Request<v1::GenerateRequest>,
    ) -> Result<Response<GenerateStream>, Status> {
        // The client's deadline, as gRPC carries it.
        let timeout = dolphin_proto::deadline::of(req.metadata());
        // The request's spans go under the call's (`ServerSpanLayer`), which continues the
        // client's `traceparent`: no trace headers for the dispatcher to read.
        let cfg = self.dispatcher.config();
        let (mut p, tools) = params(req.into_inner(), &self.dispatcher)?;
        // Thinking is split from chat answers only, as over HTTP.
        let readers = Readers::of(
            tools.as_ref().and(cfg.reasoning_parser),
            cfg.tool_call_parser,
        );
        p.timeout = timeout;
        let stream = self.dispatcher.generate(p).await?;
        let tools = tools.unwrap_or_default();
        Ok(Response::new(responses(stream, tools, readers)))
    }

    async fn list_models(
        &self,
        _: Request<v1::ListModelsRequest>,
    ) -> Result<Response<v1::ListModelsResponse>, Status> {
        let cfg = self.dispatcher.config();
        Ok(Response::new(v1::ListModelsResponse {
            models: vec![v1::ModelCard {
                id: cfg.model.clone(),
                context_length: self.dispatcher.context_length(),
                vocab_size: self.dispatcher.tokenizer().vocab_size(),
            }],
        }))
    }
}

/// `dolphin.v1.RouterAdmin`: workers, policy, split, routing tables, classifier.
#[derive(Clone, Debug)]
pub struct AdminService {
    dispatcher: Arc<Dispatcher>,
}

impl AdminService {
    /// The service.
    pub fn new(dispatcher: Arc<Dispatcher>) -> Self {
        Self { dispatcher }
    }
}

fn policy_config(p: &Policy) -> v1::PolicyConfig {
    v1::PolicyConfig {
        name: p.name().into(),
        params_json: p.params_json(),
    }
}

#[tonic::async_trait]
impl RouterAdmin for AdminService {
    async fn list_workers(
        &self,
        _: Request<v1::ListWorkersRequest>,
    ) -> Result<Response<v1::ListWorkersResponse>, Status> {
        Ok(Response::new(v1::ListWorkersResponse {
            workers: self.dispatcher.registry().list(),
        }))
    }

    async fn get_policy(
        &self,
        _: Request<v1::GetPolicyRequest>,
    ) -> Result<Response<v1::PolicyConfig>, Status> {
        Ok(Response::new(policy_config(&self.dispatcher.policy())))
    }

    async fn set_policy(
        &self,
        req: Request<v1::PolicyConfig>,
    ) -> Result<Response<v1::PolicyConfig>, Status> {
        let r = req.into_inner();
        let p = Policy::from_parts(&r.name, &r.params_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.dispatcher.set_policy(p);
        Ok(Response::new(policy_config(&p)))
    }

    async fn list_tables(
        &self,
        _: Request<v1::ListTablesRequest>,
    ) -> Result<Response<v1::ListTablesResponse>, Status> {
        admin::list_tables(&self.dispatcher)
            .await
            .map(Response::new)
    }

    async fn get_table(
        &self,
        req: Request<v1::GetTableRequest>,
    ) -> Result<Response<v1::TableDocument>, Status> {
        admin::get_table(&self.dispatcher, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn put_table(
        &self,
        req: Request<v1::PutTableRequest>,
    ) -> Result<Response<v1::PutTableResponse>, Status> {
        admin::put_table(&self.dispatcher, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn activate_table(
        &self,
        req: Request<v1::ActivateTableRequest>,
    ) -> Result<Response<v1::ActiveTablePointer>, Status> {
        admin::activate_table(&self.dispatcher, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn rollback_table(
        &self,
        req: Request<v1::RollbackTableRequest>,
    ) -> Result<Response<v1::ActiveTablePointer>, Status> {
        admin::rollback_table(&self.dispatcher, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_classifier(
        &self,
        _: Request<v1::GetClassifierRequest>,
    ) -> Result<Response<v1::ClassifierDocument>, Status> {
        Ok(Response::new(admin::get_classifier(&self.dispatcher)))
    }

    async fn put_classifier(
        &self,
        req: Request<v1::ClassifierDocument>,
    ) -> Result<Response<v1::ClassifierDocument>, Status> {
        admin::put_classifier(&self.dispatcher, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_split(
        &self,
        _: Request<v1::GetSplitRequest>,
    ) -> Result<Response<v1::Split>, Status> {
        let (prefill, decode) = self.dispatcher.registry().counts();
        Ok(Response::new(v1::Split {
            prefill,
            decode,
            name: format!("{prefill}p{decode}d"),
        }))
    }
}

/// `grpc.health.v1` (reporting `S` serving) and reflection, served beside each listener's API.
async fn health_and_reflection<S: tonic::server::NamedService>() -> tonic::service::Routes {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<S>().await;
    let (reflection_v1, reflection_v1alpha) = dolphin_proto::reflection_services();
    tonic::service::Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
}

/// `Inference` behind its layers, outermost first: the API key (a caller without one learns
/// nothing, not even that the router is full), then a slot of the router's in-flight limit
/// (RESOURCE_EXHAUSTED before the message is decoded when none is free; listing models takes
/// none).
pub(crate) fn inference_service(
    dispatcher: Arc<Dispatcher>,
    api_keys: Option<KeySet>,
    limit: &InflightLimit,
) -> impl tower::Service<
    http::Request<tonic::body::Body>,
    Response = http::Response<impl http_body::Body<Data = bytes::Bytes, Error = Status> + use<>>,
    Error = std::convert::Infallible,
    Future: Send,
>
+ tonic::server::NamedService
+ Clone
+ Send
+ Sync
+ 'static
+ use<> {
    let limited = limit
        .layer(
            Api::Grpc,
            |e| Status::from(e).into_http(),
            &["/dolphin.v1.Inference/ListModels"],
        )
        .layer(
            v1::inference_server::InferenceServer::new(InferenceService::new(dispatcher))
                // Clients may compress requests (long prompts as token ids shrink well); answers
                // stay uncompressed, since every client advertises gzip and a token stream
                // would pay for compressing each small message.
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                // Stated, not left to tonic's default, so the `Generate` fast path's limit is
                // the same by construction.
                .max_decoding_message_size(crate::grpc_generate::MAX_MESSAGE_BYTES),
        );
    InterceptedService::new(limited, auth::interceptor(api_keys, "API"))
}

/// Serves `Inference` on `listener` until `shutdown` fires; calls need one of `api_keys` and
/// a slot of `limit`.
pub(crate) async fn serve(
    listener: ShardListener,
    dispatcher: Arc<Dispatcher>,
    api_keys: Option<KeySet>,
    limit: InflightLimit,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let incoming = futures::stream::unfold(listener, |mut listener| async move {
        let (stream, _) = listener.next().await;
        Some((Ok::<_, std::io::Error>(stream), listener))
    });
    let common =
        health_and_reflection::<v1::inference_server::InferenceServer<InferenceService>>().await;
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // Outermost: the call's span covers the key check and the in-flight limit too.
        .layer(dolphin_cluster::layers::ServerSpanLayer)
        // Plain `Generate` calls skip tonic's routes, layers and codec (`grpc_generate`); the
        // rest, compressed `Generate` calls included, go on to the services below.
        .layer(crate::grpc_generate::GenerateLayer::new(
            dispatcher.clone(),
            api_keys.clone(),
            limit.clone(),
        ))
        .add_routes(common)
        .add_service(inference_service(dispatcher, api_keys, &limit))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
}

/// Serves `RouterAdmin` on `incoming` (the admin listener, TLS or not) until `shutdown` fires;
/// calls need one of `admin_keys`.
pub(crate) async fn serve_admin(
    incoming: dolphin_tls::TlsIncoming,
    dispatcher: Arc<Dispatcher>,
    admin_keys: Option<KeySet>,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let common =
        health_and_reflection::<v1::router_admin_server::RouterAdminServer<AdminService>>().await;
    tonic::transport::Server::builder()
        .layer(dolphin_cluster::layers::ServerSpanLayer)
        .add_routes(common)
        .add_service(
            v1::router_admin_server::RouterAdminServer::with_interceptor(
                AdminService::new(dispatcher),
                auth::interceptor(admin_keys, "admin"),
            ),
        )
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;

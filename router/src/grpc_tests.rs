//! gRPC service tests over a real socket against fake workers.

use dolphin_cluster::Role;
use dolphin_proto::v1::{
    inference_client::InferenceClient, router_admin_client::RouterAdminClient,
};
use tonic::Code;
use tonic::transport::Channel;

use super::*;
use crate::admission::InflightLimit;
use crate::auth::KeySet;
use crate::request_log::RequestLog;
use crate::testutil::{Behavior, FakeWorker, dispatcher, text_request, until_in_flight};

async fn start(d: Arc<Dispatcher>) -> (Channel, CancellationToken) {
    let (public, _admin, stop) = start_with_keys(d, None, None).await;
    (public, stop)
}

async fn start_with_keys(
    d: Arc<Dispatcher>,
    api_keys: Option<KeySet>,
    admin_keys: Option<KeySet>,
) -> (Channel, Channel, CancellationToken) {
    start_with(d, api_keys, admin_keys, InflightLimit::new(16)).await
}

async fn channel(addr: std::net::SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

/// The public listener (on a shard, limited to `limit`) and the admin listener, each with its
/// keys.
async fn start_with(
    d: Arc<Dispatcher>,
    api_keys: Option<KeySet>,
    admin_keys: Option<KeySet>,
    limit: InflightLimit,
) -> (Channel, Channel, CancellationToken) {
    let bind = || async {
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
    };
    let (listener, admin_listener) = (bind().await, bind().await);
    let (addr, admin_addr) = (
        listener.local_addr().expect("addr"),
        admin_listener.local_addr().expect("addr"),
    );
    let stop = CancellationToken::new();
    let mut shards = crate::shard::deal(listener, 1, None, stop.clone()).expect("deal");
    tokio::spawn(serve(
        shards.remove(0),
        d.clone(),
        api_keys,
        limit,
        stop.clone(),
    ));
    let incoming = dolphin_tls::accept_incoming(admin_listener, None, stop.clone());
    tokio::spawn(serve_admin(incoming, d, admin_keys, stop.clone()));
    (channel(addr).await, channel(admin_addr).await, stop)
}

fn key_file(dir: &tempfile::TempDir, name: &str, key: &str) -> KeySet {
    let path = dir.path().join(name);
    std::fs::write(&path, format!("{key}\n")).expect("write");
    KeySet::load(&path).expect("load")
}

fn with_key<T>(mut req: tonic::Request<T>, key: &str) -> tonic::Request<T> {
    let value = format!("Bearer {key}").parse().expect("metadata");
    req.metadata_mut().insert("authorization", value);
    req
}

#[tokio::test]
async fn inference_and_admin_take_only_their_own_keys() {
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    let dir = tempfile::tempdir().expect("dir");
    let (api, admin_keys) = (
        key_file(&dir, "api", "sk-user"),
        key_file(&dir, "admin", "sk-admin"),
    );
    let (public, admin, _stop) = start_with_keys(d, Some(api), Some(admin_keys)).await;
    let mut inference = InferenceClient::new(public.clone());
    let models = |key: Option<&str>| {
        let req = tonic::Request::new(v1::ListModelsRequest {});
        match key {
            Some(k) => with_key(req, k),
            None => req,
        }
    };
    for (key, why) in [(None, "missing"), (Some("sk-admin"), "invalid")] {
        let err = inference
            .list_models(models(key))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::Unauthenticated, "{key:?}");
        assert!(err.message().contains(why), "{}", err.message());
    }
    let err = inference
        .generate(text_request("hi", 2))
        .await
        .expect_err("no key, no generation");
    assert_eq!(err.code(), Code::Unauthenticated);
    inference
        .list_models(models(Some("sk-user")))
        .await
        .expect("the API key admits");

    let mut admin = RouterAdminClient::new(admin);
    let policy = |key: &str| with_key(tonic::Request::new(v1::GetPolicyRequest {}), key);
    assert_eq!(
        admin
            .get_policy(policy("sk-user"))
            .await
            .expect_err("user key")
            .code(),
        Code::Unauthenticated
    );
    admin
        .get_policy(policy("sk-admin"))
        .await
        .expect("admin key");
    // RouterAdmin is not on the public listener at all.
    let err = RouterAdminClient::new(public)
        .get_policy(policy("sk-admin"))
        .await
        .expect_err("not public");
    assert_eq!(err.code(), Code::Unimplemented);
}

#[tokio::test]
async fn generate_streams_with_routing_on_first_and_last() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("xyz".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let (ch, _stop) = start(d).await;
    let mut client = InferenceClient::new(ch);
    let mut req = text_request("hello", 4);
    req.request_id = "my-req".into();
    let mut stream = client.generate(req).await.expect("generate").into_inner();
    let mut msgs = Vec::new();
    while let Some(m) = stream.message().await.expect("message") {
        msgs.push(m);
    }
    let text: String = msgs.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(text, "xyzx");
    assert!(msgs.iter().all(|m| m.request_id == "my-req"));
    let first = msgs
        .first()
        .expect("first")
        .routing
        .clone()
        .expect("routing on first");
    assert_eq!(
        (
            first.decode_worker.as_str(),
            first.policy.as_str(),
            first.cluster
        ),
        ("d1", "always-local", -1)
    );
    // Tokens already received are merged into one message, so there may be a single one (both
    // first and last); any in between carry no routing.
    let middle = msgs.len().saturating_sub(1);
    assert!(
        msgs.iter()
            .take(middle)
            .skip(1)
            .all(|m| m.routing.is_none())
    );
    let last = msgs.last().expect("last");
    assert_eq!(last.finish_reason, v1::FinishReason::Length as i32);
    assert!(last.routing.is_some());
    let usage = last.usage.clone().expect("usage");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (5, 4));
    assert!(last.timings.expect("timings").e2e_us > 0);
}

/// The fields that shape the prompt and the text read over gRPC as over HTTP: the last message
/// continued, the prompt's start truncated, the stop string kept, a request's own template
/// refused by a router that does not trust them.
#[tokio::test]
async fn the_request_shapes_its_prompt_over_grpc() {
    use crate::tokenizer::{ChatExtras, ChatMessage, Ending, SimTokenizer, Tokenizer};
    use v1::generate_request::Input;
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("abcENDxyz".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let (ch, _stop) = start(d).await;
    let mut client = InferenceClient::new(ch);
    let chat = |c: v1::ChatMessages| v1::GenerateRequest {
        input: Some(Input::Chat(v1::ChatMessages {
            messages: vec![
                v1::ChatMessage {
                    role: "user".into(),
                    content: "Name a colour.".into(),
                    ..Default::default()
                },
                v1::ChatMessage {
                    role: "assistant".into(),
                    content: "The colour is".into(),
                    ..Default::default()
                },
            ],
            ..c
        })),
        sampling: Some(v1::SamplingParams {
            max_tokens: 9,
            stop: vec!["END".into()],
            include_stop_str_in_output: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut req = chat(v1::ChatMessages {
        continue_final_message: true,
        ..Default::default()
    });
    req.truncate_prompt_tokens = Some(5);
    let mut stream = client.generate(req).await.expect("served").into_inner();
    let mut text = String::new();
    while let Some(m) = stream.message().await.expect("message") {
        text.push_str(&m.text);
    }
    assert_eq!(text, "abcEND");
    let extras = ChatExtras {
        ending: Ending::ContinueLast,
        ..Default::default()
    };
    let messages = [
        ChatMessage::new("user", "Name a colour."),
        ChatMessage::new("assistant", "The colour is"),
    ];
    let all = SimTokenizer.encode(
        &SimTokenizer
            .render_chat(&messages, &extras)
            .expect("renders"),
    );
    assert_eq!(fake.state.calls.lock()[0].token_ids, all[all.len() - 5..]);
    for (c, truncate, field) in [
        (
            v1::ChatMessages {
                chat_template: "{{ messages }}".into(),
                ..Default::default()
            },
            None,
            "chat_template",
        ),
        (
            v1::ChatMessages {
                continue_final_message: true,
                add_generation_prompt: Some(true),
                ..Default::default()
            },
            None,
            "continue_final_message",
        ),
        (
            v1::ChatMessages {
                documents_json: "{}".into(),
                ..Default::default()
            },
            None,
            "documents_json",
        ),
        (
            v1::ChatMessages::default(),
            Some(0),
            "truncate_prompt_tokens",
        ),
    ] {
        let mut req = chat(c);
        req.truncate_prompt_tokens = truncate;
        let status = client.generate(req).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
    }
    // vLLM's bad words, tokenized by the router beside the ids a client sends.
    let mut req = chat(v1::ChatMessages::default());
    req.bad_words = vec!["xy".into()];
    let sampling = req.sampling.as_mut().expect("sampling");
    sampling.logits = Some(Box::new(v1::LogitRules {
        bad_words: vec![v1::TokenIds { ids: vec![7, 8] }],
        ..Default::default()
    }));
    client.generate(req).await.expect("served");
    let sent = fake.state.calls.lock()[1]
        .sampling
        .clone()
        .expect("sampling");
    let words: Vec<Vec<u32>> = sent
        .logits
        .expect("rules")
        .bad_words
        .into_iter()
        .map(|w| w.ids)
        .collect();
    assert_eq!(words, [vec![7, 8], SimTokenizer.encode("xy")]);
    let mut req = chat(v1::ChatMessages::default());
    req.bad_words = vec![String::new()];
    let status = client.generate(req).await.expect_err("empty word");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("bad_words[0]"), "{status:?}");
}

/// Tool calling over gRPC reads as over HTTP: `"auto"` answers are read with the router's
/// parser (Hermes in the test dispatcher), the earlier calls reach the template, a named
/// function is drawn under its schema, and a malformed tool is `INVALID_ARGUMENT`.
#[tokio::test]
async fn chat_tools_are_called_over_grpc() {
    use v1::generate_request::Input;
    let answer = "Hm.<tool_call>{\"name\": \"wx\", \"arguments\": {\"c\": 1}}</tool_call>";
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text(answer.into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let (ch, _stop) = start(d).await;
    let client = InferenceClient::new(ch);
    let tool = v1::Tool {
        name: "wx".into(),
        description: "Weather".into(),
        parameters_json: r#"{"type": "object", "properties": {"c": {"type": "integer"}}}"#.into(),
        strict: false,
    };
    let chat = |tool_choice: &str, tools: Vec<v1::Tool>| v1::GenerateRequest {
        input: Some(Input::Chat(v1::ChatMessages {
            messages: vec![
                v1::ChatMessage {
                    role: "assistant".into(),
                    tool_calls: vec![v1::ToolCall {
                        id: "call_0".into(),
                        name: "wx".into(),
                        arguments: r#"{"c": 0}"#.into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                v1::ChatMessage {
                    role: "tool".into(),
                    content: "cold".into(),
                    tool_call_id: "call_0".into(),
                    ..Default::default()
                },
                v1::ChatMessage {
                    role: "user".into(),
                    content: "And now?".into(),
                    ..Default::default()
                },
            ],
            tools,
            tool_choice: tool_choice.into(),
            ..Default::default()
        })),
        sampling: Some(v1::SamplingParams {
            max_tokens: answer.len() as u32,
            ..Default::default()
        }),
        ..Default::default()
    };
    let collect = |mut client: InferenceClient<Channel>, req: v1::GenerateRequest| async move {
        let mut stream = client.generate(req).await?.into_inner();
        let mut msgs = Vec::new();
        while let Some(m) = stream.message().await? {
            msgs.push(m);
        }
        Ok::<_, Status>(msgs)
    };
    let msgs = collect(client.clone(), chat("", vec![tool.clone()]))
        .await
        .expect("auto");
    let text: String = msgs.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(text, "Hm.");
    let calls: Vec<&v1::ToolCall> = msgs.iter().flat_map(|m| &m.tool_calls).collect();
    assert_eq!(calls.len(), 1, "{msgs:?}");
    assert_eq!((calls[0].index, calls[0].name.as_str()), (0, "wx"));
    assert!(calls[0].id.starts_with("call_"));
    assert_eq!(calls[0].arguments, r#"{"c":1}"#);
    let last = msgs.last().expect("last");
    assert_eq!(last.finish_reason, v1::FinishReason::ToolCalls as i32);
    // The template saw the tools and the earlier call with its result.
    let prompt = crate::tokenizer::Tokenizer::decode(
        &crate::tokenizer::SimTokenizer,
        &fake.state.calls.lock()[0].token_ids,
    );
    assert!(
        prompt.contains("<tools>") && prompt.contains(r#""arguments":{"c":0}"#),
        "{prompt}"
    );
    assert!(prompt.contains("<|im_start|>tool\ncold"), "{prompt}");
    // Not strict: the model writes freely.
    let sent = fake.state.calls.lock()[0].sampling.clone();
    assert!(sent.expect("sampling").structured.is_none());

    // A named function: its schema goes to the worker as the format.
    *fake.state.behavior.lock() = Behavior::Text(r#"{"c": 2}"#.into());
    let mut req = chat("wx", vec![tool.clone()]);
    req.sampling.as_mut().expect("sampling").max_tokens = 8;
    let msgs = collect(client.clone(), req).await.expect("named");
    let calls: Vec<&v1::ToolCall> = msgs.iter().flat_map(|m| &m.tool_calls).collect();
    assert_eq!(calls[0].name, "wx");
    let args: String = calls.iter().map(|c| c.arguments.as_str()).collect();
    assert_eq!(args, r#"{"c": 2}"#);
    let sent = fake.state.calls.lock()[1]
        .sampling
        .clone()
        .expect("sampling");
    let format = dolphin_grammar::Format::from_wire(&sent.structured.expect("a format"));
    assert_eq!(
        format.expect("format"),
        dolphin_grammar::Format::JsonSchema(
            r#"{"type":"object","properties":{"c":{"type":"integer"}}}"#.into()
        )
    );

    // A strict tool under "auto": the answer is drawn under its calls' grammar.
    *fake.state.behavior.lock() = Behavior::Text(answer.into());
    let strict = v1::Tool {
        strict: true,
        ..tool.clone()
    };
    collect(client.clone(), chat("", vec![strict]))
        .await
        .expect("strict auto");
    let sent = fake.state.calls.lock()[2]
        .sampling
        .clone()
        .expect("sampling");
    let format = dolphin_grammar::Format::from_wire(&sent.structured.expect("a format"));
    assert!(
        matches!(format, Ok(dolphin_grammar::Format::Lark(ref g)) if g.contains("<tool_call>")),
        "{format:?}"
    );

    for (choice, tools, says) in [
        ("nope", vec![tool.clone()], "not one of the tools"),
        ("required", vec![], "needs tools"),
        (
            "",
            vec![v1::Tool {
                parameters_json: "{not json".into(),
                ..tool.clone()
            }],
            "parameters_json is not JSON",
        ),
    ] {
        let status = collect(client.clone(), chat(choice, tools))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    let mut req = chat("", vec![tool.clone()]);
    if let Some(Input::Chat(c)) = req.input.as_mut() {
        c.template_kwargs_json = r#"{"messages": []}"#.into();
    }
    let status = collect(client.clone(), req).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("template_kwargs_json"),
        "{status:?}"
    );
    assert_eq!(
        fake.state.calls.lock().len(),
        3,
        "refused before any worker"
    );
}

/// With `--reasoning-parser` a chat answer's thinking comes in `reasoning_text`; a text
/// prompt's answer is left as it is.
#[tokio::test]
async fn thinking_comes_apart_from_chat_answers_over_grpc() {
    use v1::generate_request::Input;
    let answer = "<think>Hm.</think>\n4";
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text(answer.into())).await;
    let d = crate::testutil::dispatcher_configured(
        Arc::new(crate::tokenizer::SimTokenizer),
        Policy::AlwaysLocal,
        RequestLog::disabled(),
        |c| c.reasoning_parser = Some(crate::reasoning::ReasoningParser::DeepseekR1),
    );
    d.registry().add(fake.record()).expect("add");
    let (ch, _stop) = start(d).await;
    let mut client = InferenceClient::new(ch);
    let max = answer.len() as u32;
    let chat = v1::GenerateRequest {
        input: Some(Input::Chat(v1::ChatMessages {
            messages: vec![v1::ChatMessage {
                role: "user".into(),
                content: "2+2?".into(),
                ..Default::default()
            }],
            ..Default::default()
        })),
        ..text_request("", max)
    };
    for (req, want) in [
        (chat, ("Hm.", "4")),
        (text_request("2+2?", max), ("", answer)),
    ] {
        let mut stream = client.generate(req).await.expect("generate").into_inner();
        let (mut thought, mut text) = (String::new(), String::new());
        while let Some(m) = stream.message().await.expect("message") {
            thought.push_str(&m.reasoning_text);
            text.push_str(&m.text);
        }
        assert_eq!((thought.as_str(), text.as_str()), want);
    }
}

#[tokio::test]
async fn gzip_compressed_requests_are_served_uncompressed() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("xyz".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let (ch, _stop) = start(d).await;
    let mut client = InferenceClient::new(ch)
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let resp = client
        .generate(text_request("hello", 3))
        .await
        .expect("a gzip request is accepted");
    assert!(
        resp.metadata().get("grpc-encoding").is_none(),
        "answers go uncompressed"
    );
    let mut stream = resp.into_inner();
    let mut text = String::new();
    while let Some(m) = stream.message().await.expect("message") {
        text.push_str(&m.text);
    }
    assert_eq!(text, "xyz");
}

#[tokio::test]
async fn errors_carry_clear_status_codes() {
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    let (ch, _stop) = start(d.clone()).await;
    let mut client = InferenceClient::new(ch);
    let code = |r: Result<tonic::Response<tonic::Streaming<v1::GenerateResponse>>, Status>| {
        r.expect_err("must fail").code()
    };
    assert_eq!(
        code(client.generate(text_request("hi", 2)).await),
        Code::Unavailable
    );
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Fail(Code::ResourceExhausted)).await;
    d.registry().add(fake.record()).expect("add");
    assert_eq!(
        code(client.generate(v1::GenerateRequest::default()).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(client.generate(text_request("hi", 0)).await),
        Code::InvalidArgument
    );
    let mut req = text_request("hi", 2);
    req.model = "other".into();
    assert_eq!(code(client.generate(req).await), Code::NotFound);
    let mut req = text_request("hi", 2);
    req.force_mode = 99;
    assert_eq!(code(client.generate(req).await), Code::InvalidArgument);
    assert_eq!(
        code(client.generate(text_request("hi", 2)).await),
        Code::ResourceExhausted
    );
}

#[tokio::test]
async fn a_full_router_sheds_with_resource_exhausted_and_streams_hold_their_slot() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let limit = InflightLimit::new(2);
    let (ch, _admin, _stop) = start_with(d, None, None, limit.clone()).await;
    let mut client = InferenceClient::new(ch);
    // Two streams with their first token in (the worker then hangs): both slots taken.
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut s = client
            .generate(text_request("hi", 5))
            .await
            .expect("generate")
            .into_inner();
        s.message().await.expect("first").expect("a message");
        open.push(s);
    }
    assert_eq!(limit.in_flight(), 2);
    let err = client
        .generate(text_request("hi", 5))
        .await
        .expect_err("shed");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("capacity"), "{}", err.message());
    // Listing models takes no slot.
    client
        .list_models(v1::ListModelsRequest {})
        .await
        .expect("models at capacity");
    // A cancelled stream frees its slot.
    drop(open.pop());
    until_in_flight(&limit, 1).await;
    client
        .generate(text_request("hi", 5))
        .await
        .expect("a slot is free again");
}

#[tokio::test]
async fn models_admin_and_health() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let (ch, admin_ch, _stop) = start_with_keys(d.clone(), None, None).await;
    let models = InferenceClient::new(ch.clone())
        .list_models(v1::ListModelsRequest {})
        .await
        .expect("models")
        .into_inner();
    assert_eq!(models.models[0].id, "sim-model");
    assert_eq!(models.models[0].vocab_size, 355);

    let mut admin = RouterAdminClient::new(admin_ch);
    let p = admin
        .get_policy(v1::GetPolicyRequest {})
        .await
        .expect("get")
        .into_inner();
    assert_eq!(p.name, "always-local");
    let set = v1::PolicyConfig {
        name: "threshold".into(),
        params_json: r#"{"variant":"dynamo-legacy"}"#.into(),
    };
    let p = admin.set_policy(set).await.expect("set").into_inner();
    assert_eq!(p.name, "threshold");
    assert!(p.params_json.contains("dynamo-legacy"));
    assert_eq!(d.policy().name(), "threshold");
    let bad = v1::PolicyConfig {
        name: "coin-flip".into(),
        params_json: String::new(),
    };
    assert_eq!(
        admin.set_policy(bad).await.expect_err("unknown").code(),
        Code::InvalidArgument
    );
    let split = admin
        .get_split(v1::GetSplitRequest {})
        .await
        .expect("split")
        .into_inner();
    assert_eq!(
        (split.prefill, split.decode, split.name.as_str()),
        (0, 1, "0p1d")
    );
    let workers = admin
        .list_workers(v1::ListWorkersRequest {})
        .await
        .expect("workers")
        .into_inner()
        .workers;
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].worker_id, "d1");
    assert_eq!(workers[0].grpc_addr, fake.addr.to_string());

    let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
    let req = tonic_health::pb::HealthCheckRequest {
        service: "dolphin.v1.Inference".into(),
    };
    let status = health.check(req).await.expect("health").into_inner().status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

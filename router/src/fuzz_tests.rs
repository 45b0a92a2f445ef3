//! Arbitrary input on the router's network-facing decoders: HTTP bodies into the OpenAI routes
//! (arbitrary bytes, and JSON objects of known and unknown fields with values of any type), and
//! arbitrary bytes decoded as `GenerateRequest` into the gRPC service. Every case gets an
//! answer (a stream, or an error in the API's shape), nothing panics, and the router keeps
//! serving. Property tests in place of `cargo fuzz` (which needs a nightly toolchain): a fixed
//! number of cases runs in CI.

use std::sync::Arc;

use axum::body::Body;
use dolphin_cluster::Role;
use dolphin_proto::v1::{self, inference_server::Inference};
use futures::StreamExt;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value};
use tower::ServiceExt;

use crate::dispatch::Dispatcher;
use crate::grpc::InferenceService;
use crate::http::{AppState, router};
use crate::policy::Policy;
use crate::request_log::RequestLog;
use crate::testutil::{Behavior, FakeWorker, dispatcher};

const CASES: u32 = 1024;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn fixture() -> (FakeWorker, Arc<Dispatcher>) {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("ok".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    (fake, d)
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        (0u64..70000).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((".{0,6}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A request body: mostly a valid request of either route with a few fields overwritten by
/// arbitrary values (so cases get past the JSON parser into validation and the worker), some
/// times arbitrary bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        Just("prompt"),
        Just("messages"),
        Just("max_tokens"),
        Just("temperature"),
        Just("top_p"),
        Just("top_k"),
        Just("seed"),
        Just("stop"),
        Just("n"),
        Just("stream"),
        Just("stream_options"),
        Just("model"),
        Just("prefill_mode"),
        Just("handoff"),
        Just("logprobs"),
        Just("tools"),
        Just("ignore_eos"),
        Just("repetition_penalty"),
        Just("min_tokens"),
        Just("unknown_field"),
        Just("input"),
        Just("instructions"),
        Just("max_output_tokens"),
        Just("text"),
        Just("include"),
        Just("continue_final_message"),
        Just("add_generation_prompt"),
        Just("truncate_prompt_tokens"),
        Just("prompt_logprobs"),
        Just("documents"),
        Just("include_stop_str_in_output"),
        Just("input_ids"),
        Just("sampling_params"),
        Just("return_logprob"),
        Just("logprob_start_len"),
        Just("rid"),
    ];
    let base = prop_oneof![
        Just(serde_json::json!({"prompt": "hello", "max_tokens": 2})),
        Just(serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})),
        Just(serde_json::json!({"prompt": [1, 2, 3], "max_tokens": 2, "stream": true})),
        Just(serde_json::json!({"input": "hi", "max_output_tokens": 2})),
        Just(
            serde_json::json!({"input": [{"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "x"}],
            "max_output_tokens": 2, "stream": true})
        ),
        Just(serde_json::json!({"text": ["hi", "yo"], "sampling_params": {"max_new_tokens": 2}})),
        Just(
            serde_json::json!({"input_ids": [1, 2], "stream": true, "return_logprob": true,
            "sampling_params": {"max_new_tokens": 2, "n": 2}})
        ),
    ];
    let object = (base, proptest::collection::vec((field, json_value()), 0..3)).prop_map(
        |(mut base, overrides)| {
            for (k, v) in overrides {
                base[k] = v;
            }
            serde_json::to_vec(&base).expect("serializable")
        },
    );
    prop_oneof![
        4 => object,
        1 => proptest::collection::vec(any::<u8>(), 0..256),
    ]
}

/// A `GenerateRequest` with arbitrary values in every field.
fn generate_request() -> impl Strategy<Value = v1::GenerateRequest> {
    use v1::generate_request::Input;
    // Weighted toward valid values, so a share of the cases is served.
    let input = prop_oneof![
        1 => Just(None),
        4 => ".{0,40}".prop_map(|t| Some(Input::Text(t))),
        2 => proptest::collection::vec(prop_oneof![0u32..600, any::<u32>()], 0..20)
            .prop_map(|ids| Some(Input::TokenIds(v1::TokenIds { ids }))),
        1 => (
            proptest::collection::vec((".{0,10}", ".{0,20}"), 0..3),
            // Tools: names and parameters valid or not, any choice.
            proptest::collection::vec(
                (
                    prop_oneof!["[a-z_]{1,8}", ".{0,8}"],
                    prop_oneof![
                        Just(String::new()),
                        Just(r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#.to_owned()),
                        ".{0,20}",
                    ],
                ),
                0..3,
            ),
            prop_oneof![Just(""), Just("none"), Just("auto"), Just("required"), Just("f")],
            any::<bool>(),
            // How the conversation ends, documents valid or not, a request template.
            (
                any::<Option<bool>>(),
                any::<bool>(),
                prop_oneof![Just(String::new()), Just(r#"[{"text": "d"}]"#.to_owned()), ".{0,12}"],
                prop_oneof![3 => Just(String::new()), 1 => ".{0,12}"],
            ),
        )
            .prop_map(|(m, tools, choice, single, (add, continued, documents, template))| {
                Some(Input::Chat(v1::ChatMessages {
                    messages: m
                        .into_iter()
                        .map(|(role, content)| v1::ChatMessage {
                            role,
                            content,
                            ..Default::default()
                        })
                        .collect(),
                    tools: tools
                        .into_iter()
                        .map(|(name, parameters_json)| v1::Tool {
                            name,
                            description: String::new(),
                            parameters_json,
                            strict: false,
                        })
                        .collect(),
                    tool_choice: choice.to_owned(),
                    single_tool_call: single,
                    template_kwargs_json: if single {
                        r#"{"enable_thinking": false}"#.into()
                    } else {
                        String::new()
                    },
                    add_generation_prompt: add,
                    continue_final_message: continued,
                    documents_json: documents,
                    chat_template: template,
                }))
            }),
    ];
    let float = prop_oneof![
        6 => 0f32..1.0,
        1 => any::<f32>(),
        1 => Just(f32::NAN),
        1 => Just(-1.0f32),
    ];
    let max_tokens = prop_oneof![6 => 1u32..8, 1 => Just(0u32), 1 => any::<u32>()];
    let sampling = (
        float.clone(),
        any::<u32>(),
        float,
        max_tokens,
        any::<bool>(),
    )
        .prop_map(
            |(temperature, top_k, top_p, max_tokens, ignore_eos)| v1::SamplingParams {
                temperature,
                top_k: top_k % 100,
                top_p,
                max_tokens,
                ignore_eos,
                ..Default::default()
            },
        );
    (
        prop_oneof![3 => Just(String::new()), 3 => Just("sim-model".to_owned()), 1 => ".{0,8}"],
        input,
        proptest::option::weighted(0.9, sampling),
        -2i32..5,
    )
        .prop_map(|(model, input, sampling, force_mode)| v1::GenerateRequest {
            model,
            input,
            sampling,
            force_mode,
            ..Default::default()
        })
}

#[test]
fn arbitrary_http_bodies_get_an_answer() {
    let rt = runtime();
    let (_fake, d) = rt.block_on(fixture());
    let app = router(AppState {
        dispatcher: d,
        metrics: None,
        api_keys: None,
        limit: crate::admission::InflightLimit::new(1024),
        responses: crate::http::response_store::ResponseStore::new(16),
    });
    let mut runner = TestRunner::new(Config::with_cases(CASES));
    let paths = prop_oneof![
        Just("/v1/completions"),
        Just("/v1/chat/completions"),
        Just("/v1/responses"),
        Just("/generate")
    ];
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
    runner
        .run(&(paths, body()), |(path, bytes)| {
            rt.block_on(async {
                let req = Request::post(path)
                    .header("content-type", "application/json")
                    .body(Body::from(bytes.clone()))
                    .expect("request");
                let resp = app.clone().oneshot(req).await.expect("infallible");
                let status = resp.status();
                *statuses.borrow_mut().entry(status.as_u16()).or_default() += 1;
                let body = resp.into_body().collect().await.expect("body").to_bytes();
                let text = String::from_utf8_lossy(&body);
                if status == StatusCode::OK {
                    // A whole JSON answer (a list: SGLang's batch) or an SSE stream.
                    assert!(
                        text.starts_with('{') || text.starts_with('[') || text.contains("data: "),
                        "{path} {}: {text}",
                        String::from_utf8_lossy(&bytes)
                    );
                } else {
                    assert!(
                        status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE,
                        "{path} {}: {status} {text}",
                        String::from_utf8_lossy(&bytes)
                    );
                    let v: Value = serde_json::from_slice(&body).expect("an OpenAI error body");
                    assert!(v["error"]["message"].is_string(), "{v}");
                }
            });
            Ok(())
        })
        .expect("no case fails");
    // Both outcomes were exercised: served requests and refused ones.
    let statuses = statuses.into_inner();
    assert!(
        statuses.contains_key(&200) && statuses.contains_key(&400),
        "{statuses:?}"
    );
}

#[test]
fn arbitrary_grpc_messages_get_an_answer() {
    let rt = runtime();
    let (_fake, d) = rt.block_on(fixture());
    let svc = InferenceService::new(d);
    let mut runner = TestRunner::new(Config::with_cases(CASES));
    // Arbitrary bytes through prost's decoder, and arbitrary values in a well-formed message.
    let bytes = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..128),
        generate_request().prop_map(|m| prost::Message::encode_to_vec(&m)),
    ];
    let (decoded, served) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    runner
        .run(&bytes, |bytes| {
            let Ok(msg) = <v1::GenerateRequest as prost::Message>::decode(bytes.as_slice()) else {
                return Ok(());
            };
            decoded.set(decoded.get() + 1);
            rt.block_on(async {
                match svc.generate(tonic::Request::new(msg.clone())).await {
                    Ok(resp) => {
                        served.set(served.get() + 1);
                        let mut stream = resp.into_inner();
                        while let Some(item) = stream.next().await {
                            if let Err(s) = item {
                                assert_ne!(s.code(), tonic::Code::Unknown, "{msg:?}: {s:?}");
                                break;
                            }
                        }
                    }
                    // A refusal of the request's class (invalid, unknown model, no prefill
                    // worker for a forced remote path), never a failure of the router's own.
                    Err(s) => assert!(
                        !matches!(s.code(), tonic::Code::Internal | tonic::Code::Unknown),
                        "{msg:?}: {s:?}"
                    ),
                }
            });
            Ok(())
        })
        .expect("no case fails");
    assert!(
        decoded.get() > 10 && served.get() > 0,
        "{} decoded, {} served",
        decoded.get(),
        served.get()
    );
}

//! gRPC service tests over a real socket against fake workers.

use dolphin_cluster::Role;
use dolphin_proto::v1::{
    inference_client::InferenceClient, router_admin_client::RouterAdminClient,
};
use tonic::Code;
use tonic::transport::Channel;

use super::*;
use crate::request_log::RequestLog;
use crate::testutil::{Behavior, FakeWorker, dispatcher};

async fn start(d: Arc<Dispatcher>) -> (Channel, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    let mut shards = crate::shard::deal(listener, 1, None, stop.clone()).expect("deal");
    tokio::spawn(serve(shards.remove(0), d, stop.clone()));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    (channel, stop)
}

fn text_request(text: &str, max_tokens: u32) -> v1::GenerateRequest {
    v1::GenerateRequest {
        input: Some(Input::Text(text.into())),
        sampling: Some(v1::SamplingParams {
            max_tokens,
            ..Default::default()
        }),
        ..Default::default()
    }
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
async fn models_admin_and_health() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let (ch, _stop) = start(d.clone()).await;
    let models = InferenceClient::new(ch.clone())
        .list_models(v1::ListModelsRequest {})
        .await
        .expect("models")
        .into_inner();
    assert_eq!(models.models[0].id, "sim-model");
    assert_eq!(models.models[0].vocab_size, 355);

    let mut admin = RouterAdminClient::new(ch.clone());
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

//! Dispatcher tests against in-process fake workers.

use std::sync::atomic::Ordering;

use dolphin_cluster::{Role, block_hashes};
use dolphin_proto::v1::{self, FinishReason};
use tonic::Code;

use super::*;
use crate::error::ErrorKind;
use crate::policy::ThresholdConfig;
use crate::stream::{Api, Finish};
use crate::testutil::{Behavior, FakeWorker, dispatcher, eventually, wait_indexed};
use crate::tokenizer::SimTokenizer;

fn params(prompt: &str, max_tokens: u32) -> GenerateParams {
    GenerateParams {
        request_id: String::new(),
        model: String::new(),
        prompt: Prompt::Text(prompt.into()),
        sampling: v1::SamplingParams {
            max_tokens,
            ..Default::default()
        },
        force: None,
        slo: None,
        api: Api::Grpc,
    }
}

async fn collect(mut s: ResponseStream) -> Result<(String, Finish), DispatchError> {
    let mut text = String::new();
    while let Some(d) = s.next().await {
        let d = d?;
        text.push_str(&d.text);
        if let Some(f) = d.finish {
            return Ok((text, f));
        }
    }
    panic!("stream ended without a finish");
}

fn threshold() -> Policy {
    Policy::Threshold(ThresholdConfig::default())
}

#[tokio::test]
async fn local_request_streams_detokenized_text() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("abc".into())).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let s = d
        .generate(params("hello world", 5))
        .await
        .expect("generate");
    assert_eq!(
        s.route().decision,
        Decision::Local,
        "no prefill workers: local"
    );
    assert_eq!(s.route().policy, "threshold");
    assert!(s.request_id().starts_with("req-"));
    let (text, fin) = collect(s).await.expect("ok");
    assert_eq!(text, "abcab");
    assert_eq!(fin.reason, FinishReason::Length);
    assert_eq!(
        (
            fin.usage.prompt_tokens,
            fin.usage.completion_tokens,
            fin.usage.cached_tokens
        ),
        (11, 5, 4)
    );
    assert_eq!(fin.timings.prefill_us, 7);
    let calls = fake.state.calls.lock();
    assert_eq!(calls[0].token_ids, SimTokenizer.encode("hello world"));
    assert!(calls[0].remote.is_none());
}

#[tokio::test]
async fn remote_request_names_the_prefill_worker() {
    let dw = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let pw = FakeWorker::start("p1", Role::Prefill, Behavior::Text("x".into())).await;
    let d = dispatcher(Policy::AlwaysRemote, RequestLog::disabled());
    d.registry().add(dw.record()).expect("add");
    d.registry().add(pw.record()).expect("add");
    let s = d
        .generate(params("some prompt", 2))
        .await
        .expect("generate");
    let routing = s.routing();
    assert_eq!(routing.prefill_worker, "p1");
    assert_eq!(routing.mode, v1::PrefillMode::Remote as i32);
    assert_eq!(routing.cluster, -1);
    collect(s).await.expect("ok");
    let remote = dw.state.calls.lock()[0].remote.clone().expect("remote");
    assert_eq!(remote.prefill_addr, pw.addr.to_string());
    assert_eq!(remote.prefill_worker_id, "p1");
    // Forcing local overrides the policy.
    let mut p = params("some prompt", 2);
    p.force = Some(Decision::Local);
    let s = d.generate(p).await.expect("generate");
    assert_eq!(
        (s.route().decision, s.route().policy),
        (Decision::Local, "forced")
    );
}

#[tokio::test]
async fn routes_to_the_worker_holding_the_prefix_and_computes_features() {
    let a = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let b = FakeWorker::start("d2", Role::Decode, Behavior::Text("x".into())).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(a.record()).expect("add");
    d.registry().add(b.record()).expect("add");
    let prompt = "0123456789abcdef"; // 16 tokens: 4 blocks of 4
    let hashes = block_hashes(&SimTokenizer.encode(prompt), 4);
    b.store(&hashes[..3]);
    wait_indexed(&d, "d2", 3).await;
    for _ in 0..5 {
        let s = d.generate(params(prompt, 1)).await.expect("generate");
        assert_eq!(s.route().decode.worker.id.as_str(), "d2");
        assert_eq!(s.route().decode.cached_blocks, 3);
        let f = s.route().features;
        assert_eq!(
            (
                f.isl,
                f.eff_isl_decode,
                f.eff_isl_prefill,
                f.output_len_hint
            ),
            (16, 4, 16, 1)
        );
        collect(s).await.expect("ok");
    }
    // A load report that makes d2 busy sends traffic to d1.
    b.load(v1::LoadReport {
        waiting: 50,
        ..Default::default()
    });
    eventually("load applied", || {
        d.registry()
            .list()
            .iter()
            .any(|w| w.worker_id == "d2" && w.waiting == 50)
    })
    .await;
    let s = d.generate(params(prompt, 1)).await.expect("generate");
    assert_eq!(s.route().decode.worker.id.as_str(), "d1");
}

#[tokio::test]
async fn retries_once_on_another_worker_before_the_first_token() {
    let bad = FakeWorker::start("d1", Role::Decode, Behavior::Fail(Code::Unavailable)).await;
    let good = FakeWorker::start("d2", Role::Decode, Behavior::Text("ok".into())).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(bad.record()).expect("add");
    d.registry().add(good.record()).expect("add");
    // The failing worker holds the prefix, so it is tried first.
    let prompt = "0123456789abcdef";
    bad.store(&block_hashes(&SimTokenizer.encode(prompt), 4));
    wait_indexed(&d, "d1", 4).await;
    let s = d.generate(params(prompt, 2)).await.expect("retried");
    assert_eq!(s.route().decode.worker.id.as_str(), "d2");
    assert_eq!(collect(s).await.expect("ok").0, "ok");
    assert_eq!(bad.state.calls.lock().len(), 1);
}

#[tokio::test]
async fn worker_errors_keep_their_class_when_no_retry_helps() {
    let full = FakeWorker::start("d1", Role::Decode, Behavior::Fail(Code::ResourceExhausted)).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(full.record()).expect("add");
    let e = d.generate(params("hi", 2)).await.expect_err("full");
    assert_eq!(e.kind(), ErrorKind::Overloaded);
    *full.state.behavior.lock() = Behavior::Fail(Code::InvalidArgument);
    let e = d.generate(params("hi", 2)).await.expect_err("invalid");
    assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    // Invalid arguments are not retried.
    assert_eq!(full.state.calls.lock().len(), 2);
}

#[tokio::test]
async fn bad_requests_are_refused_before_any_worker_call() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    let e = d.generate(params("hi", 2)).await.expect_err("no workers");
    assert!(matches!(e, DispatchError::NoDecodeWorkers));
    d.registry().add(fake.record()).expect("add");
    let kind = |r: Result<ResponseStream, DispatchError>| r.expect_err("must fail").kind();
    assert_eq!(
        kind(d.generate(params("", 2)).await),
        ErrorKind::InvalidRequest
    );
    assert_eq!(
        kind(d.generate(params("hi", 0)).await),
        ErrorKind::InvalidRequest
    );
    assert_eq!(
        kind(d.generate(params("hi", 65)).await),
        ErrorKind::InvalidRequest
    );
    assert!(matches!(
        d.generate(params(&"x".repeat(1001), 2)).await,
        Err(DispatchError::PromptTooLong {
            tokens: 1001,
            limit: 1000
        })
    ));
    let mut p = params("hi", 2);
    p.model = "gpt-4".into();
    assert_eq!(kind(d.generate(p).await), ErrorKind::NotFound);
    let mut p = params("hi", 2);
    p.prompt = Prompt::Tokens(vec![5, 400]);
    assert_eq!(kind(d.generate(p).await), ErrorKind::InvalidRequest);
    let mut p = params("hi", 2);
    p.sampling.top_p = 2.0;
    assert_eq!(kind(d.generate(p).await), ErrorKind::InvalidRequest);
    let mut p = params("hi", 2);
    p.force = Some(Decision::Remote);
    assert!(matches!(
        d.generate(p).await,
        Err(DispatchError::NoPrefillWorkers)
    ));
    assert!(fake.state.calls.lock().is_empty());
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_worker_request_and_logs_it() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("requests.jsonl");
    let d = dispatcher(threshold(), RequestLog::open(&path).await.expect("log"));
    d.registry().add(fake.record()).expect("add");
    let mut s = d.generate(params("hi", 10)).await.expect("generate");
    let first = s.next().await.expect("delta").expect("ok");
    assert_eq!(first.token_ids, vec![40]);
    drop(s);
    eventually("worker saw the cancel", || {
        fake.state.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    let mut line = String::new();
    eventually("log line", || {
        line = std::fs::read_to_string(&path).unwrap_or_default();
        !line.is_empty()
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("json");
    assert_eq!(v["outcome"], "cancelled");
    assert_eq!(v["decode_worker"], "d1");
    assert_eq!(v["completion_tokens"], 1);
}

#[tokio::test]
async fn stop_strings_end_the_output_and_cancel_the_rest() {
    let fake = FakeWorker::start(
        "d1",
        Role::Decode,
        Behavior::TextThenHang("abcSTOPdef".into()),
    )
    .await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let mut p = params("hi", 30);
    p.sampling.stop = vec!["STOP".into()];
    let (text, fin) = collect(d.generate(p).await.expect("generate"))
        .await
        .expect("ok");
    assert_eq!(text, "abc");
    assert_eq!(fin.reason, FinishReason::Stop);
    eventually("worker saw the cancel", || {
        fake.state.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
}

#[tokio::test]
async fn a_mid_stream_failure_ends_the_stream_with_an_error() {
    let fake =
        FakeWorker::start("d1", Role::Decode, Behavior::FailAfterFirst(Code::Internal)).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let mut s = d.generate(params("hi", 10)).await.expect("generate");
    assert!(s.next().await.expect("first").is_ok());
    let e = s.next().await.expect("error").expect_err("must fail");
    assert_eq!(e.kind(), ErrorKind::Internal);
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn the_router_refuses_past_its_inflight_limit() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(d.generate(params("hi", 10)).await.expect("generate"));
    }
    assert!(matches!(
        d.generate(params("hi", 10)).await,
        Err(DispatchError::RouterBusy(16))
    ));
    held.pop();
    let s = d
        .generate(params("hi", 10))
        .await
        .expect("a slot is free again");
    drop(s);
}

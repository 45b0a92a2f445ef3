//! Dispatcher tests against in-process fake workers.

use std::sync::atomic::Ordering;

use dolphin_cluster::{Role, block_hashes};
use dolphin_proto::v1::{self, FinishReason};
use tonic::Code;

use super::*;
use crate::error::ErrorKind;
use crate::policy::ThresholdConfig;
use crate::stream::Finish;
use crate::testutil::{
    Behavior, FakeWorker, dispatcher, dispatcher_with, eventually, first_log_record, params,
    positional_token, wait_indexed,
};
use crate::tokenizer::SimTokenizer;

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
    assert_eq!(s.route().decided_by.label(), "threshold");
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
        (s.route().decision, s.route().decided_by.label()),
        (Decision::Local, "forced")
    );
}

#[tokio::test]
async fn the_path_the_decode_worker_took_reaches_routing_info_and_the_log() {
    let dw = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let pw = FakeWorker::start("p1", Role::Prefill, Behavior::Text("x".into())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("requests.jsonl");
    let d = dispatcher(
        Policy::AlwaysRemote,
        RequestLog::open(&log).await.expect("log"),
    );
    d.registry().add(dw.record()).expect("add");
    d.registry().add(pw.record()).expect("add");
    // The decode worker held the prompt and prefilled it itself.
    *dw.state.remote_path.lock() = v1::PrefillPath::LocalHeld;
    let s = d
        .generate(params("some prompt", 2))
        .await
        .expect("generate");
    assert_eq!(s.route().decision, Decision::Remote);
    let (_, fin) = collect(s).await.expect("ok");
    assert_eq!(fin.routing.mode, v1::PrefillMode::Remote as i32);
    assert_eq!(fin.routing.path, v1::PrefillPath::LocalHeld as i32);
    assert!(!fin.fell_back);
    let v = first_log_record(&log).await;
    assert_eq!(
        (v["decision"].as_str(), v["path"].as_str()),
        (Some("remote"), Some("local_held"))
    );

    // A fallback is reported both ways.
    *dw.state.remote_path.lock() = v1::PrefillPath::LocalFallback;
    let (_, fin) = collect(
        d.generate(params("other prompt", 2))
            .await
            .expect("generate"),
    )
    .await
    .expect("ok");
    assert_eq!(fin.routing.path, v1::PrefillPath::LocalFallback as i32);
    assert!(fin.fell_back && fin.routing.fell_back);
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
    // The logit rules (every API: gRPC clients reach the dispatcher directly).
    let mut p = params("hi", 2);
    p.sampling.logits = Some(Box::new(v1::LogitRules {
        frequency_penalty: 3.0,
        ..Default::default()
    }));
    assert_eq!(kind(d.generate(p).await), ErrorKind::InvalidRequest);
    let mut p = params("hi", 2);
    p.sampling.logits = Some(Box::new(v1::LogitRules {
        logit_bias: [(400, 1.0)].into_iter().collect(),
        ..Default::default()
    }));
    assert_eq!(kind(d.generate(p).await), ErrorKind::InvalidRequest);
    let mut p = params("hi", 2);
    p.sampling.logprobs = Some(21);
    assert_eq!(kind(d.generate(p).await), ErrorKind::InvalidRequest);
    // The prompt's log probabilities are computed on the decode worker alone.
    let mut p = params("hi", 2);
    p.sampling.prompt_logprobs = Some(1);
    p.force = Some(Decision::Remote);
    assert_eq!(kind(d.generate(p).await), ErrorKind::InvalidRequest);
    // A format that does not compile, one with ignore_eos, and the field only migration sets.
    let structured = |f: dolphin_grammar::Format| Some(Box::new(f.to_wire()));
    for (format, ignore_eos, output_in_prompt) in [
        (dolphin_grammar::Format::Regex("(open".into()), false, 0),
        (dolphin_grammar::Format::Regex("a".into()), true, 0),
        (dolphin_grammar::Format::Regex("a".into()), false, 1),
    ] {
        let mut p = params("hi", 2);
        p.sampling.structured = structured(format);
        p.sampling.ignore_eos = ignore_eos;
        p.sampling.output_in_prompt = output_in_prompt;
        assert_eq!(kind(d.generate(p).await), ErrorKind::InvalidRequest);
    }
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
    let v = first_log_record(&path).await;
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

/// The text a positional fake writes for `n` tokens after a prompt of `prompt_len` tokens.
fn positional_text(prompt_len: usize, n: usize) -> String {
    let ids: Vec<u32> = (prompt_len..prompt_len + n).map(positional_token).collect();
    SimTokenizer.decode(&ids)
}

#[tokio::test]
async fn a_request_moves_to_another_worker_when_its_worker_fails_mid_stream() {
    let dying = Behavior::Positional {
        fail_after: Some(3),
    };
    let d1 = FakeWorker::start("d1", Role::Decode, dying).await;
    let d2 = FakeWorker::start(
        "d2",
        Role::Decode,
        Behavior::Positional { fail_after: None },
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("requests.jsonl");
    let d = dispatcher(threshold(), RequestLog::open(&path).await.expect("log"));
    // d1 alone at the start, so it takes the request; d2 joins before d1 fails.
    d.registry().add(d1.record()).expect("add");
    let mut p = params("hello", 10);
    p.request_id = "client-chosen".into();
    let mut s = d.generate(p).await.expect("generate");
    d.registry().add(d2.record()).expect("add");
    let mut text = String::new();
    let mut finish = None;
    while let Some(delta) = s.next().await {
        let delta = delta.expect("no error reaches the client");
        text.push_str(&delta.text);
        finish = delta.finish.or(finish);
    }
    let finish = finish.expect("finished");
    // The text equals an uninterrupted run: no gap, no repeat.
    assert_eq!(text, positional_text(5, 10));
    assert_eq!(finish.reason, FinishReason::Length);
    assert_eq!(finish.usage.prompt_tokens, 5);
    assert_eq!(finish.usage.completion_tokens, 10);
    assert_eq!(
        (s.migrations(), s.route().decode.worker.id.as_str()),
        (1, "d2")
    );
    // d2 got the prompt plus the three streamed tokens, and what remains of max_tokens.
    let first = d1.state.calls.lock()[0].clone();
    let moved = d2.state.calls.lock()[0].clone();
    assert_eq!(moved.token_ids.len(), 8);
    assert_eq!(moved.token_ids[..5], first.token_ids[..]);
    assert_eq!(moved.sampling.as_ref().map(|s| s.max_tokens), Some(7));
    // ... which the new worker reads as output (penalties, min_tokens, a format).
    assert_eq!(
        moved.sampling.as_ref().map(|s| (
            s.output_in_prompt,
            first.sampling.as_ref().map(|f| f.output_in_prompt)
        )),
        Some((3, Some(0)))
    );
    // The engine keys are the router's: neither is the client's id, and they differ.
    assert_ne!(first.request_id, "client-chosen");
    assert_ne!(moved.request_id, "client-chosen");
    assert_ne!(first.request_id, moved.request_id);
    assert_eq!(s.request_id(), "client-chosen");
    drop(s);
    let v = first_log_record(&path).await;
    assert_eq!(
        (&v["outcome"], &v["migrations"], &v["decode_worker"]),
        (&"ok".into(), &1.into(), &"d2".into())
    );
}

#[tokio::test]
async fn a_request_with_no_worker_left_ends_with_a_clear_error() {
    let dying = Behavior::Positional {
        fail_after: Some(2),
    };
    let d1 = FakeWorker::start("d1", Role::Decode, dying.clone()).await;
    let d2 = FakeWorker::start("d2", Role::Decode, dying).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(d1.record()).expect("add");
    d.registry().add(d2.record()).expect("add");
    let mut s = d.generate(params("hello", 10)).await.expect("generate");
    let mut text = String::new();
    let err = loop {
        match s.next().await.expect("an error ends the stream") {
            Ok(delta) => text.push_str(&delta.text),
            Err(e) => break e,
        }
    };
    // Both workers served two tokens each before failing; the client got all four.
    assert_eq!(text, positional_text(5, 4));
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let msg = err.to_string();
    assert!(
        msg.contains(
            "could not move to another decode worker after 4 tokens and 2 migration attempt(s)"
        ) && msg.contains("no decode workers are available"),
        "{msg}"
    );
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn migrations_stop_at_the_limit() {
    let dying = Behavior::Positional {
        fail_after: Some(1),
    };
    let mut fakes = Vec::new();
    let d = dispatcher(threshold(), RequestLog::disabled());
    for i in 0..5 {
        let f = FakeWorker::start(&format!("d{i}"), Role::Decode, dying.clone()).await;
        d.registry().add(f.record()).expect("add");
        fakes.push(f);
    }
    let s = d.generate(params("hello", 10)).await.expect("generate");
    let err = collect(s).await.expect_err("the limit ends it");
    let msg = err.to_string();
    assert!(
        msg.contains("after 4 tokens and 3 migration attempt(s): the limit of 3 migrations"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_worker_that_dies_after_its_last_token_finishes_the_request() {
    let d1 = FakeWorker::start(
        "d1",
        Role::Decode,
        Behavior::Positional {
            fail_after: Some(10),
        },
    )
    .await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(d1.record()).expect("add");
    // All ten tokens arrive, then the stream fails where the finish should be.
    let s = d.generate(params("hello", 10)).await.expect("generate");
    let (text, fin) = collect(s).await.expect("finished");
    assert_eq!(text, positional_text(5, 10));
    assert_eq!(fin.reason, FinishReason::Length);
}

#[tokio::test]
async fn a_worker_that_was_unreachable_is_passed_over() {
    let d1 = FakeWorker::start("d1", Role::Decode, Behavior::Fail(Code::Unavailable)).await;
    let d2 = FakeWorker::start("d2", Role::Decode, Behavior::Text("ok".into())).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(d1.record()).expect("add");
    d.registry().add(d2.record()).expect("add");
    // Event streams up first: connecting clears the mark.
    wait_indexed(&d, "d1", 0).await;
    wait_indexed(&d, "d2", 0).await;
    for _ in 0..10 {
        let s = d.generate(params("hello", 2)).await.expect("generate");
        assert_eq!(s.route().decode.worker.id.as_str(), "d2");
        collect(s).await.expect("finished");
    }
    // At most the first request tried d1; from then on routing skipped it.
    assert!(d1.state.calls.lock().len() <= 1);
    let listed = d.registry().list();
    assert!(listed.iter().any(|w| w.worker_id == "d1"), "still listed");
}

/// The SimTokenizer, noting the thread of every `encode`, of a model whose tokenizer puts
/// `bos` before prompts.
#[derive(Debug, Default)]
struct ThreadNoting {
    threads: parking_lot::Mutex<Vec<std::thread::ThreadId>>,
    bos: Option<u32>,
}

impl crate::tokenizer::Tokenizer for ThreadNoting {
    fn encode(&self, text: &str) -> Result<Vec<u32>, crate::tokenizer::EncodeError> {
        self.threads.lock().push(std::thread::current().id());
        Ok(SimTokenizer.encode(text))
    }
    fn bos_to_add(&self) -> Option<u32> {
        self.bos
    }
    fn decode(&self, ids: &[u32]) -> String {
        SimTokenizer.decode(ids)
    }
    fn render_chat(
        &self,
        messages: &[crate::tokenizer::ChatMessage],
        extras: &crate::tokenizer::ChatExtras,
    ) -> Result<String, crate::tokenizer::ChatTemplateError> {
        SimTokenizer.render_chat(messages, extras)
    }
    fn vocab_size(&self) -> u32 {
        SimTokenizer.vocab_size()
    }
    fn eos(&self) -> Option<u32> {
        SimTokenizer.eos()
    }
}

#[tokio::test]
async fn long_prompts_are_tokenized_off_the_runtime_thread() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let noting = Arc::new(ThreadNoting::default());
    let d = dispatcher_with(noting.clone(), threshold(), RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    // This test's runtime has one thread: the test's own.
    let here = std::thread::current().id();
    collect(d.generate(params("short", 1)).await.expect("generate"))
        .await
        .expect("ok");
    let long = "y".repeat(INLINE_TOKENIZE_BYTES + 1);
    // Longer than the test router's prompt limit: refused, but only after tokenizing.
    let err = d.generate(params(&long, 1)).await.expect_err("too long");
    assert!(matches!(err, DispatchError::PromptTooLong { .. }), "{err}");
    let threads = noting.threads.lock().clone();
    assert_eq!(threads.len(), 2);
    assert_eq!(threads[0], here, "a short prompt is tokenized inline");
    assert_ne!(
        threads[1], here,
        "a long prompt is tokenized on the blocking pool"
    );
}

#[tokio::test]
async fn a_request_past_its_deadline_ends_and_is_cancelled_on_the_worker() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let mut p = params("hi", 10);
    p.timeout = Some(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    let mut s = d.generate(p).await.expect("generate");
    assert!(s.next().await.expect("first").is_ok());
    let err = s.next().await.expect("the deadline").expect_err("ends");
    assert!(matches!(err, DispatchError::DeadlineExceeded), "{err}");
    assert_eq!(tonic::Status::from(err).code(), Code::DeadlineExceeded);
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    assert!(s.next().await.is_none());
    drop(s);
    eventually("worker saw the cancel", || {
        fake.state.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    // The worker was told how long it had: what remained of the 300 ms, and the slack that
    // lets the router's own timer fire first.
    let sent = fake.state.timeouts.lock()[0]
        .clone()
        .expect("grpc-timeout sent");
    let left = dolphin_proto::deadline::parse(&sent).expect("valid");
    assert!(
        left <= std::time::Duration::from_millis(300) + WORKER_DEADLINE_SLACK
            && left > WORKER_DEADLINE_SLACK,
        "{sent}"
    );
}

#[test]
fn workers_get_the_time_left_and_the_slack() {
    let left = std::time::Duration::from_millis(120);
    assert_eq!(worker_timeout(left), left + WORKER_DEADLINE_SLACK);
    assert_eq!(
        worker_timeout(std::time::Duration::ZERO),
        WORKER_DEADLINE_SLACK
    );
}

/// Dynamo's `prefill_load` rule and the decode-busy guard read the workers' load reports: a
/// prefill worker with more than a step of prefill queued makes requests local, and a decode
/// worker whose KV pool is nearly full forbids that again.
#[tokio::test]
async fn load_aware_rules_follow_the_load_reports() {
    let dw = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let pw = FakeWorker::start("p1", Role::Prefill, Behavior::Text("x".into())).await;
    let policy = Policy::Threshold(ThresholdConfig {
        variant: crate::policy::ThresholdVariant::PrefillLoad,
        decode_busy_threshold: Some(0.9),
        ..ThresholdConfig::default()
    });
    let d = dispatcher(policy, RequestLog::disabled());
    d.registry().add(dw.record()).expect("add");
    d.registry().add(pw.record()).expect("add");
    let mode = |d: &Dispatcher| {
        let r = d
            .route(&SimTokenizer.encode("a prompt"), 4, None, &[])
            .expect("routes");
        r.decision
    };
    // Nothing reported yet: the step size is unknown, so never busy.
    assert_eq!(mode(&d), Decision::Remote);
    // Reports are broadcast to subscribers: sent again until the router's stream has one.
    eventually("prefill backlog applied", || {
        pw.load(v1::LoadReport {
            queued_prefill_tokens: 5000,
            max_batched_tokens: 2048,
            ..Default::default()
        });
        mode(&d) == Decision::Local
    })
    .await;
    // The decode worker fills its pool: local is forbidden.
    eventually("decode guard applied", || {
        dw.load(v1::LoadReport {
            free_blocks: 5,
            total_blocks: 100,
            ..Default::default()
        });
        mode(&d) == Decision::Remote
    })
    .await;
}

#[tokio::test]
async fn requests_past_the_workers_context_are_refused_or_given_less_room() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("abc".into())).await;
    let d = dispatcher(threshold(), RequestLog::disabled());
    assert_eq!(d.context_length(), 1000, "no worker yet: the prompt limit");
    let mut rec = fake.record();
    rec.context_length = 12;
    d.registry().add(rec).expect("add");
    assert_eq!(d.context_length(), 12);
    let ask = |prompt: usize, max_tokens: u32, is_default: bool| {
        let mut p = params("", max_tokens);
        p.prompt = Prompt::Tokens(vec![5; prompt]);
        p.max_tokens_is_default = is_default;
        p
    };
    // Exactly full: served.
    let (text, _) = collect(d.generate(ask(10, 2, false)).await.expect("fits"))
        .await
        .expect("ok");
    assert_eq!(text.len(), 2);
    // One over, asked for by the client: refused before any worker is called.
    let err = d.generate(ask(10, 3, false)).await.expect_err("too long");
    assert!(
        matches!(
            err,
            DispatchError::ContextExceeded {
                prompt: 10,
                max_tokens: 3,
                context: 12
            }
        ),
        "{err}"
    );
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert_eq!(err.openai_code(), Some("context_length_exceeded"));
    assert!(err.to_string().contains("asks for 13"), "{err}");
    // The server's default shrinks to the room left.
    let (text, _) = collect(d.generate(ask(10, 5, true)).await.expect("shortened"))
        .await
        .expect("ok");
    assert_eq!(text.len(), 2);
    // No room at all, even for the default: refused.
    let err = d.generate(ask(12, 5, true)).await.expect_err("full");
    assert!(
        matches!(err, DispatchError::ContextExceeded { .. }),
        "{err}"
    );
    let sent: Vec<u32> = fake
        .state
        .calls
        .lock()
        .iter()
        .map(|c| c.sampling.as_ref().map_or(0, |s| s.max_tokens))
        .collect();
    assert_eq!(sent, [2, 2], "refused requests never reach the worker");
}

#[test]
fn token_ids_become_the_tokens_without_a_copy() {
    let d = dispatcher(threshold(), RequestLog::disabled());
    let ids = vec![5_u32; 64];
    let at = ids.as_ptr();
    let tokens = d
        .tokenize(Prompt::Tokens(ids), None, None)
        .expect("valid ids");
    assert_eq!(tokens.len(), 64);
    assert_eq!(tokens.as_ptr(), at, "the request's ids are the tokens");
}

#[test]
fn text_prompts_start_with_the_models_bos_token_as_vllm_adds_it() {
    let bos_first = ThreadNoting {
        bos: Some(1),
        ..Default::default()
    };
    let d =
        crate::testutil::dispatcher_with(Arc::new(bos_first), threshold(), RequestLog::disabled());
    let text = || Prompt::Text("hi".into());
    let chat = || Prompt::Chat {
        messages: vec![crate::tokenizer::ChatMessage::new("user", "hi")],
        extras: Default::default(),
    };
    let hi = SimTokenizer.encode("hi");
    let first = |p, add| d.tokenize(p, None, add).expect("tokenizes")[0];
    // Text: by default, as completions; a conversation: only when asked (its template writes
    // its own); token ids never.
    assert_eq!(first(text(), None), 1);
    assert_eq!(d.tokenize(text(), None, Some(false)).unwrap(), hi);
    assert_ne!(first(chat(), None), 1);
    assert_eq!(first(chat(), Some(true)), 1);
    assert_eq!(first(Prompt::Tokens(hi.clone()), Some(true)), hi[0]);
    // Not twice: a prompt that starts with it already keeps one.
    let once = d.tokenize(Prompt::Tokens(vec![1, 5]), None, None).unwrap();
    assert_eq!(once, [1, 5]);
    // A model whose tokenizer adds none: nothing is added.
    let plain = dispatcher(threshold(), RequestLog::disabled());
    assert_eq!(plain.tokenize(text(), None, Some(true)).unwrap(), hi);
}

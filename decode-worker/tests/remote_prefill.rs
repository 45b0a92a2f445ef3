//! In-process cluster: sim-engine decode and prefill workers served on 127.0.0.1:0 through the
//! libraries, driven over real gRPC and a real KV transfer connection.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context, Result, bail};
use dolphin_cluster::WorkerId;
use dolphin_decode_worker::DecodeOptions;
use dolphin_engine::{Engine, SimConfig, SimProfile, sim_engine};
use dolphin_kv_transfer::TransferConfig;
use dolphin_prefill_worker::PrefillOptions;
use dolphin_proto::tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use dolphin_proto::v1::{
    self, decode_worker_client::DecodeWorkerClient, worker_client::WorkerClient,
};
use dolphin_worker_common::RunningWorker;

const BLOCK_SIZE: u32 = 16;

/// A sim engine with the shipped Dynamo mocker timings scaled by `time_scale` (0: no delay).
fn engine(time_scale: f64) -> Arc<dyn Engine> {
    let profile = SimProfile::load("dynamo-mocker").expect("shipped profile");
    let mut cfg = SimConfig::new(profile);
    cfg.time_scale = time_scale;
    cfg.block_size = BLOCK_SIZE;
    cfg.total_blocks = 1024;
    sim_engine(cfg).expect("sim engine starts")
}

async fn decode_worker(time_scale: f64) -> Result<RunningWorker> {
    let worker = dolphin_decode_worker::start(
        engine(time_scale),
        DecodeOptions {
            worker_id: WorkerId("decode-test".into()),
            model: "sim-model".into(),
            grpc_addr: "127.0.0.1:0".parse()?,
            advertise: None,
            kv_addr: "127.0.0.1:0".parse()?,
            kv_advertise: None,
            prefill_timeout: Duration::from_secs(60),
            transfer: TransferConfig::default(),
            nccl_device: None,
            tls: None,
        },
    )
    .await?;
    Ok(worker)
}

async fn prefill_worker(time_scale: f64) -> Result<RunningWorker> {
    let worker = dolphin_prefill_worker::start(
        engine(time_scale),
        PrefillOptions::new(
            WorkerId("prefill-test".into()),
            "sim-model",
            "127.0.0.1:0".parse()?,
        ),
    )
    .await?;
    Ok(worker)
}

/// The health service's answer for `service` on the worker at `addr`.
async fn health(addr: SocketAddr, service: &str) -> Result<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    let answer = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await?
        .into_inner();
    Ok(answer.status())
}

/// A prompt of `len` tokens in the sim tokenizer's printable range, varied by `salt`.
fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 3 + (i * 7 + salt * 13) % 90)
        .collect()
}

fn request(id: &str, tokens: Vec<u32>, remote: Option<v1::RemotePrefill>) -> v1::DecodeRequest {
    v1::DecodeRequest {
        request_id: id.into(),
        token_ids: tokens,
        sampling: Some(v1::SamplingParams {
            max_tokens: 24,
            ignore_eos: true,
            ..Default::default()
        }),
        remote,
    }
}

fn remote(addr: SocketAddr, timeout_ms: u32) -> Option<v1::RemotePrefill> {
    Some(v1::RemotePrefill {
        prefill_addr: addr.to_string(),
        prefill_worker_id: "prefill-test".into(),
        timeout_ms,
    })
}

/// What a finished Decode stream said.
#[derive(Debug)]
struct Decoded {
    tokens: Vec<u32>,
    fell_back: bool,
    /// The prefill path every message reported.
    path: v1::PrefillPath,
    last: v1::DecodeResponse,
}

async fn decode(addr: SocketAddr, req: v1::DecodeRequest) -> Result<Decoded> {
    let mut client = DecodeWorkerClient::connect(format!("http://{addr}")).await?;
    let mut stream = client.decode(req).await?.into_inner();
    let mut tokens = Vec::new();
    let mut fell_back = None;
    let mut path = None;
    while let Some(message) = stream.message().await? {
        if *fell_back.get_or_insert(message.fell_back) != message.fell_back {
            bail!("fell_back changed within one stream");
        }
        if *path.get_or_insert(message.path) != message.path {
            bail!("path changed within one stream");
        }
        tokens.extend_from_slice(&message.token_ids);
        if message.finish_reason != v1::FinishReason::Unspecified as i32 {
            if stream.message().await?.is_some() {
                bail!("a message after the one with the finish reason");
            }
            return Ok(Decoded {
                tokens,
                fell_back: message.fell_back,
                path: message.path(),
                last: message,
            });
        }
    }
    bail!("stream ended without a finish reason")
}

fn assert_complete(d: &Decoded) {
    assert_eq!(d.tokens.len(), 24, "{d:?}");
    assert_eq!(d.last.finish_reason, v1::FinishReason::Length as i32);
    let usage = d.last.usage.clone().expect("usage on the last message");
    assert_eq!(usage.completion_tokens, 24);
    let timings = d.last.timings.expect("timings on the last message");
    assert!(timings.ttft_us <= timings.e2e_us, "{timings:?}");
}

#[tokio::test]
async fn local_and_remote_prefill_give_identical_tokens() -> Result<()> {
    let local_d = decode_worker(0.0).await?;
    let remote_d = decode_worker(0.0).await?;
    let p = prefill_worker(0.0).await?;

    // 70 tokens: four full blocks and a partial one.
    let first = prompt(70, 1);
    let local = decode(local_d.grpc_addr(), request("l1", first.clone(), None)).await?;
    let remote_run = decode(
        remote_d.grpc_addr(),
        request("r1", first, remote(p.grpc_addr(), 0)),
    )
    .await?;
    assert_complete(&local);
    assert_complete(&remote_run);
    assert!(!local.fell_back && !remote_run.fell_back, "{remote_run:?}");
    assert_eq!(local.path, v1::PrefillPath::Local);
    assert_eq!(remote_run.path, v1::PrefillPath::Remote);
    assert_eq!(local.tokens, remote_run.tokens);
    assert_eq!(
        remote_run
            .last
            .usage
            .as_ref()
            .context("usage")?
            .prompt_tokens,
        70
    );
    // Every prompt token's KV crossed the wire; none for the local request.
    let per_token = SimConfig::new(SimProfile::load("dynamo-mocker")?).wire_bytes_per_token();
    let kv_bytes = |d: &Decoded| d.last.timings.map(|t| t.kv_bytes);
    assert_eq!(kv_bytes(&remote_run), Some(70 * per_token));
    assert_eq!(kv_bytes(&local), Some(0));

    // A longer prompt sharing the first one's prefix: the decode worker now holds its leading
    // blocks, so the prefill worker is asked to skip them and sends only the rest.
    let mut longer = prompt(70, 1);
    longer.extend(prompt(41, 2));
    let local = decode(local_d.grpc_addr(), request("l2", longer.clone(), None)).await?;
    let remote_run = decode(
        remote_d.grpc_addr(),
        request("r2", longer, remote(p.grpc_addr(), 0)),
    )
    .await?;
    assert!(!remote_run.fell_back, "{remote_run:?}");
    assert_eq!(local.tokens, remote_run.tokens);
    let cached = remote_run
        .last
        .usage
        .as_ref()
        .context("usage")?
        .cached_tokens;
    assert!(
        cached >= 4 * BLOCK_SIZE,
        "leading blocks came from a cache: {cached}"
    );
    // Only the blocks after the four held here were moved: 111 - 64 tokens.
    assert_eq!(kv_bytes(&remote_run), Some(47 * per_token));

    for w in [local_d, remote_d, p] {
        w.drain(Duration::from_secs(5)).await;
        w.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn unreachable_prefill_worker_falls_back_to_local() -> Result<()> {
    let d = decode_worker(0.0).await?;
    let reference = decode_worker(0.0).await?;
    // A port nothing listens on any more: connections are refused.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?
    };
    let tokens = prompt(50, 3);
    let expected = decode(reference.grpc_addr(), request("ref", tokens.clone(), None)).await?;
    let got = decode(d.grpc_addr(), request("fb", tokens, remote(closed, 5_000))).await?;
    assert_complete(&got);
    assert!(got.fell_back, "{got:?}");
    assert_eq!(got.path, v1::PrefillPath::LocalFallback);
    assert_eq!(got.tokens, expected.tokens);
    for w in [d, reference] {
        w.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_prompt_held_here_is_prefilled_here_without_a_prefill_worker() -> Result<()> {
    let d = decode_worker(0.0).await?;
    let p = prefill_worker(0.0).await?;
    // 70 tokens: four full blocks and a partial one. The first request leaves the blocks here.
    let tokens = prompt(70, 7);
    let first = decode(
        d.grpc_addr(),
        request("h1", tokens.clone(), remote(p.grpc_addr(), 0)),
    )
    .await?;
    assert_eq!(first.path, v1::PrefillPath::Remote);
    // Asked again with a prefill worker nobody listens on: the four full blocks are held here
    // and only the last one is left, so the worker prefills it itself and never calls out (a
    // call would have failed and fallen back).
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?
    };
    let again = decode(d.grpc_addr(), request("h2", tokens, remote(closed, 5_000))).await?;
    assert_complete(&again);
    assert_eq!(again.path, v1::PrefillPath::LocalHeld, "{again:?}");
    assert!(!again.fell_back);
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(again.last.timings.map(|t| t.kv_bytes), Some(0));
    assert_eq!(
        again.last.usage.as_ref().context("usage")?.cached_tokens,
        4 * BLOCK_SIZE
    );
    for w in [d, p] {
        w.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn slow_prefill_worker_times_out_and_falls_back() -> Result<()> {
    let d = decode_worker(0.0).await?;
    let reference = decode_worker(0.0).await?;
    // Step times scaled up 10,000x: one prefill step takes minutes, far beyond the timeout.
    let slow = prefill_worker(10_000.0).await?;
    let tokens = prompt(60, 4);
    let expected = decode(reference.grpc_addr(), request("ref", tokens.clone(), None)).await?;
    let got = decode(
        d.grpc_addr(),
        request("slow", tokens, remote(slow.grpc_addr(), 300)),
    )
    .await?;
    assert_complete(&got);
    assert!(got.fell_back, "{got:?}");
    assert_eq!(got.tokens, expected.tokens);
    // The abandoned call was cancelled on the prefill worker: it drains at once.
    assert!(
        slow.drain(Duration::from_secs(30)).await,
        "prefill worker still busy"
    );
    for w in [d, reference, slow] {
        w.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn drain_refuses_new_requests_and_reports_it() -> Result<()> {
    let d = decode_worker(0.0).await?;
    let addr = d.grpc_addr();
    let mut admin = WorkerClient::connect(format!("http://{addr}")).await?;
    let info = admin.info(v1::InfoRequest {}).await?.into_inner();
    assert_eq!(info.role, v1::Role::Decode as i32);
    assert_eq!(info.block_size, BLOCK_SIZE);
    assert!(!info.kv_addr.is_empty());
    assert_eq!(info.grpc_addr, addr.to_string());

    assert_eq!(health(addr, "").await?, ServingStatus::Serving);
    assert_eq!(
        health(addr, "dolphin.v1.DecodeWorker").await?,
        ServingStatus::Serving
    );

    let drained = admin.drain(v1::DrainRequest {}).await?.into_inner();
    assert_eq!(
        health(addr, "dolphin.v1.Worker").await?,
        ServingStatus::Serving,
        "Info and Subscribe still serve"
    );
    assert_eq!(health(addr, "").await?, ServingStatus::NotServing);
    assert_eq!(
        health(addr, "dolphin.v1.DecodeWorker").await?,
        ServingStatus::NotServing
    );
    assert_eq!(drained.running, 0);
    let refused = decode(addr, request("late", prompt(20, 5), None))
        .await
        .expect_err("refused while draining");
    let status = refused
        .downcast_ref::<tonic::Status>()
        .context("a gRPC status")?;
    assert_eq!(status.code(), tonic::Code::Unavailable);

    // Load reports say so too.
    let mut events = admin
        .subscribe(v1::SubscribeRequest {
            load_interval_ms: 10,
        })
        .await?
        .into_inner();
    loop {
        let event = events.message().await?.context("stream open")?;
        if let Some(v1::worker_event::Event::Load(load)) = event.event {
            assert!(load.draining);
            break;
        }
    }
    d.stop().await?;
    Ok(())
}

#[tokio::test]
async fn subscribe_starts_with_the_cached_blocks_then_numbers_every_event() -> Result<()> {
    let d = decode_worker(0.0).await?;
    let tokens = prompt(64, 6);
    decode(d.grpc_addr(), request("s1", tokens.clone(), None)).await?;

    let mut admin = WorkerClient::connect(format!("http://{}", d.grpc_addr())).await?;
    let mut events = admin
        .subscribe(v1::SubscribeRequest {
            load_interval_ms: 10,
        })
        .await?
        .into_inner();
    let mut stored = Vec::new();
    let mut expected_seq = 1;
    loop {
        let event = events.message().await?.context("stream open")?;
        assert_eq!(event.seq, expected_seq, "no gaps, starting at 1");
        assert_eq!(event.worker_id, "decode-test");
        expected_seq += 1;
        match event.event.context("event set")? {
            v1::worker_event::Event::Stored(s) => stored.extend(s.block_hashes),
            // The first load report comes after the whole snapshot.
            v1::worker_event::Event::Load(load) => {
                assert!(!load.draining);
                assert_eq!(load.total_blocks, d.state().engine().info().total_blocks);
                break;
            }
            other => bail!("unexpected event before the first load report: {other:?}"),
        }
    }
    let prompt_hashes = dolphin_cluster::block_hashes(&tokens, BLOCK_SIZE as usize);
    assert_eq!(prompt_hashes.len(), 4);
    for hash in &prompt_hashes {
        assert!(
            stored.contains(hash),
            "prompt block {hash:x} missing from the snapshot"
        );
    }
    d.stop().await?;
    Ok(())
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request_in_the_engine() -> Result<()> {
    // Steps 100x slower than the profile: the 1000 tokens would take about ten minutes, so the
    // request can only end within the deadline below by being cancelled.
    let d = decode_worker(100.0).await?;
    let mut client = DecodeWorkerClient::connect(format!("http://{}", d.grpc_addr())).await?;
    let mut req = request("c1", prompt(40, 7), None);
    req.sampling = Some(v1::SamplingParams {
        max_tokens: 1000,
        ignore_eos: true,
        ..Default::default()
    });
    let mut stream = client.decode(req).await?.into_inner();
    let first = stream.message().await?.context("a first message")?;
    assert!(!first.token_ids.is_empty());
    assert!(d.state().engine().load().running >= 1);
    drop(stream);
    drop(client);
    let engine = Arc::clone(d.state().engine());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while engine.load().running > 0 || d.state().admission().inflight() > 0 {
        if tokio::time::Instant::now() > deadline {
            bail!("request still running after the client left");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.stop().await?;
    Ok(())
}

#[tokio::test]
async fn drain_lets_running_requests_finish_and_cancels_them_after_the_grace_period() -> Result<()>
{
    // Real-time steps (24 tokens, a few ms each): the request is still running when the drain
    // starts, and finishes normally within the grace period.
    let fast = decode_worker(1.0).await?;
    let mut client = DecodeWorkerClient::connect(format!("http://{}", fast.grpc_addr())).await?;
    let mut stream = client
        .decode(request("g1", prompt(30, 8), None))
        .await?
        .into_inner();
    stream.message().await?.context("a first message")?;
    assert!(
        fast.drain(Duration::from_secs(60)).await,
        "finished within the grace period"
    );
    let mut last = None;
    while let Some(message) = stream.message().await? {
        last = Some(message);
    }
    let last = last.context("a final message")?;
    assert_eq!(last.finish_reason, v1::FinishReason::Length as i32);
    fast.stop().await?;

    // Steps 100x slower: 1000 tokens cannot finish within a 50 ms grace period, so the drain
    // cancels the request, which still ends with a proper final message.
    let slow = decode_worker(100.0).await?;
    let mut client = DecodeWorkerClient::connect(format!("http://{}", slow.grpc_addr())).await?;
    let mut req = request("g2", prompt(30, 9), None);
    req.sampling = Some(v1::SamplingParams {
        max_tokens: 1000,
        ignore_eos: true,
        ..Default::default()
    });
    let mut stream = client.decode(req).await?.into_inner();
    stream.message().await?.context("a first message")?;
    assert!(
        !slow.drain(Duration::from_millis(50)).await,
        "grace period too short"
    );
    let mut last = None;
    while let Some(message) = stream.message().await? {
        last = Some(message);
    }
    let last = last.context("a final message")?;
    assert_eq!(last.finish_reason, v1::FinishReason::Cancelled as i32);
    assert!(last.usage.as_ref().context("usage")?.completion_tokens < 1000);
    slow.stop().await?;
    Ok(())
}

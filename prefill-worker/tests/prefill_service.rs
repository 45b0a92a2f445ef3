//! The prefill service over gRPC, against a sim engine served on 127.0.0.1:0.

use anyhow::Result;
use dolphin_cluster::WorkerId;
use dolphin_engine::{SimConfig, SimProfile, sim_engine};
use dolphin_prefill_worker::PrefillOptions;
use dolphin_proto::v1::{self, prefill_worker_client::PrefillWorkerClient};
use dolphin_worker_common::RunningWorker;
use tonic::Code;

async fn prefill_worker() -> Result<RunningWorker> {
    let mut cfg = SimConfig::new(SimProfile::load("dynamo-mocker")?);
    cfg.time_scale = 0.0;
    let worker = dolphin_prefill_worker::start(
        sim_engine(cfg)?,
        PrefillOptions::new(
            WorkerId("prefill-test".into()),
            "sim-model",
            "127.0.0.1:0".parse()?,
        ),
    )
    .await?;
    Ok(worker)
}

fn request(target: String, tokens: usize, skip_blocks: u32) -> v1::PrefillRequest {
    v1::PrefillRequest {
        request_id: "p1".into(),
        token_ids: (0..tokens as u32).map(|i| 3 + i % 90).collect(),
        sampling: Some(v1::SamplingParams {
            max_tokens: 4,
            ..Default::default()
        }),
        target_kv_addr: target,
        transfer_id: 1,
        skip_blocks,
        decode_compat: None,
    }
}

async fn call(
    worker: &RunningWorker,
    req: v1::PrefillRequest,
) -> Result<v1::PrefillResponse, tonic::Status> {
    let mut client = PrefillWorkerClient::connect(format!("http://{}", worker.grpc_addr()))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    client.prefill(req).await.map(tonic::Response::into_inner)
}

#[tokio::test]
async fn bad_requests_are_invalid_argument() -> Result<()> {
    let p = prefill_worker().await?;
    let no_target = call(&p, request(String::new(), 40, 0)).await.unwrap_err();
    assert_eq!(no_target.code(), Code::InvalidArgument, "{no_target:?}");
    let empty = call(&p, request("127.0.0.1:1".into(), 0, 0))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");
    // 40 tokens are 3 blocks of 16: skipping 3 leaves nothing to send.
    let skip_all = call(&p, request("127.0.0.1:1".into(), 40, 3))
        .await
        .unwrap_err();
    assert_eq!(skip_all.code(), Code::InvalidArgument, "{skip_all:?}");
    p.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_decode_worker_of_another_build_or_layout_is_refused_before_any_work() -> Result<()> {
    let p = prefill_worker().await?;
    let own = v1::KvCompat::from(p.state().kv_compat());
    assert_eq!(own.version, dolphin_cluster::BUILD_VERSION);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    for (field, change) in [
        (
            "version",
            (|c: &mut v1::KvCompat| c.version = "0.0.0-old".into()) as fn(&mut _),
        ),
        ("kv_layout", |c| c.kv_layout = "candle/f16".into()),
        ("block_size", |c| c.block_size = 32),
    ] {
        let mut compat = own.clone();
        change(&mut compat);
        let mut req = request(closed.to_string(), 40, 0);
        req.decode_compat = Some(compat);
        let status = call(&p, req).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{field}: {status:?}"
        );
    }
    // A matching decode worker gets past the check (and then fails to be reached).
    let mut req = request(closed.to_string(), 40, 0);
    req.decode_compat = Some(own);
    let status = call(&p, req).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    p.stop().await?;
    Ok(())
}

#[tokio::test]
async fn unreachable_decode_worker_is_unavailable() -> Result<()> {
    let p = prefill_worker().await?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let status = call(&p, request(closed.to_string(), 40, 0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains(&closed.to_string()), "{status:?}");
    p.stop().await?;
    Ok(())
}

#[tokio::test]
async fn draining_worker_refuses_with_unavailable() -> Result<()> {
    let p = prefill_worker().await?;
    p.state().begin_drain().await;
    let status = call(&p, request("127.0.0.1:1".into(), 40, 0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    p.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_tcp_worker_refuses_to_open_a_nccl_link() -> Result<()> {
    let p = prefill_worker().await?;
    let mut client = PrefillWorkerClient::connect(format!("http://{}", p.grpc_addr())).await?;
    let status = client
        .open_kv_link(v1::OpenKvLinkRequest {
            target_kv_addr: "127.0.0.1:1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("--kv-transport nccl"),
        "{status:?}"
    );
    let status = client
        .open_kv_link(v1::OpenKvLinkRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    p.stop().await?;
    Ok(())
}

/// NCCL asked for where it cannot run (a build without the feature, or no CUDA here): the
/// worker does not start, and says why.
#[tokio::test]
async fn nccl_where_it_cannot_run_is_refused_at_start() -> Result<()> {
    let mut cfg = SimConfig::new(SimProfile::load("dynamo-mocker")?);
    cfg.time_scale = 0.0;
    let started = dolphin_prefill_worker::start(
        sim_engine(cfg)?,
        PrefillOptions {
            nccl_device: Some(0),
            ..PrefillOptions::new(
                WorkerId("prefill-nccl".into()),
                "sim-model",
                "127.0.0.1:0".parse()?,
            )
        },
    )
    .await;
    match started {
        Err(e) => assert!(e.to_string().contains("nccl"), "{e}"),
        // A machine with CUDA and NCCL: starting is right.
        Ok(worker) => {
            worker.stop().await?;
            anyhow::ensure!(
                cfg!(feature = "nccl"),
                "a build without NCCL started a NCCL worker"
            );
        }
    }
    Ok(())
}

//! The drivers end to end in-process: the live one against a fake router (a tonic server that
//! streams one token per message), the simulator one on a small cluster.

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use dolphin_proto::v1::inference_server::{Inference, InferenceServer};
use dolphin_proto::v1::{
    FinishReason, GenerateRequest, GenerateResponse, ListModelsRequest, ListModelsResponse,
    ModelCard, PrefillMode, RoutingFeatures, RoutingInfo,
};
use dolphin_router::dolphin::Split;
use dolphin_workload::{Arrivals, RequestKind, Slo, Summary, Workload, WorkloadRequest, synthetic};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::codegen::tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::*;
use crate::cli::Policy;

const VOCAB: u32 = 99;

/// A router that checks the prompt and streams `max_tokens` tokens, 1 ms apart; prompts whose
/// length is a multiple of `fail_every` are refused (0: none).
#[derive(Debug, Clone, Copy)]
struct FakeRouter {
    fail_every: usize,
}

type GenStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Inference for FakeRouter {
    type GenerateStream = GenStream;

    async fn generate(&self, req: Request<GenerateRequest>) -> Result<Response<GenStream>, Status> {
        let req = req.into_inner();
        let Some(dolphin_proto::v1::generate_request::Input::TokenIds(ids)) = req.input else {
            return Err(Status::invalid_argument("token ids expected"));
        };
        let isl = ids.ids.len();
        if ids.ids.iter().any(|&t| t >= VOCAB) {
            return Err(Status::invalid_argument("token outside the vocabulary"));
        }
        if self.fail_every > 0 && isl.is_multiple_of(self.fail_every) {
            return Err(Status::unavailable("no decode workers"));
        }
        let n = req.sampling.map_or(1, |s| s.max_tokens);
        let routing = RoutingInfo {
            mode: if isl.is_multiple_of(2) {
                PrefillMode::Remote
            } else {
                PrefillMode::Local
            } as i32,
            cluster: (isl % 3) as i32,
            features: Some(RoutingFeatures {
                isl: isl as u32,
                eff_isl_prefill: isl as u32,
                eff_isl_decode: isl as u32 / 2,
                output_len_hint: 64,
            }),
            ..RoutingInfo::default()
        };
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            for i in 0..n {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let last = i + 1 == n;
                let msg = GenerateResponse {
                    token_ids: vec![5],
                    routing: (i == 0 || last).then(|| routing.clone()),
                    finish_reason: if last { FinishReason::Length as i32 } else { 0 },
                    ..GenerateResponse::default()
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_models(
        &self,
        _: Request<ListModelsRequest>,
    ) -> Result<Response<ListModelsResponse>, Status> {
        Ok(Response::new(ListModelsResponse {
            models: vec![ModelCard {
                id: "fake".into(),
                context_length: 4096,
                vocab_size: VOCAB,
            }],
        }))
    }
}

async fn serve(router: FakeRouter) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(InferenceServer::new(router))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

fn live(addr: SocketAddr) -> LiveConfig {
    LiveConfig {
        router_grpc: addr.to_string(),
        model: None,
        vocab_size: None,
        max_in_flight: 8,
        progress: false,
        cap_max_tokens: false,
    }
}

fn small(n: usize) -> Workload {
    Workload {
        skipped_rows: 0,
        name: "small".into(),
        tokens_per_id: 16,
        requests: (0..n)
            .map(|i| WorkloadRequest {
                arrival_ms: 2.0 * i as f64,
                hash_ids: vec![i as u64 % 3, i as u64],
                prompt_len: 20 + i as u32,
                output_len: 1 + (i % 4) as u32,
                kind: RequestKind::Humaneval,
            })
            .collect(),
    }
}

#[tokio::test]
async fn live_replay_times_every_request_in_both_loops() {
    let addr = serve(FakeRouter { fail_every: 0 }).await;
    let w = small(24);
    let slo = Slo::new(5000.0, 250.0);
    for arrivals in ["closed:3", "trace", "poisson:2000:1"] {
        let arrivals = Arrivals::parse(arrivals).unwrap();
        let run = replay_live(&live(addr), &w, arrivals, slo).await.unwrap();
        assert_eq!(run.outcomes.len(), 24, "{arrivals}");
        assert!(run.failures.is_empty());
        for (i, o) in run.outcomes.iter().enumerate() {
            assert_eq!(o.index as usize, i);
            assert!(o.ok && o.met, "{o:?}");
            assert_eq!(o.output_tokens, w.requests[i].output_len);
            assert_eq!(o.features[0], w.requests[i].prompt_len);
            assert_eq!(o.remote, w.requests[i].prompt_len.is_multiple_of(2));
            assert!(o.ttft_ms > 0.0 && o.e2e_ms >= o.ttft_ms);
        }
        let s = Summary::of(&run.outcomes);
        assert_eq!((s.requests, s.completed), (24, 24));
    }
    // The trace's arrivals span 46 ms: the last request is not sent before its time.
    let run = replay_live(&live(addr), &w, Arrivals::Trace { time_scale: 1.0 }, slo)
        .await
        .unwrap();
    assert!(run.outcomes[23].sent_ms >= 46.0, "{:?}", run.outcomes[23]);
}

#[tokio::test]
async fn failures_are_counted_and_an_all_failing_start_stops_the_replay() {
    // Prompts of length 21, 24, ... fail: 8 of the 24.
    let addr = serve(FakeRouter { fail_every: 3 }).await;
    let slo = Slo::new(5000.0, 250.0);
    let closed = Arrivals::ClosedLoop { concurrency: 4 };
    let run = replay_live(&live(addr), &small(24), closed, slo)
        .await
        .unwrap();
    assert_eq!(run.outcomes.len(), 24);
    assert_eq!(run.failures.get("Unavailable"), Some(&8));
    assert_eq!(run.outcomes.iter().filter(|o| !o.ok).count(), 8);
    assert!(run.outcomes.iter().filter(|o| !o.ok).all(|o| !o.met));

    let addr = serve(FakeRouter { fail_every: 1 }).await;
    let err = replay_live(&live(addr), &small(50), closed, slo)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ReplayError::AllFailing { failed: 20, .. }),
        "{msg}"
    );
    assert!(msg.contains("Unavailable x 20"), "{msg}");
    assert!(msg.contains("no decode workers"), "{msg}");
}

#[tokio::test]
async fn a_missing_router_is_a_connection_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = LiveConfig {
        router_grpc: format!("127.0.0.1:{port}"),
        ..live(([127, 0, 0, 1], port).into())
    };
    let err = replay_live(
        &cfg,
        &small(2),
        Arrivals::ClosedLoop { concurrency: 1 },
        Slo::new(1.0, 1.0),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("cannot connect to the router"),
        "{err}"
    );
    assert_eq!(err.exit_code(), 1);
}

/// A two-cluster k-means table for 1p1d: short prompts in cluster 0 (local), long ones in
/// cluster 1 (remote).
const TABLE: &str = r#"{"schema_version": 1, "split": "1p1d", "slo": {"ttft_ms": 5000, "tpot_ms": 250},
 "k": 2, "method": "kmeans",
 "standardizer": {"transform": "log1p", "mean": [7, 7, 7, 5], "std": [1, 1, 1, 1]},
 "model": {"centroids": [[-1.5, -1.5, -1.5, 0], [1.5, 1.5, 1.5, 0]]},
 "bits": [0, 1],
 "provenance": {"workload": "test", "date": "2026-11-29T12:00:00Z", "rounds": 0, "rewards": [0, 0]}}"#;

#[test]
fn sim_replay_reports_every_request_with_its_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.json");
    std::fs::write(&table, TABLE).unwrap();
    let cfg = SimTargetConfig::load(
        Split::new(1, 1),
        "dynamo-mocker",
        Policy::Dolphin,
        dolphin_router::policy::ThresholdConfig::default(),
        (
            dolphin_router::dolphin::TrustConfig::default(),
            dolphin_router::dolphin::OnlineConfig::default(),
        ),
        Some(&table),
        20_000,
    )
    .unwrap();
    let w = synthetic::hybrid(30, 7);
    let slo = Slo::new(5000.0, 250.0);
    let run = replay_sim(&cfg, &w, Arrivals::ClosedLoop { concurrency: 4 }, slo).unwrap();
    assert_eq!(run.outcomes.len(), 30);
    assert!(
        run.outcomes
            .iter()
            .all(|o| o.ok && o.features[0] == o.prompt_tokens)
    );
    let s = Summary::of(&run.outcomes);
    let clusters: Vec<Option<u32>> = s.per_cluster.iter().map(|c| c.cluster).collect();
    assert_eq!(clusters, [Some(0), Some(1)], "{s:?}");
    // Bit 1 sends cluster 1 remote, bit 0 keeps cluster 0 local.
    assert_eq!(s.per_cluster[0].remote, 0);
    assert_eq!(s.per_cluster[1].remote, s.per_cluster[1].requests);

    let open = replay_sim(&cfg, &w, Arrivals::parse("poisson:1").unwrap(), slo).unwrap();
    assert_eq!(open.outcomes.len(), 30);
    assert!(
        open.outcomes
            .windows(2)
            .all(|p| p[0].sent_ms <= p[1].sent_ms)
    );
}

#[tokio::test]
async fn a_smaller_vocabulary_may_be_asked_for_never_a_larger_one() {
    let addr = serve(FakeRouter { fail_every: 0 }).await;
    let closed = Arrivals::ClosedLoop { concurrency: 2 };
    let slo = Slo::new(5000.0, 250.0);
    let cfg = LiveConfig {
        vocab_size: Some(10),
        ..live(addr)
    };
    let run = replay_live(&cfg, &small(3), closed, slo).await.unwrap();
    assert!(run.outcomes.iter().all(|o| o.ok));
    let cfg = LiveConfig {
        vocab_size: Some(VOCAB + 1),
        ..live(addr)
    };
    let err = replay_live(&cfg, &small(3), closed, slo).await.unwrap_err();
    assert!(err.to_string().contains("exceeds the vocabulary"), "{err}");
}

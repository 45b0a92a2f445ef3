//! A stand-in worker that serves only `dolphin.v1.Worker`: its `Subscribe` stream sends a fixed
//! cache snapshot and one load report, then stays open. The routing benchmark uses it so the
//! router's prefix index is filled through the router's own subscriber path, exactly as from
//! live workers, without running engines.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dolphin_cluster::{BlockHash, Role, WorkerId, WorkerRecord};
use dolphin_proto::v1::{self, worker_event::Event, worker_server::Worker};
use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::BenchError;
use crate::routing_workload::{WorkerContents, Workload};
use dolphin_router::dispatch::{DispatchConfig, Dispatcher};
use dolphin_router::policy::Policy;
use dolphin_router::request_log::RequestLog;
use dolphin_router::tokenizer::SimTokenizer;
use dolphin_router::workers::{RegistryConfig, WorkerRegistry};

/// Total KV blocks the fake reports (load reports carry it).
const TOTAL_BLOCKS: u32 = 65_536;

#[derive(Debug)]
struct Svc {
    info: v1::WorkerInfo,
    events: Vec<Event>,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::WorkerEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for Svc {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        _: Request<v1::SubscribeRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let worker_id = self.info.worker_id.clone();
        let events: Vec<Result<v1::WorkerEvent, Status>> = self
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                Ok(v1::WorkerEvent {
                    seq: i as u64 + 1,
                    worker_id: worker_id.clone(),
                    event: Some(e.clone()),
                })
            })
            .collect();
        // Open after the snapshot, like a live worker with nothing new to say.
        let stream = futures::stream::iter(events).chain(futures::stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn info(&self, _: Request<v1::InfoRequest>) -> Result<Response<v1::WorkerInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn drain(
        &self,
        _: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        Ok(Response::new(v1::DrainResponse { running: 0 }))
    }
}

/// A running fake worker; stops serving when dropped.
#[derive(Debug)]
pub struct FakeWorker {
    /// Its record, to add to a router's registry.
    pub record: WorkerRecord,
    _stop: oneshot::Sender<()>,
}

/// Starts a fake worker on 127.0.0.1 holding `contents`.
pub async fn start(
    id: &str,
    role: Role,
    model: &str,
    block_size: u32,
    contents: &WorkerContents,
) -> Result<FakeWorker, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::io("bind a fake worker"))?;
    let addr = listener
        .local_addr()
        .map_err(BenchError::io("fake worker address"))?
        .to_string();
    let mut events: Vec<Event> = contents
        .chains
        .iter()
        .map(|chain: &Vec<BlockHash>| {
            Event::Stored(v1::BlocksStored {
                parent_hash: None,
                block_hashes: chain.clone(),
            })
        })
        .collect();
    events.push(Event::Load(v1::LoadReport {
        running: 1,
        waiting: contents.load.waiting,
        free_blocks: TOTAL_BLOCKS / 2,
        total_blocks: TOTAL_BLOCKS,
        active_tokens: contents.load.active_tokens,
        queued_prefill_tokens: 0,
        max_batched_tokens: 8192,
        draining: false,
    }));
    let info = v1::WorkerInfo {
        worker_id: id.into(),
        role: i32::from(role),
        model: model.into(),
        grpc_addr: addr.clone(),
        block_size,
        total_blocks: TOTAL_BLOCKS,
        engine: "fake".into(),
        ..Default::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = v1::worker_server::WorkerServer::new(Svc { info, events })
        .max_encoding_message_size(usize::MAX);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(dolphin_cluster::nodelay_incoming(listener), async {
                let _ = stopped.await;
            }),
    );
    Ok(FakeWorker {
        record: WorkerRecord {
            id: WorkerId::from(id),
            role,
            grpc_addr: addr,
            kv_addr: None,
            model: model.into(),
            block_size,
            version: dolphin_cluster::BUILD_VERSION.into(),
            kv_layout: String::new(),
            context_length: 0,
        },
        _stop: stop,
    })
}

/// Id of pool member `index` of `role`: `prefill-00`, `decode-15`, ...
pub fn pool_worker_id(role: Role, index: usize) -> WorkerId {
    WorkerId::from(format!("{}-{index:02}", role.as_str()))
}

/// Starts a fake worker for every member of both pools of `workload` (ids from
/// [`pool_worker_id`]), adds them to `registry` (prefill pool first), and waits up to `timeout`
/// until the registry has indexed every block and applied every load report through its own
/// subscriber tasks. Checks that pool slots follow the workload's order. Keep the returned
/// workers alive while the registry is in use.
pub async fn start_pools(
    registry: &Arc<WorkerRegistry>,
    workload: &Workload,
    model: &str,
    block_size: u32,
    timeout: Duration,
) -> Result<Vec<FakeWorker>, BenchError> {
    let pools = [
        (Role::Prefill, &workload.prefill),
        (Role::Decode, &workload.decode),
    ];
    let mut fakes = Vec::new();
    let mut expected = Vec::new();
    for (role, pool) in pools {
        for (i, contents) in pool.iter().enumerate() {
            let id = pool_worker_id(role, i);
            let fake = start(id.as_str(), role, model, block_size, contents).await?;
            registry
                .add(fake.record.clone())
                .map_err(|e| BenchError::Setup(format!("registry refused {id}: {e}")))?;
            expected.push((id, contents.distinct_blocks() as u64));
            fakes.push(fake);
        }
    }
    let deadline = Instant::now() + timeout;
    loop {
        let listed = registry.list();
        let done = expected.iter().all(|(id, blocks)| {
            listed.iter().any(|w| {
                w.worker_id == id.as_str()
                    && w.events_live
                    && w.indexed_blocks == *blocks
                    && w.total_blocks > 0
            })
        });
        if done {
            break;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Setup(format!(
                "the registry did not index every fake worker's snapshot within {timeout:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (role, pool) in pools {
        for i in 0..pool.len() {
            let id = pool_worker_id(role, i);
            let slot = registry
                .get(&id)
                .ok_or_else(|| BenchError::Setup(format!("{id} vanished")))?
                .slot;
            if slot != i {
                return Err(BenchError::Setup(format!(
                    "{id} got slot {slot}, expected {i}"
                )));
            }
        }
    }
    Ok(fakes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing_workload::WorkerLoad;
    use dolphin_proto::v1::worker_client::WorkerClient;

    #[tokio::test]
    async fn subscribe_sends_the_snapshot_then_the_load_and_stays_open() {
        let contents = WorkerContents {
            chains: vec![vec![1, 2, 3], vec![9]],
            load: WorkerLoad {
                active_tokens: 160,
                waiting: 2,
            },
        };
        let fake = start("d1", Role::Decode, "sim-model", 16, &contents)
            .await
            .expect("start");
        let url = format!("http://{}", fake.record.grpc_addr);
        let mut client = WorkerClient::connect(url).await.expect("connect");
        let info = client
            .info(v1::InfoRequest {})
            .await
            .expect("info")
            .into_inner();
        assert_eq!((info.worker_id.as_str(), info.block_size), ("d1", 16));
        let mut stream = client
            .subscribe(v1::SubscribeRequest {
                load_interval_ms: 0,
            })
            .await
            .expect("subscribe")
            .into_inner();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(stream.message().await.expect("event").expect("open"));
        }
        assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(matches!(&got[0].event, Some(Event::Stored(s)) if s.block_hashes == [1, 2, 3]));
        assert!(
            matches!(&got[2].event, Some(Event::Load(l)) if l.active_tokens == 160 && l.waiting == 2)
        );
    }

    #[tokio::test]
    async fn pools_are_indexed_by_the_router_registry() {
        let cfg = crate::routing_workload::WorkloadConfig {
            prompt_tokens: 128,
            workers_per_pool: 3,
            prompts: 4,
            shared_prefix_tokens: 32,
            unrelated_blocks_per_pool: 300,
            ..Default::default()
        };
        let workload = crate::routing_workload::build(&cfg);
        let registry = WorkerRegistry::new(dolphin_router::workers::RegistryConfig {
            model: "sim-model".into(),
            block_size: 16,
            load_interval_ms: 100,
            connector: dolphin_tls::GrpcConnector::plain(Duration::from_secs(5)),
        });
        let _fakes = start_pools(
            &registry,
            &workload,
            "sim-model",
            16,
            Duration::from_secs(60),
        )
        .await
        .expect("pools");
        assert_eq!(registry.counts(), (3, 3));
        let listed = registry.list();
        let d1 = listed
            .iter()
            .find(|w| w.worker_id == "decode-01")
            .expect("decode-01");
        assert_eq!(
            d1.indexed_blocks,
            workload.decode[1].distinct_blocks() as u64
        );
        assert_eq!(d1.waiting, workload.decode[1].load.waiting);
        registry.clear();
    }
}

/// A router's dispatcher in front of fake pools holding a workload's blocks: what the
/// routing-decision benches time (`Dispatcher::route` with the real registry and indexes, token
/// ids as prompts, no request log).
#[derive(Debug)]
pub struct FakeRouter {
    /// One worker thread, like one serving shard; the registry's subscriber tasks run on it.
    _rt: tokio::runtime::Runtime,
    /// The registry the fake pools joined.
    pub registry: Arc<WorkerRegistry>,
    /// The dispatcher under test.
    pub dispatcher: Dispatcher,
    /// Kept alive for the whole run: their event streams must stay connected.
    _fakes: Vec<FakeWorker>,
}

impl FakeRouter {
    /// Starts the fake pools of `workload` (waiting up to `timeout` until the registry has
    /// indexed them) and a dispatcher routing by `policy`.
    pub fn start(
        workload: &Workload,
        model: &str,
        block_size: u32,
        policy: Policy,
        overlap_weight: f64,
        timeout: Duration,
    ) -> Result<FakeRouter, BenchError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|source| BenchError::Io {
                what: "starting the runtime".into(),
                source,
            })?;
        let registry = WorkerRegistry::new(RegistryConfig {
            model: model.into(),
            block_size,
            load_interval_ms: 100,
            connector: dolphin_tls::GrpcConnector::plain(Duration::from_secs(5)),
        });
        let fakes = rt.block_on(start_pools(&registry, workload, model, block_size, timeout))?;
        let dispatcher = Dispatcher::new(
            registry.clone(),
            Arc::new(SimTokenizer),
            policy,
            DispatchConfig {
                model: model.into(),
                max_prompt_tokens: 1 << 20,
                max_output_tokens: 1 << 16,
                overlap_weight,
                block_size,
                max_migrations: 3,
                tool_call_parser: None,
                reasoning_parser: None,
                trust_request_chat_template: false,
                request_timeout: None,
            },
            RequestLog::disabled(),
        );
        Ok(FakeRouter {
            _rt: rt,
            registry,
            dispatcher,
            _fakes: fakes,
        })
    }
}

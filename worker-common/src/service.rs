//! The `dolphin.v1.Worker` service every worker serves: Subscribe, Info, Drain.

use std::sync::Arc;

use dolphin_proto::v1::{self, worker_server::Worker};
use tonic::{Request, Response, Status};

use crate::{
    state::{DEFAULT_LOAD_INTERVAL, WorkerState},
    subscribe::{self, SubscribeStream},
};

/// `dolphin.v1.Worker` over a worker's shared state.
#[derive(Debug, Clone)]
pub struct WorkerService {
    state: Arc<WorkerState>,
}

impl WorkerService {
    /// The service for one worker.
    pub fn new(state: Arc<WorkerState>) -> Self {
        Self { state }
    }
}

#[tonic::async_trait]
impl Worker for WorkerService {
    type SubscribeStream = SubscribeStream;

    async fn subscribe(
        &self,
        request: Request<v1::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let interval =
            subscribe::load_interval(request.get_ref().load_interval_ms, DEFAULT_LOAD_INTERVAL);
        Ok(Response::new(subscribe::subscribe(
            Arc::clone(&self.state),
            interval,
        )))
    }

    async fn info(
        &self,
        _request: Request<v1::InfoRequest>,
    ) -> Result<Response<v1::WorkerInfo>, Status> {
        Ok(Response::new(self.state.info()))
    }

    /// Stops admitting and answers with the requests still running; the process keeps serving
    /// them (and Info/Subscribe, whose load reports now say `draining`) until it is signalled.
    async fn drain(
        &self,
        _request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        let running = self.state.begin_drain().await;
        Ok(Response::new(v1::DrainResponse {
            running: u32::try_from(running).unwrap_or(u32::MAX),
        }))
    }
}

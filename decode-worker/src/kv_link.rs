//! NCCL communicators from this decode worker to prefill workers (feature `nccl`,
//! `--kv-transport nccl`). The first remote prefill to a prefill worker asks it for a
//! communicator (`OpenKvLink`: it makes the unique id and joins as rank 0); this worker joins as
//! rank 1 in the background. Until both have joined, and whenever opening fails, KV keeps coming
//! over TCP: the prefill worker uses NCCL only for decode workers it holds a communicator to.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use dolphin_kv_transfer::nccl::{NcclAcceptor, NcclId};
use dolphin_proto::v1;

/// The prefill workers asked for a communicator, and the CUDA device to join on.
#[derive(Debug)]
pub struct NcclLinks {
    device: usize,
    acceptor: NcclAcceptor,
    asked: Mutex<HashSet<String>>,
}

impl NcclLinks {
    /// Links joined into `acceptor`'s receiver on `device`.
    pub fn new(acceptor: NcclAcceptor, device: usize) -> Self {
        Self {
            device,
            acceptor,
            asked: Mutex::new(HashSet::new()),
        }
    }

    /// The first time `prefill_addr` comes up, opens a communicator with it in the background
    /// (a failure is logged and the next request tries again).
    pub fn ensure(
        self: &Arc<Self>,
        prefill_addr: &str,
        mut client: crate::clients::PrefillClient,
        kv_addr: &str,
    ) {
        if !self
            .asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(prefill_addr.to_owned())
        {
            return;
        }
        let links = Arc::clone(self);
        let prefill_addr = prefill_addr.to_owned();
        let request = v1::OpenKvLinkRequest {
            target_kv_addr: kv_addr.to_owned(),
        };
        tokio::spawn(async move {
            let opened = async {
                let reply = client
                    .open_kv_link(request)
                    .await
                    .map_err(|s| format!("{}: {}", s.code(), s.message()))?
                    .into_inner();
                let id = NcclId::from_bytes(&reply.nccl_id).map_err(|e| e.to_string())?;
                links
                    .acceptor
                    .accept(id, links.device)
                    .await
                    .map_err(|e| e.to_string())
            };
            match opened.await {
                Ok(()) => {
                    tracing::info!(prefill_addr, "NCCL link open: KV from it comes over NCCL")
                }
                Err(error) => {
                    tracing::warn!(prefill_addr, error, "NCCL link not opened; KV stays on TCP");
                    links
                        .asked
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&prefill_addr);
                }
            }
        });
    }
}

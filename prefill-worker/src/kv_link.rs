//! `OpenKvLink`: the NCCL communicators a prefill worker opens to decode workers (feature
//! `nccl`, `--kv-transport nccl`). This worker is rank 0: it makes the unique id, answers with
//! it, and joins in the background while the decode worker joins as rank 1; until both have,
//! that decode worker's KV keeps going over TCP.

#[cfg(feature = "nccl")]
use std::sync::Arc;

#[cfg(feature = "nccl")]
use dolphin_kv_transfer::nccl::{NcclId, NcclSender};
use tonic::Status;

/// This worker's NCCL side, or none (KV over TCP only).
#[derive(Debug, Clone, Default)]
pub struct KvLinks {
    #[cfg(feature = "nccl")]
    nccl: Option<(Arc<NcclSender>, usize)>,
}

impl KvLinks {
    /// No NCCL: `open` refuses.
    pub fn tcp_only() -> Self {
        Self::default()
    }

    /// Communicators of `sender`, on CUDA device `device`.
    #[cfg(feature = "nccl")]
    pub fn nccl(sender: Arc<NcclSender>, device: usize) -> Self {
        Self {
            nccl: Some((sender, device)),
        }
    }

    /// Starts a communicator for KV pushed to `target` (a decode worker's KV address) and
    /// returns its unique id for the decode worker to join with.
    #[allow(clippy::result_large_err, clippy::unused_async)] // tonic::Status is the handler's error type
    pub async fn open(&self, target: String) -> Result<Vec<u8>, Status> {
        if target.is_empty() {
            return Err(Status::invalid_argument("target_kv_addr is required"));
        }
        #[cfg(feature = "nccl")]
        if let Some((sender, device)) = &self.nccl {
            let id = NcclId::generate()
                .map_err(|e| Status::internal(format!("cannot make a NCCL id: {e}")))?;
            let (sender, device) = (Arc::clone(sender), *device);
            tokio::spawn(async move {
                match sender.connect(&target, id, device).await {
                    Ok(()) => tracing::info!(target, "NCCL link open: KV to it goes over NCCL"),
                    Err(e) => {
                        tracing::warn!(target, error = %e, "NCCL link failed; KV to it stays on TCP")
                    }
                }
            });
            return Ok(id.as_bytes().to_vec());
        }
        Err(Status::failed_precondition(
            "this prefill worker moves KV over TCP (start it with --kv-transport nccl)",
        ))
    }
}

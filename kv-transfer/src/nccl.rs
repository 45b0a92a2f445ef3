//! KV transfer between GPUs over NCCL (feature `nccl`): one two-rank communicator per
//! prefill/decode pair, the prefill worker rank 0, the decode worker rank 1. NCCL picks the
//! fastest path it finds (NVLink, PCIe peer-to-peer, RDMA between hosts where the network has it,
//! sockets otherwise).
//!
//! `cudarc` loads libcuda and libnccl at run time, so this compiles without CUDA; [`probe`] says
//! whether they load here and how many devices there are. A `nccl::Comm` is not `Send`: each
//! communicator lives on its own OS thread, which owns its CUDA stream and device buffers, and
//! takes commands over a channel.
//!
//! Setup: rank 0 makes an [`NcclId`] and ships its 128 bytes to the peer out of band (over gRPC
//! in the workers); both sides then create their communicator ([`NcclSender::connect`] and
//! [`KvReceiver::accept_nccl`](crate::KvReceiver::accept_nccl)), which blocks until both joined.
//!
//! Wire format on a communicator (every message a `u8` buffer, in order, so each side posts the
//! matching receive): a 16-byte header (transfer id, block count, magic), then per block an
//! 8-byte descriptor (length, CRC-32 as in [`frame::block_checksum`](crate::frame::block_checksum))
//! followed by the block's bytes, then the trailer's descriptor (its CRC under
//! [`TRAILER_INDEX`](crate::frame::TRAILER_INDEX)) and bytes as in the TCP end frame, then from
//! the receiver a 16-byte ack (transfer id, [`AckCode`], block index). A descriptor whose length
//! is [`ABORT_LEN`] ends the transfer early: the source stopped, and the receiver fails the slot. Blocks are staged through device memory: a CPU
//! engine's host blocks are copied to the GPU and back; a GPU engine would export from and import
//! into its KV memory directly (not built: the candle engine runs on CPU here).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use bytes::Bytes;
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{Comm, Id};
use dolphin_kv_block::KvBlock;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::TransferId;
use crate::error::TransferError;
use crate::frame::{AckCode, MAX_TRAILER_BYTES, TRAILER_INDEX, block_checksum, block_checksum_of};
use crate::sender::SendStats;
use crate::slot::{Claim, Registry, SlotSink};
use crate::transport::{KvTransport, SendFuture};

/// Marks a transfer header ("DKV1").
const MAGIC: u32 = 0x444b_5631;
const HEADER_BYTES: usize = 16;
const DESCRIPTOR_BYTES: usize = 8;
/// A descriptor length that aborts the transfer.
pub const ABORT_LEN: u32 = u32::MAX;
/// Largest block accepted (as the TCP receiver's default frame limit).
const MAX_BLOCK_BYTES: u32 = 64 << 20;

/// The unique id of one communicator (NCCL's `ncclUniqueId`, 128 bytes).
#[derive(Clone, Copy)]
pub struct NcclId([u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

fn nccl_error(what: &'static str, e: cudarc::nccl::result::NcclError) -> TransferError {
    TransferError::Nccl {
        op: what,
        detail: format!("{:?}", e.0),
    }
}

fn cuda_error(what: &'static str, e: cudarc::driver::DriverError) -> TransferError {
    TransferError::Nccl {
        op: what,
        detail: e.to_string(),
    }
}

/// Whether NCCL can run here: libcuda and libnccl load and there is at least one device.
/// Returns the device count.
// The only unsafe here: asking `cudarc` whether a shared library can be loaded (it dlopens it).
// Checked first because `cudarc` panics instead of failing where a library is missing.
#[allow(unsafe_code)]
pub fn probe() -> Result<usize, TransferError> {
    let unavailable = |detail: &str| TransferError::Nccl {
        op: "probe",
        detail: detail.to_string(),
    };
    // SAFETY: only tries to load the libraries.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(unavailable(
            "libcuda cannot be loaded (no NVIDIA driver here)",
        ));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(unavailable("libnccl cannot be loaded"));
    }
    let n = CudaContext::device_count().map_err(|e| cuda_error("count devices", e))?;
    if n < 1 {
        return Err(unavailable("no CUDA device"));
    }
    Ok(n as usize)
}

impl NcclId {
    /// A fresh id (rank 0's side). Fails where NCCL cannot run (see [`probe`]).
    pub fn generate() -> Result<NcclId, TransferError> {
        probe()?;
        let id = Id::new().map_err(|e| nccl_error("create unique id", e))?;
        let mut out = [0u8; 128];
        for (o, c) in out.iter_mut().zip(id.internal()) {
            *o = *c as u8;
        }
        Ok(NcclId(out))
    }

    /// The id as received from the peer.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId, TransferError> {
        let arr: [u8; 128] = bytes.try_into().map_err(|_| TransferError::Nccl {
            op: "parse unique id",
            detail: format!("{} bytes, not 128", bytes.len()),
        })?;
        Ok(NcclId(arr))
    }

    /// The 128 bytes to ship to the peer.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0
    }

    fn to_id(self) -> Id {
        let mut internal = [0 as std::ffi::c_char; 128];
        for (i, b) in internal.iter_mut().zip(self.0) {
            *i = b as std::ffi::c_char;
        }
        Id::uninit(internal)
    }
}

/// One side of a communicator, on its own thread.
struct Rank {
    comm: Comm,
    stream: Arc<CudaStream>,
    peer: i32,
}

impl Rank {
    /// Creates rank `rank` of 2 on `device` (blocks until the peer joins).
    fn join(rank: usize, id: NcclId, device: usize) -> Result<Rank, TransferError> {
        let ctx = CudaContext::new(device).map_err(|e| cuda_error("open device", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| cuda_error("create stream", e))?;
        let comm = Comm::from_rank(stream.clone(), rank, 2, id.to_id())
            .map_err(|e| nccl_error("join communicator", e))?;
        Ok(Rank {
            comm,
            stream,
            peer: 1 - rank as i32,
        })
    }

    fn send(&self, bytes: &[u8]) -> Result<(), TransferError> {
        let dev = self
            .stream
            .clone_htod(bytes)
            .map_err(|e| cuda_error("copy to device", e))?;
        self.comm
            .send(&dev, self.peer)
            .map_err(|e| nccl_error("send", e))?;
        // The device buffer must outlive the send: wait for it before it drops.
        self.stream
            .synchronize()
            .map_err(|e| cuda_error("synchronize", e))
    }

    fn recv(&self, len: usize) -> Result<Vec<u8>, TransferError> {
        let mut dev = self
            .stream
            .alloc_zeros::<u8>(len.max(1))
            .map_err(|e| cuda_error("allocate", e))?;
        self.comm
            .recv(&mut dev, self.peer)
            .map_err(|e| nccl_error("recv", e))?;
        let mut host = self
            .stream
            .clone_dtoh(&dev)
            .map_err(|e| cuda_error("copy to host", e))?;
        host.truncate(len);
        Ok(host)
    }
}

fn header(id: TransferId, n_blocks: u32) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&id.to_le_bytes());
    h[8..12].copy_from_slice(&n_blocks.to_le_bytes());
    h[12..].copy_from_slice(&MAGIC.to_le_bytes());
    h
}

fn descriptor(len: u32, checksum: u32) -> [u8; DESCRIPTOR_BYTES] {
    let mut d = [0u8; DESCRIPTOR_BYTES];
    d[..4].copy_from_slice(&len.to_le_bytes());
    d[4..].copy_from_slice(&checksum.to_le_bytes());
    d
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A transfer for rank 0's thread.
struct Job {
    id: TransferId,
    n_blocks: u32,
    blocks: mpsc::UnboundedReceiver<KvBlock>,
    trailer: oneshot::Receiver<Bytes>,
    reply: oneshot::Sender<Result<SendStats, TransferError>>,
}

/// Rank 0 of one communicator: sends transfers one at a time.
#[derive(Debug)]
struct Link {
    jobs: std_mpsc::Sender<Job>,
}

impl Link {
    /// Joins the communicator as rank 0 on a thread of its own.
    async fn open(id: NcclId, device: usize) -> Result<Link, TransferError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (jobs, job_rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("nccl-send".into())
            .spawn(move || {
                let rank = match Rank::join(0, id, device) {
                    Ok(r) => {
                        let _ = ready_tx.send(Ok(()));
                        r
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                // Ends when the sender (and with it the link) is dropped.
                while let Ok(job) = job_rx.recv() {
                    let started = Instant::now();
                    let result = send_job(&rank, job.id, job.n_blocks, job.blocks, job.trailer);
                    let _ = job.reply.send(result.map(|(blocks, bytes)| SendStats {
                        bytes,
                        blocks,
                        elapsed: started.elapsed(),
                    }));
                }
            })
            .map_err(|e| TransferError::io("spawn the NCCL thread", e))?;
        ready_rx.await.map_err(|_| TransferError::Nccl {
            op: "join communicator",
            detail: "the NCCL thread ended".into(),
        })??;
        Ok(Link { jobs })
    }
}

fn send_job(
    rank: &Rank,
    id: TransferId,
    n_blocks: u32,
    mut blocks: mpsc::UnboundedReceiver<KvBlock>,
    trailer: oneshot::Receiver<Bytes>,
) -> Result<(u32, u64), TransferError> {
    rank.send(&header(id, n_blocks))?;
    let mut bytes = 0u64;
    let mut sent = 0u32;
    let abort = |sent| -> Result<(u32, u64), TransferError> {
        rank.send(&descriptor(ABORT_LEN, 0))?;
        // The receiver acks the abort; the communicator stays in step.
        let _ = rank.recv(HEADER_BYTES)?;
        Err(TransferError::SourceEnded {
            id,
            sent,
            expected: n_blocks,
        })
    };
    while sent < n_blocks {
        let Some(block) = blocks.blocking_recv() else {
            return abort(sent);
        };
        let len = u32::try_from(block.len()).map_err(|_| TransferError::BlockTooLarge {
            index: sent as usize,
            len: block.len(),
            max: MAX_BLOCK_BYTES,
        })?;
        rank.send(&descriptor(len, block_checksum_of(id, sent, &block)))?;
        if len > 0 {
            rank.send(block.bytes())?;
        }
        bytes += u64::from(len);
        sent += 1;
    }
    let Ok(trailer) = trailer.blocking_recv() else {
        return abort(sent);
    };
    let len = u32::try_from(trailer.len())
        .ok()
        .filter(|&len| len <= MAX_TRAILER_BYTES)
        .ok_or(TransferError::Frame(
            crate::frame::FrameError::TrailerTooLarge {
                id,
                len: u32::try_from(trailer.len()).unwrap_or(u32::MAX),
            },
        ));
    let len = match len {
        Ok(len) => len,
        Err(e) => {
            let _ = abort(sent);
            return Err(e);
        }
    };
    rank.send(&descriptor(
        len,
        block_checksum(id, TRAILER_INDEX, &trailer),
    ))?;
    if len > 0 {
        rank.send(&trailer)?;
    }
    let ack = rank.recv(HEADER_BYTES)?;
    let code = u8::try_from(u32_at(&ack, 8))
        .ok()
        .and_then(AckCode::from_u8);
    match code {
        Some(AckCode::Ok) if u64_at(&ack, 0) == id => Ok((sent, bytes)),
        Some(code) => Err(TransferError::Refused {
            id,
            code,
            index: u32_at(&ack, 12),
        }),
        None => Err(TransferError::Nccl {
            op: "read ack",
            detail: format!("unknown ack code {}", u32_at(&ack, 8)),
        }),
    }
}

/// The prefill worker's NCCL side: one communicator per decode worker, opened with
/// [`connect`](Self::connect) after the id went to that worker.
#[derive(Debug, Default)]
pub struct NcclSender {
    links: Mutex<HashMap<String, Arc<Link>>>,
}

impl NcclSender {
    /// A sender with no communicators yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Joins the communicator `id` as rank 0 on `device` and uses it for transfers to `target`
    /// (the decode worker's KV address). The decode worker must join the same id as rank 1.
    pub async fn connect(
        &self,
        target: &str,
        id: NcclId,
        device: usize,
    ) -> Result<(), TransferError> {
        let link = Link::open(id, device).await?;
        self.links.lock().insert(target.to_string(), Arc::new(link));
        Ok(())
    }

    /// Whether a communicator to `target` is open.
    pub fn has_link(&self, target: &str) -> bool {
        self.links.lock().contains_key(target)
    }
}

impl KvTransport for NcclSender {
    fn kind(&self) -> &'static str {
        "nccl"
    }

    fn send_stream<'a>(
        &'a self,
        target: &'a str,
        id: TransferId,
        n_blocks: u32,
        blocks: mpsc::UnboundedReceiver<KvBlock>,
        trailer: oneshot::Receiver<Bytes>,
    ) -> SendFuture<'a> {
        Box::pin(async move {
            let link =
                self.links
                    .lock()
                    .get(target)
                    .cloned()
                    .ok_or_else(|| TransferError::Nccl {
                        op: "send",
                        detail: format!("no NCCL communicator to {target}"),
                    })?;
            let (reply, done) = oneshot::channel();
            link.jobs
                .send(Job {
                    id,
                    n_blocks,
                    blocks,
                    trailer,
                    reply,
                })
                .map_err(|_| TransferError::Aborted { id })?;
            done.await.map_err(|_| TransferError::Aborted { id })?
        })
    }
}

/// A prefill worker's transport with NCCL on: transfers to a decode worker with an open
/// communicator go over NCCL, the rest over TCP (a decode worker without NCCL, or one whose
/// communicator is still being set up).
#[derive(Debug)]
pub struct NcclOrTcp {
    nccl: Arc<NcclSender>,
    tcp: crate::KvSender,
}

impl NcclOrTcp {
    /// Both transports; `nccl` gets its communicators from [`NcclSender::connect`].
    pub fn new(nccl: Arc<NcclSender>, tcp: crate::KvSender) -> Self {
        Self { nccl, tcp }
    }
}

impl KvTransport for NcclOrTcp {
    fn kind(&self) -> &'static str {
        "nccl"
    }

    fn send_stream<'a>(
        &'a self,
        target: &'a str,
        id: TransferId,
        n_blocks: u32,
        blocks: mpsc::UnboundedReceiver<KvBlock>,
        trailer: oneshot::Receiver<Bytes>,
    ) -> SendFuture<'a> {
        if self.nccl.has_link(target) {
            self.nccl.send_stream(target, id, n_blocks, blocks, trailer)
        } else {
            KvTransport::send_stream(&self.tcp, target, id, n_blocks, blocks, trailer)
        }
    }
}

/// Joins communicators into a [`KvReceiver`](crate::KvReceiver)'s slots
/// ([`KvReceiver::nccl_acceptor`](crate::KvReceiver::nccl_acceptor)).
#[derive(Clone, Debug)]
pub struct NcclAcceptor {
    registry: Arc<Registry>,
}

impl NcclAcceptor {
    pub(crate) fn new(registry: Arc<Registry>) -> Self {
        Self { registry }
    }

    /// Joins communicator `id` as rank 1 on CUDA device `device` and serves its transfers
    /// from a thread of its own. Returns once both ranks joined.
    pub async fn accept(&self, id: NcclId, device: usize) -> Result<(), TransferError> {
        accept(Arc::clone(&self.registry), id, device).await
    }
}

/// Joins communicator `id` as rank 1 on `device`, on a thread of its own, and serves it there:
/// transfers go to the registry's slots as from a TCP connection. Returns once joined.
async fn accept(registry: Arc<Registry>, id: NcclId, device: usize) -> Result<(), TransferError> {
    let (ready_tx, ready_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("nccl-recv".into())
        .spawn(move || {
            let rank = match Rank::join(1, id, device) {
                Ok(r) => {
                    let _ = ready_tx.send(Ok(()));
                    r
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            match serve(&rank, &registry) {
                Ok(()) => tracing::debug!("NCCL link closed"),
                Err(e) => tracing::warn!(error = %e, "NCCL link failed"),
            }
        })
        .map_err(|e| TransferError::io("spawn the NCCL thread", e))?;
    ready_rx.await.map_err(|_| TransferError::Nccl {
        op: "join communicator",
        detail: "the NCCL thread ended".into(),
    })?
}

/// Rank 1's loop. Ends when a NCCL call fails (the peer went away).
fn serve(rank: &Rank, registry: &Registry) -> Result<(), TransferError> {
    loop {
        let h = rank.recv(HEADER_BYTES)?;
        if u32_at(&h, 12) != MAGIC {
            return Err(TransferError::Nccl {
                op: "read header",
                detail: "bad magic: the peers are out of step".into(),
            });
        }
        let (tid, n_blocks) = (u64_at(&h, 0), u32_at(&h, 8));
        let claim = registry.claim(tid, n_blocks);
        let (code, index) = receive_blocks(rank, tid, n_blocks, claim)?;
        let mut ack = [0u8; HEADER_BYTES];
        ack[..8].copy_from_slice(&tid.to_le_bytes());
        ack[8..12].copy_from_slice(&(code as u32).to_le_bytes());
        ack[12..].copy_from_slice(&index.to_le_bytes());
        rank.send(&ack)?;
    }
}

/// Reads one descriptor and the bytes it announces (at most `max`); `None` when it is the
/// source's abort.
fn read_piece(
    rank: &Rank,
    op: &'static str,
    max: u32,
) -> Result<Option<(Vec<u8>, u32)>, TransferError> {
    let d = rank.recv(DESCRIPTOR_BYTES)?;
    let (len, checksum) = (u32_at(&d, 0), u32_at(&d, 4));
    if len == ABORT_LEN {
        return Ok(None);
    }
    if len > max {
        return Err(TransferError::Nccl {
            op,
            detail: format!("{len} bytes, over the {max}-byte limit"),
        });
    }
    let data = if len > 0 {
        rank.recv(len as usize)?
    } else {
        Vec::new()
    };
    Ok(Some((data, checksum)))
}

/// Receives one transfer's blocks (always all of them, to stay in step), delivering them when
/// the slot wants them. Returns the ack.
fn receive_blocks(
    rank: &Rank,
    id: TransferId,
    n_blocks: u32,
    claim: Claim,
) -> Result<(AckCode, u32), TransferError> {
    let (mut sink, mut verdict) = match claim {
        Claim::Slot(sink) => (Some(sink), None),
        Claim::CountMismatch | Claim::Dropped => (None, Some((AckCode::Rejected, 0))),
        Claim::Unknown => (None, Some((AckCode::UnknownTransfer, 0))),
    };
    let abort = |sink: &mut Option<SlotSink>| {
        if let Some(s) = sink.take() {
            s.finish(Err(TransferError::Aborted { id }));
        }
    };
    for index in 0..n_blocks {
        let Some((data, checksum)) = read_piece(rank, "read block", MAX_BLOCK_BYTES)? else {
            abort(&mut sink);
            return Ok((AckCode::Rejected, index));
        };
        if verdict.is_some() {
            continue;
        }
        if block_checksum(id, index, &data) != checksum {
            if let Some(s) = sink.take() {
                s.finish(Err(TransferError::ChecksumMismatch { id, index }));
            }
            verdict = Some((AckCode::ChecksumMismatch, index));
            continue;
        }
        let delivered = sink
            .as_ref()
            .is_some_and(|s| s.blocks.blocking_send((index, Bytes::from(data))).is_ok());
        if !delivered {
            sink = None;
            verdict = Some((AckCode::Rejected, index));
        }
    }
    let Some((trailer, checksum)) = read_piece(rank, "read trailer", MAX_TRAILER_BYTES)? else {
        abort(&mut sink);
        return Ok((AckCode::Rejected, n_blocks));
    };
    if let Some(s) = sink.take() {
        if block_checksum(id, TRAILER_INDEX, &trailer) != checksum {
            s.finish(Err(TransferError::ChecksumMismatch {
                id,
                index: TRAILER_INDEX,
            }));
            return Ok((AckCode::ChecksumMismatch, TRAILER_INDEX));
        }
        s.finish(Ok(Bytes::from(trailer)));
    }
    Ok(verdict.unwrap_or((AckCode::Ok, 0)))
}

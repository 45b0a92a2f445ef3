//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses a different subset

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use dolphin_kv_transfer::{KvBlock, KvReceiver, TransferConfig, TransferError, TransferSlot};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Generous timeouts: tests must not fail because the machine is busy.
pub fn cfg() -> TransferConfig {
    TransferConfig {
        io_timeout: Duration::from_secs(60),
        max_block_bytes: 1 << 20,
        channel_blocks: 4,
        idle_timeout: Duration::from_secs(120),
    }
}

/// A trailer that is ready before the transfer starts.
pub fn ready(trailer: &'static [u8]) -> tokio::sync::oneshot::Receiver<Bytes> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tx.send(Bytes::from_static(trailer)).expect("open");
    rx
}

pub fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid address")
}

pub async fn receiver(cfg: TransferConfig) -> KvReceiver {
    KvReceiver::bind(localhost(), cfg)
        .await
        .expect("bind receiver")
}

/// Deterministic content that differs per transfer, block and byte.
pub fn block(transfer: u64, index: u32, len: usize) -> KvBlock {
    let mut x = transfer.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(index).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Blocks of varied sizes, some empty, the largest at the limit of `cfg()`.
pub fn blocks(transfer: u64, n: u32) -> Vec<KvBlock> {
    (0..n)
        .map(|i| {
            let len = match i % 5 {
                0 => 0,
                1 => 1,
                2 => 4096,
                3 => 100_003,
                _ => 1 << 20,
            };
            block(transfer, i, len)
        })
        .collect()
}

/// Reads a slot to its end, checking that indexes arrive in order (as blocks, so they compare
/// with the blocks sent: same bytes, same checksum).
pub async fn collect(slot: &mut TransferSlot) -> Result<Vec<KvBlock>, TransferError> {
    collect_after(slot, Vec::new()).await
}

/// Like [`collect`], after the blocks in `got` were already read.
pub async fn collect_after(
    slot: &mut TransferSlot,
    mut got: Vec<KvBlock>,
) -> Result<Vec<KvBlock>, TransferError> {
    while let Some(item) = slot.recv().await {
        let (index, bytes) = item?;
        assert_eq!(index as usize, got.len(), "blocks out of order");
        got.push(KvBlock::new(bytes));
    }
    Ok(got)
}

/// A raw client that has exchanged prefaces with the receiver at `addr`.
pub async fn raw_client(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&dolphin_kv_transfer::frame::Preface::CURRENT.encode())
        .await
        .expect("write preface");
    let mut p = [0u8; dolphin_kv_transfer::frame::PREFACE_LEN];
    s.read_exact(&mut p).await.expect("read preface");
    s
}

/// Reads one frame header from a raw socket.
pub async fn read_frame(s: &mut TcpStream) -> dolphin_kv_transfer::frame::Frame {
    use dolphin_kv_transfer::frame::{Frame, HEADER_LEN};
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).await.expect("read frame");
    Frame::decode(&h, 0).expect("valid frame")
}

/// A one-connection TCP proxy to `upstream` that flips one bit of the client-to-server byte at
/// offset `corrupt_at` (counted from the first byte of the connection). Returns its address.
pub async fn corrupting_proxy(upstream: SocketAddr, corrupt_at: u64) -> SocketAddr {
    let listener = TcpListener::bind(localhost()).await.expect("bind proxy");
    let addr = listener.local_addr().expect("proxy address");
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.expect("accept");
        let server = TcpStream::connect(upstream)
            .await
            .expect("connect upstream");
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let up = async move {
            let mut buf = vec![0u8; 64 << 10];
            let mut offset = 0u64;
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if (offset..offset + n as u64).contains(&corrupt_at) {
                    buf[(corrupt_at - offset) as usize] ^= 0x10;
                }
                offset += n as u64;
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = sw.shutdown().await;
        };
        let down = async move {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
            let _ = cw.shutdown().await;
        };
        tokio::join!(up, down);
    });
    addr
}

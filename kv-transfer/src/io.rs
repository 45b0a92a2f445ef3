//! Socket reads and writes with a progress timeout on every call.
//!
//! Timeouts bound each individual read or write, not a whole transfer: a large transfer on a
//! slow link is fine as long as bytes keep moving, a stuck peer is not.

use std::future::Future;
use std::io::{self, IoSlice};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::TransferError;
use crate::frame::BlockHasher;

/// Runs one I/O operation with a deadline.
pub(crate) async fn timed<T>(
    after: Duration,
    op: &'static str,
    fut: impl Future<Output = io::Result<T>>,
) -> Result<T, TransferError> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(TransferError::io(op, e)),
        Err(_) => Err(TransferError::Timeout { op, after }),
    }
}

/// Reads exactly `buf.len()` bytes (small, fixed-size things: prefaces and headers).
pub(crate) async fn read_exact<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
    after: Duration,
    op: &'static str,
) -> Result<(), TransferError> {
    timed(after, op, stream.read_exact(buf)).await.map(drop)
}

/// Reads a header that may not come: waits up to `idle` for its first byte and returns `None`
/// when the peer closed the connection cleanly before it; the rest must follow within `after`.
pub(crate) async fn read_next<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
    idle: Duration,
    after: Duration,
    op: &'static str,
) -> Result<Option<()>, TransferError> {
    let n = timed(idle, op, stream.read(buf)).await?;
    if n == 0 {
        return Ok(None);
    }
    read_exact(stream, &mut buf[n..], after, "read frame header").await?;
    Ok(Some(()))
}

/// Reads a payload of `len` bytes straight into `buf` (empty, with room for `len`), hashing
/// each piece as it arrives, while it is still in cache. The buffer is never zeroed or copied.
pub(crate) async fn read_payload<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut buf: BytesMut,
    len: usize,
    hasher: &mut BlockHasher,
    after: Duration,
) -> Result<BytesMut, TransferError> {
    const OP: &str = "read block payload";
    debug_assert!(buf.is_empty() && buf.capacity() >= len);
    while buf.len() < len {
        let start = buf.len();
        // `limit` keeps the read inside this block: BytesMut would otherwise grow to take
        // the next frame's bytes as well.
        let mut window = (&mut buf).limit(len - start);
        let n = timed(after, OP, stream.read_buf(&mut window)).await?;
        if n == 0 {
            return Err(TransferError::Closed { op: OP });
        }
        hasher.update(&buf[start..]);
    }
    Ok(buf)
}

/// Reads and throws away `len` bytes (a payload nobody will take), through a small reused
/// buffer: draining costs no allocation however large the block.
pub(crate) async fn discard<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut len: usize,
    scratch: &mut [u8],
    after: Duration,
) -> Result<(), TransferError> {
    const OP: &str = "drain block payload";
    while len > 0 {
        let want = len.min(scratch.len());
        let n = timed(after, OP, stream.read(&mut scratch[..want])).await?;
        if n == 0 {
            return Err(TransferError::Closed { op: OP });
        }
        len -= n;
    }
    Ok(())
}

/// Writes all of `slices` with vectored writes (headers and payloads go out in one call, the
/// payloads straight from their `Bytes`). Empty slices must be left out by the caller. Does
/// not flush: call [`flush`] before waiting for the peer's answer.
pub(crate) async fn write_all_vectored<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut slices: &mut [IoSlice<'_>],
    after: Duration,
    op: &'static str,
) -> Result<(), TransferError> {
    while !slices.is_empty() {
        let n = timed(after, op, stream.write_vectored(slices)).await?;
        if n == 0 {
            return Err(TransferError::Closed { op });
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// Pushes out what the stream still holds. This matters over TLS: a TLS stream takes plaintext
/// it cannot yet send as records (the socket is full) and reports it written, so without a
/// flush the last records would wait in its buffer while this side waits for the peer's
/// answer to them, until the timeout. On plain TCP it is free. Between the writes of one
/// transfer it is not needed: each write first sends what the last one left.
pub(crate) async fn flush<S: AsyncWrite + Unpin>(
    stream: &mut S,
    after: Duration,
    op: &'static str,
) -> Result<(), TransferError> {
    timed(after, op, stream.flush()).await
}

/// Writes a small buffer (preface, begin or ack frame) and flushes it: every such frame is
/// followed by a wait for the peer.
pub(crate) async fn write_all<S: AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &[u8],
    after: Duration,
    op: &'static str,
) -> Result<(), TransferError> {
    timed(after, op, stream.write_all(buf)).await?;
    flush(stream, after, op).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::block_checksum;

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn payload_is_read_exactly_and_hashed() {
        let (mut a, mut b) = tokio::io::duplex(7); // tiny pipe: many partial reads
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&sent).await.unwrap();
            a.write_all(b"next frame").await.unwrap();
            a
        });
        let mut h = BlockHasher::new(5, 2);
        let buf = BytesMut::with_capacity(data.len());
        let got = read_payload(&mut b, buf, data.len(), &mut h, T)
            .await
            .unwrap();
        assert_eq!(&got[..], &data[..]);
        assert_eq!(h.finish(), block_checksum(5, 2, &data));
        // The next frame's bytes were left in the pipe.
        let mut rest = [0u8; 10];
        b.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"next frame");
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn vectored_write_survives_partial_writes() {
        let (mut a, mut b) = tokio::io::duplex(5);
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            b.read_to_end(&mut all).await.unwrap();
            all
        });
        let parts: [&[u8]; 3] = [b"header", b"payload bytes", b"end"];
        let mut slices = parts.map(IoSlice::new);
        write_all_vectored(&mut a, &mut slices, T, "test")
            .await
            .unwrap();
        drop(a);
        assert_eq!(reader.await.unwrap(), b"headerpayload bytesend");
    }

    /// A writer that, like a TLS stream, takes bytes into a buffer of its own and passes them
    /// on only when flushed.
    #[derive(Default)]
    struct Buffering {
        held: Vec<u8>,
        wire: Vec<u8>,
    }

    impl AsyncWrite for Buffering {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            self.held.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            let held = std::mem::take(&mut self.held);
            self.wire.extend_from_slice(&held);
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    #[tokio::test]
    async fn small_frames_are_flushed_and_flush_empties_the_buffer() {
        let mut w = Buffering::default();
        let parts: [&[u8]; 2] = [b"blocks", b"end"];
        write_all_vectored(&mut w, &mut parts.map(IoSlice::new), T, "test")
            .await
            .unwrap();
        flush(&mut w, T, "test").await.unwrap();
        assert_eq!((&w.held[..], &w.wire[..]), (&b""[..], &b"blocksend"[..]));
        write_all(&mut w, b"ack", T, "test").await.unwrap();
        assert_eq!((&w.held[..], &w.wire[..]), (&b""[..], &b"blocksendack"[..]));
    }

    #[tokio::test]
    async fn eof_mid_payload_is_closed() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(b"short").await.unwrap();
        drop(a);
        let mut h = BlockHasher::new(0, 0);
        let buf = BytesMut::with_capacity(100);
        let err = read_payload(&mut b, buf, 100, &mut h, T).await.unwrap_err();
        assert!(matches!(err, TransferError::Closed { .. }), "{err:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn silent_peer_times_out() {
        let (_a, mut b) = tokio::io::duplex(64);
        let mut buf = [0u8; 4];
        let err = read_exact(&mut b, &mut buf, T, "read test")
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                TransferError::Timeout {
                    op: "read test",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn clean_close_between_frames_is_none() {
        let (a, mut b) = tokio::io::duplex(64);
        drop(a);
        let mut buf = [0u8; 4];
        assert!(
            read_next(&mut b, &mut buf, T, T, "next")
                .await
                .unwrap()
                .is_none()
        );
    }
}

//! Server-streaming gRPC calls straight over one `h2` connection: the router's decode calls.
//!
//! Through hyper's client a call cost the router two writes (the request's HEADERS, then its
//! DATA once the connection task had granted flow-control capacity) and so two wake-ups of the
//! decode worker, plus a hop through hyper's dispatch channel to the connection task. Here the
//! call queues HEADERS and the whole (small) request message together and the connection task
//! writes them at once. What the router needs of a gRPC client for these calls is small: one
//! request message, a stream of response messages, the status in the trailers, cancellation by
//! dropping the stream (h2 then resets it, which cancels the request on the worker), keep-alive
//! pings that end the streams of a host that stopped answering, and a reconnect on the next call
//! after the connection died.
//!
//! Errors follow tonic's convention, which [`crate::error::DispatchError::from_worker_status`]
//! relies on: a status the worker sent has no source; one made here from a transport error
//! carries that error as its source.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use dolphin_tls::GrpcConnector;
use futures::Stream;
use h2::client::SendRequest;
use http::{HeaderName, HeaderValue, Method, Request, Uri, header};
use tokio::task::AbortHandle;
use tonic::{Code, Status};

/// Largest response message accepted (tonic's default decode limit is 4 MiB).
const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// gRPC's message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// How a connection is made and kept.
#[derive(Clone, Copy, Debug)]
pub struct ConnOptions {
    /// How often the connection is pinged.
    pub keep_alive_interval: Duration,
    /// How long a ping may go unanswered before the connection and its streams are closed.
    pub keep_alive_timeout: Duration,
}

/// A lazily made, self-remaking HTTP/2 connection to one gRPC server, for calls from the
/// runtime it was first used on (its connection task runs there).
#[derive(Debug)]
pub struct GrpcConn {
    authority: http::uri::Authority,
    opts: ConnOptions,
    /// TCP, then TLS when the router has it.
    connector: GrpcConnector,
    live: tokio::sync::Mutex<Option<Live>>,
}

#[derive(Debug)]
struct Live {
    send: SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
    task: AbortHandle,
}

impl Drop for Live {
    fn drop(&mut self) {
        // Dropping the last handle of a connection we replaced: close it for good.
        self.task.abort();
    }
}

/// Reset streams one worker connection remembers (h2 ignores late frames for them).
const MAX_RESET_STREAMS: usize = 1 << 15;
/// Framing overhead of small DATA frames one worker connection may hold unread: about 250,000
/// token messages (h2 counts up to 256 bytes per frame).
const DATA_FRAME_BUDGET: usize = 64 << 20;

impl GrpcConn {
    /// A connection to `authority` (`host:port`); nothing connects until the first call.
    pub fn new(
        authority: http::uri::Authority,
        opts: ConnOptions,
        connector: GrpcConnector,
    ) -> Self {
        Self {
            authority,
            opts,
            connector,
            live: tokio::sync::Mutex::new(None),
        }
    }

    /// A sender on a live connection, connecting first if there is none.
    async fn sender(&self) -> Result<SendRequest<Bytes>, Status> {
        let mut live = self.live.lock().await;
        if let Some(l) = live.as_ref()
            && !l.closed.load(Ordering::Acquire)
        {
            return Ok(l.send.clone());
        }
        let fresh = self.connect().await?;
        let send = fresh.send.clone();
        *live = Some(fresh);
        Ok(send)
    }

    async fn connect(&self) -> Result<Live, Status> {
        // TCP_NODELAY, the connect timeout and the TLS handshake are the connector's.
        let stream = self
            .connector
            .dial(self.authority.as_str())
            .await
            .map_err(transport)?;
        let (send, mut conn) = h2::client::Builder::new()
            // tonic's defaults: a window large enough that a worker's stream never waits on it.
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 20)
            // Thousands of streams share one connection to a worker (measured with 10,000
            // concurrent streams, bench load_faults), and h2's abuse limits, sized for one
            // client's few streams, tore it down with ENHANCE_YOUR_CALM, failing every stream
            // on it. The peer is our own worker; the limits are sized for the router's load:
            // - each token is a small DATA frame, buffered until its stream is read; h2 caps
            //   their framing overhead at half the connection window (about 2,400 frames);
            .data_frame_budget(DATA_FRAME_BUDGET)
            // - a stream is reset when dropped on its last message, just before the worker's
            //   trailers; h2 remembers 10 resets and counts late frames on the others as
            //   protocol errors, closing the connection at 1,024 of them.
            .max_concurrent_reset_streams(MAX_RESET_STREAMS)
            .max_local_error_reset_streams(None)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(transport)?;
        let ping = conn.ping_pong();
        let closed = Arc::new(AtomicBool::new(false));
        let ended = closed.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "worker connection ended");
            }
            ended.store(true, Ordering::Release);
        })
        .abort_handle();
        if let Some(ping) = ping {
            tokio::spawn(keep_alive(ping, task.clone(), closed.clone(), self.opts));
        }
        Ok(Live { send, closed, task })
    }

    /// Calls `path` with `request` and returns the response stream once the response headers
    /// arrived. `metadata` goes out as request headers.
    pub async fn server_streaming<Req, Resp>(
        &self,
        path: &'static str,
        request: &Req,
        metadata: &[(HeaderName, HeaderValue)],
    ) -> Result<GrpcStream<Resp>, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let mut send = self.sender().await?.ready().await.map_err(transport)?;
        let uri = Uri::builder()
            .scheme(self.connector.scheme())
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| Status::internal(format!("bad call path {path}: {e}")))?;
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header(header::TE, "trailers")
            .body(())
            .map_err(|e| Status::internal(format!("bad request headers: {e}")))?;
        req.headers_mut().extend(metadata.iter().cloned());
        let (response, mut body) = send.send_request(req, false).map_err(transport)?;
        // Queued with the HEADERS frame: both leave in the connection task's next write.
        body.send_data(encode(request), true).map_err(transport)?;
        let response = response.await.map_err(transport)?;
        let (parts, recv) = response.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(from_http_status(parts.status));
        }
        // A "trailers-only" answer: the status is in the headers and no message follows.
        if let Some(status) = Status::from_header_map(&parts.headers) {
            if status.code() != Code::Ok {
                return Err(status);
            }
            return Ok(GrpcStream::finished());
        }
        Ok(GrpcStream::new(recv))
    }
}

/// Pings the connection every interval; one unanswered for the timeout closes it (its task is
/// aborted, which ends every stream on it with an error).
async fn keep_alive(
    mut ping: h2::PingPong,
    task: AbortHandle,
    closed: Arc<AtomicBool>,
    opts: ConnOptions,
) {
    loop {
        tokio::time::sleep(opts.keep_alive_interval).await;
        if closed.load(Ordering::Acquire) || task.is_finished() {
            return;
        }
        let answered =
            tokio::time::timeout(opts.keep_alive_timeout, ping.ping(h2::Ping::opaque())).await;
        if !matches!(answered, Ok(Ok(_))) {
            tracing::warn!("worker connection missed a keep-alive ping; closing it");
            closed.store(true, Ordering::Release);
            task.abort();
            return;
        }
    }
}

/// `message` with gRPC's 5-byte prefix (uncompressed).
fn encode(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    message
        .encode(&mut buf)
        .expect("the buffer was sized for the message");
    buf.freeze()
}

/// A status made here from a transport failure: it carries the failure as its source.
fn transport(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Status {
    let e = e.into();
    let code = match e.downcast_ref::<h2::Error>().and_then(h2::Error::reason) {
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        Some(_) => Code::Internal,
        None => Code::Unavailable,
    };
    let mut status = Status::new(code, e.to_string());
    status.set_source(Arc::from(e));
    status
}

/// The gRPC spec's mapping of an HTTP status that is not 200.
fn from_http_status(s: http::StatusCode) -> Status {
    let code = match s.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("the worker answered HTTP {s}"))
}

#[derive(Debug)]
enum State {
    Data,
    Trailers,
    Done,
}

/// The response messages of one call; dropping it before the end cancels the call.
#[derive(Debug)]
pub struct GrpcStream<T> {
    recv: Option<h2::RecvStream>,
    buf: BytesMut,
    state: State,
    _message: PhantomData<fn() -> T>,
}

impl<T: prost::Message + Default> GrpcStream<T> {
    fn new(recv: h2::RecvStream) -> Self {
        Self {
            recv: Some(recv),
            buf: BytesMut::new(),
            state: State::Data,
            _message: PhantomData,
        }
    }

    fn finished() -> Self {
        Self {
            recv: None,
            buf: BytesMut::new(),
            state: State::Done,
            _message: PhantomData,
        }
    }

    /// The next message; `None` after the last one (the call ended with status OK).
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .transpose()
    }

    /// A whole message at the front of `buf`, if one is there.
    fn take_message(&mut self) -> Result<Option<T>, Status> {
        if self.buf.len() < PREFIX {
            return Ok(None);
        }
        let compressed = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if compressed != 0 {
            return Err(Status::internal(
                "the worker sent a compressed message; none was asked for",
            ));
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(Status::resource_exhausted(format!(
                "the worker sent a {len}-byte message, over the limit of {MAX_MESSAGE_BYTES}"
            )));
        }
        if self.buf.len() < PREFIX + len {
            return Ok(None);
        }
        self.buf.advance(PREFIX);
        let bytes = self.buf.split_to(len);
        T::decode(bytes)
            .map(Some)
            .map_err(|e| Status::internal(format!("cannot decode the worker's message: {e}")))
    }
}

impl<T: prost::Message + Default> Stream for GrpcStream<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            match this.take_message() {
                Ok(Some(m)) => return Poll::Ready(Some(Ok(m))),
                Ok(None) => {}
                Err(e) => {
                    this.state = State::Done;
                    this.recv = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let Some(recv) = this.recv.as_mut() else {
                return Poll::Ready(None);
            };
            match this.state {
                State::Data => match ready!(recv.poll_data(cx)) {
                    Some(Ok(chunk)) => {
                        let _ = recv.flow_control().release_capacity(chunk.len());
                        this.buf.extend_from_slice(&chunk);
                    }
                    Some(Err(e)) => {
                        this.state = State::Done;
                        return Poll::Ready(Some(Err(transport(e))));
                    }
                    None => {
                        if !this.buf.is_empty() {
                            this.state = State::Done;
                            return Poll::Ready(Some(Err(Status::internal(
                                "the worker's stream ended inside a message",
                            ))));
                        }
                        this.state = State::Trailers;
                    }
                },
                State::Trailers => {
                    let trailers = ready!(recv.poll_trailers(cx));
                    this.state = State::Done;
                    this.recv = None;
                    return Poll::Ready(match trailers {
                        Ok(Some(map)) => match Status::from_header_map(&map) {
                            Some(s) if s.code() == Code::Ok => None,
                            Some(s) => Some(Err(s)),
                            None => Some(Err(Status::internal(
                                "the worker's trailers carry no grpc-status",
                            ))),
                        },
                        Ok(None) => Some(Err(Status::internal(
                            "the worker's stream ended without trailers",
                        ))),
                        Err(e) => Some(Err(transport(e))),
                    });
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
#[path = "grpc_call_tests.rs"]
mod tests;

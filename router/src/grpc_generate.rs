//! `dolphin.v1.Inference/Generate` straight from hyper's request, every other gRPC call through
//! tonic's routes.
//!
//! Why: callgrind put about 15k instructions of a gRPC request's 146k in what lies between
//! hyper's stream and the handler, and around the answer (tonic's routes, which are axum's
//! router, the key interceptor, the in-flight limit layer, the server's codec and its
//! `EncodeBody`, each with its own boxes and body wrappers; `docs/dev/profiling.md`), as the
//! HTTP inference routes had in axum (`http/public.rs`); skipping them saved about 7k
//! (`docs/architecture.md`, "`Generate` straight from hyper too"). This layer does the same
//! checks in the same order (key, then a slot of the in-flight limit, then the message), with
//! the same status codes and messages as tonic's codec, in straight-line code, and writes the
//! answer stream itself: each wake-up's messages in one DATA frame, then the trailers. The
//! tests send the same bodies through both paths and require the same answers.
//!
//! Only a plain call takes this path: `POST`, `application/grpc` (or `+proto`) and an
//! uncompressed request. A gzip-compressed one, or anything unusual, goes to tonic as before.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use dolphin_proto::v1;
use futures::StreamExt;
use futures::future::Either;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use tonic::Status;
use tonic::body::Body;

use crate::admission::{InflightLimit, Permit};
use crate::auth::{KeySet, Verdict};
use crate::dispatch::Dispatcher;
use crate::grpc::{GenerateStream, params, responses};
use crate::stream::Api;

/// The call this layer answers itself.
const GENERATE: &str = "/dolphin.v1.Inference/Generate";

/// A gRPC message's prefix: the compressed flag and the length.
const PREFIX: usize = 5;

/// The largest request message, as tonic's decoder allows by default (4 MiB): a longer one is
/// refused with `OUT_OF_RANGE` before it is read.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The most bytes of messages written in one DATA frame: a stream whose messages were all
/// ready at once still goes out in frames of a size h2 sends without splitting much.
const MAX_FRAME_BYTES: usize = 32 << 10;

/// Answers plain `Generate` calls itself (see the module doc), passing every other call to the
/// service below (tonic's routes).
#[derive(Clone, Debug)]
pub(crate) struct GenerateLayer(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    dispatcher: Arc<Dispatcher>,
    api_keys: Option<KeySet>,
    limit: InflightLimit,
}

impl GenerateLayer {
    /// `Generate` over `dispatcher`, for callers with one of `api_keys` (all when `None`),
    /// each holding a slot of `limit`.
    pub(crate) fn new(
        dispatcher: Arc<Dispatcher>,
        api_keys: Option<KeySet>,
        limit: InflightLimit,
    ) -> Self {
        Self(Arc::new(Shared {
            dispatcher,
            api_keys,
            limit,
        }))
    }
}

impl<S> tower::Layer<S> for GenerateLayer {
    type Service = GenerateFast<S>;

    fn layer(&self, inner: S) -> GenerateFast<S> {
        GenerateFast {
            inner,
            shared: Arc::clone(&self.0),
        }
    }
}

/// See [`GenerateLayer`].
#[derive(Clone, Debug)]
pub(crate) struct GenerateFast<S> {
    inner: S,
    shared: Arc<Shared>,
}

type Answer = Pin<Box<dyn Future<Output = http::Response<Body>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for GenerateFast<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<AnswerFuture<S::Error>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Tonic's routes are always ready and reserve nothing, so a call this layer answers
        // itself leaves nothing held below.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if !is_plain_generate(&req) {
            return Either::Right(self.inner.call(req));
        }
        let shared = Arc::clone(&self.shared);
        Either::Left(AnswerFuture {
            answer: Box::pin(async move { shared.generate(req).await }),
            _error: std::marker::PhantomData,
        })
    }
}

/// The fast path's answer, as the service's `Result` (it never fails: errors are statuses).
pub(crate) struct AnswerFuture<E> {
    answer: Answer,
    _error: std::marker::PhantomData<fn() -> E>,
}

impl<E> Future for AnswerFuture<E> {
    type Output = Result<http::Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.answer.as_mut().poll(cx).map(Ok)
    }
}

/// A `Generate` call this layer can answer: `POST`, a gRPC protobuf content type, and an
/// uncompressed message (no `grpc-encoding`, or `identity`).
fn is_plain_generate<B>(req: &http::Request<B>) -> bool {
    if req.method() != http::Method::POST || req.uri().path() != GENERATE {
        return false;
    }
    let headers = req.headers();
    let grpc_content = headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v == b"application/grpc" || v == b"application/grpc+proto"
    });
    let uncompressed = headers
        .get("grpc-encoding")
        .is_none_or(|v| v.as_bytes() == b"identity");
    grpc_content && uncompressed
}

impl Shared {
    /// Answers one call: the status as a Trailers-Only response when it fails before the
    /// stream starts, else the stream.
    async fn generate(&self, req: http::Request<Body>) -> http::Response<Body> {
        match self.start(req).await {
            Ok(response) => response,
            Err(status) => status.into_http(),
        }
    }

    async fn start(&self, req: http::Request<Body>) -> Result<http::Response<Body>, Status> {
        // First the key: a caller without one learns nothing, not even that the router is full.
        let authorization = req.headers().get("authorization").map(|v| v.as_bytes());
        if let Some(refusal) = Verdict::of(self.api_keys.as_ref(), authorization).status("API") {
            return Err(refusal);
        }
        // Then a slot, before the message is read; it travels in the answer's body.
        let permit = self.limit.try_admit(Api::Grpc)?;
        let timeout = req
            .headers()
            .get(dolphin_proto::deadline::GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(dolphin_proto::deadline::parse);
        let request = read_request(req.into_body()).await?;
        let cfg = self.dispatcher.config();
        let (mut p, tools) = params(request, &self.dispatcher)?;
        // Thinking is split from chat answers only, as over HTTP.
        let readers = crate::answer::Readers::of(
            tools.as_ref().and(cfg.reasoning_parser),
            cfg.tool_call_parser,
        );
        p.timeout = timeout;
        let stream = self.dispatcher.generate(p).await?;
        let tools = tools.unwrap_or_default();
        let mut response = http::Response::new(Body::new(GenerateBody {
            stream: responses(stream, tools, readers),
            permit: Some(permit),
            end: None,
        }));
        // What tonic's server-streaming answer carries: the content type alone.
        let mut headers = HeaderMap::with_capacity(1);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        *response.headers_mut() = headers;
        Ok(response)
    }
}

/// The request's message, decoded, with the checks and statuses of tonic's unary request
/// decoding: each message's prefix (a compressed flag without an encoding, a flag other than 0
/// or 1, a length over [`MAX_MESSAGE_BYTES`]), the first message decoded as soon as it is in
/// (its error answered at once), no message, a message cut short at the end. As tonic does, the
/// body is read to its end (or its trailers) and any further message is checked and decoded,
/// then dropped.
pub(crate) async fn read_request<B>(body: B) -> Result<v1::GenerateRequest, Status>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Status>,
{
    let mut body = std::pin::pin!(body);
    let mut reader = Reader::default();
    while let Some(frame) = body.frame().await {
        match frame.map_err(Into::into)?.into_data() {
            Ok(data) => reader.push(data)?,
            // Trailers end the request, as in tonic.
            Err(_) => return reader.finish(End::Trailers),
        }
    }
    reader.finish(End::Eos)
}

/// How a request body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The stream's end: a message cut short is an error.
    Eos,
    /// A trailers frame: tonic's decoder stops there, with what it has.
    Trailers,
}

/// The messages of a request body, gathered from DATA frames. A first message that arrives in
/// one frame (the usual case) is decoded where it lies, without a copy.
#[derive(Debug, Default)]
pub(crate) struct Reader {
    /// What has arrived of the first message and its prefix: `first` while it is one frame.
    first: Option<Bytes>,
    more: BytesMut,
    /// The first message's length with its prefix, once the prefix is in.
    total: Option<usize>,
    /// The first message, decoded.
    request: Option<v1::GenerateRequest>,
    /// Bytes after the first message not yet a whole message.
    rest: BytesMut,
}

impl Reader {
    /// Takes one DATA frame's bytes.
    pub(crate) fn push(&mut self, data: Bytes) -> Result<(), Status> {
        if self.request.is_some() {
            self.rest.extend_from_slice(&data);
            return self.drain_rest();
        }
        match self.first.take() {
            None if self.more.is_empty() => self.first = Some(data),
            None => self.more.extend_from_slice(&data),
            Some(first) => {
                self.more.extend_from_slice(&first);
                self.more.extend_from_slice(&data);
            }
        }
        if self.total.is_none() {
            self.total = message_len(self.pending())?.map(|len| PREFIX + len);
            if let Some(total) = self.total {
                self.more.reserve(total.saturating_sub(self.more.len()));
            }
        }
        let Some(total) = self.total else {
            return Ok(());
        };
        let pending = self.pending();
        if pending.len() < total {
            return Ok(());
        }
        let request = decode(&pending[PREFIX..total])?;
        let rest = BytesMut::from(&pending[total..]);
        (self.request, self.rest) = (Some(request), rest);
        (self.first, self.more) = (None, BytesMut::new());
        self.drain_rest()
    }

    /// What has arrived of the first message.
    fn pending(&self) -> &[u8] {
        self.first.as_deref().unwrap_or(&self.more)
    }

    /// Checks and drops every whole message in `rest`.
    fn drain_rest(&mut self) -> Result<(), Status> {
        while let Some(len) = message_len(&self.rest)? {
            if self.rest.len() < PREFIX + len {
                break;
            }
            decode(&self.rest[PREFIX..PREFIX + len])?;
            self.rest.advance(PREFIX + len);
        }
        Ok(())
    }

    /// The first message, once the body has ended.
    pub(crate) fn finish(self, end: End) -> Result<v1::GenerateRequest, Status> {
        let cut_short = !self.pending().is_empty() || !self.rest.is_empty();
        match (self.request, end) {
            (Some(request), End::Trailers) => Ok(request),
            (Some(request), End::Eos) if !cut_short => Ok(request),
            (None, _) if !cut_short || end == End::Trailers => {
                Err(Status::internal("Missing request message."))
            }
            _ => Err(Status::internal("Unexpected EOF decoding stream.")),
        }
    }
}

/// The length a message's prefix announces, once the prefix is in `bytes`; tonic's statuses
/// for a prefix it refuses.
fn message_len(bytes: &[u8]) -> Result<Option<usize>, Status> {
    let Some(mut prefix) = bytes.get(..PREFIX) else {
        return Ok(None);
    };
    match prefix.get_u8() {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ));
        }
        f => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
            )));
        }
    }
    let len = prefix.get_u32() as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {len} bytes, the limit is: {MAX_MESSAGE_BYTES} bytes"
        )));
    }
    Ok(Some(len))
}

/// A request message, or tonic's status for one that does not decode.
fn decode(bytes: &[u8]) -> Result<v1::GenerateRequest, Status> {
    v1::GenerateRequest::decode(bytes).map_err(|e| Status::internal(e.to_string()))
}

/// The answer's body: the response messages, each wake-up's in one DATA frame, then the
/// trailers (`grpc-status` 0, or the stream's error). Holds the request's slot of the in-flight
/// limit until the trailers are out or the client went away.
struct GenerateBody {
    stream: GenerateStream,
    permit: Option<Permit>,
    /// The trailers, once the stream has ended; `Some(None)` once they were sent.
    end: Option<Option<HeaderMap>>,
}

impl http_body::Body for GenerateBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.end.is_none() {
            let mut buf = BytesMut::new();
            while buf.len() < MAX_FRAME_BYTES {
                match this.stream.poll_next_unpin(cx) {
                    Poll::Ready(Some(Ok(msg))) => encode(&msg, &mut buf),
                    Poll::Ready(Some(Err(status))) => {
                        this.end = Some(Some(trailers(&status)));
                        break;
                    }
                    Poll::Ready(None) => {
                        this.end = Some(Some(ok_trailers()));
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if !buf.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(buf.freeze()))));
            }
        }
        match this.end.as_mut() {
            None => Poll::Pending,
            Some(end) => match end.take() {
                Some(trailers) => {
                    this.permit = None;
                    Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                }
                None => Poll::Ready(None),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.end, Some(None))
    }
}

/// Appends `msg` with its prefix (uncompressed).
fn encode(msg: &v1::GenerateResponse, buf: &mut BytesMut) {
    let len = msg.encoded_len();
    buf.reserve(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    msg.encode(buf).expect("the buffer was reserved");
}

/// A call's trailers when it succeeded: `grpc-status: 0` alone.
fn ok_trailers() -> HeaderMap {
    let mut map = HeaderMap::with_capacity(1);
    map.insert("grpc-status", HeaderValue::from_static("0"));
    map
}

/// A call's trailers for a failure's `status`.
fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(2);
    if status.add_header(&mut map).is_err() {
        // Percent-encoded messages and base64 details are always header values; should that
        // ever fail, the code alone still goes out.
        map.clear();
        let _ = Status::new(status.code(), "").add_header(&mut map);
    }
    map
}

#[cfg(test)]
#[path = "grpc_generate_tests.rs"]
mod tests;

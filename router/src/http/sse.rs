//! The body of a streamed completion: server-sent events, one `data:` event per chunk the
//! [`Encoder`] writes, `data: [DONE]` after the last, and a comment every 15 s while nothing
//! else was sent, so proxies keep an idle stream open (what axum's `Sse` with its default
//! keep-alive sends).
//!
//! Not axum's `Sse`: that builds each event through a writer that scans the data for line
//! breaks (the JSON here has none: serde_json escapes them) and resets its keep-alive timer on
//! every event; with them a streamed request cost the router about 8k instructions more than a
//! whole one. Here the events of one delta go out as one frame, and the timer is re-armed only
//! when it fires.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::completions::Encoder;
use super::error::ApiError;
use crate::error::DispatchError;
use crate::stream::{Delta, ResponseStream};

/// How long a stream may stay silent before a keep-alive comment goes out.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Typed events (`event: NAME` then `data: JSON`, the Responses and Messages APIs' way) as one
/// frame; `None` when there are none.
pub(crate) fn typed_frame<'a>(
    events: impl IntoIterator<Item = (&'a str, &'a serde_json::Value)>,
) -> Option<axum::body::Bytes> {
    let mut out = Vec::new();
    for (name, data) in events {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        // A Value always serializes.
        serde_json::to_writer(&mut out, data).unwrap_or_default();
        out.extend_from_slice(b"\n\n");
    }
    (!out.is_empty()).then(|| axum::body::Bytes::from(out))
}

/// The keep-alive comment.
const COMMENT: &[u8] = b":\n\n";

/// A response streaming `body`'s server-sent events.
pub(crate) fn event_stream(body: axum::body::Body) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let mut resp = axum::response::Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Server-sent events of one request (see the module doc): the deltas of `S`, a
/// [`ResponseStream`] but in tests.
pub(crate) struct SseBody<S = ResponseStream> {
    rs: S,
    enc: Encoder,
    /// Chunks of the current delta not yet sent.
    queue: VecDeque<String>,
    ended: bool,
    /// Fires [`KEEP_ALIVE`] after it was armed; `last_sent` says whether that was a silence.
    keep_alive: Pin<Box<Sleep>>,
    last_sent: Instant,
}

impl<S> SseBody<S> {
    pub(crate) fn new(rs: S, enc: Encoder) -> Self {
        let now = Instant::now();
        Self {
            rs,
            enc,
            queue: VecDeque::new(),
            ended: false,
            keep_alive: Box::pin(tokio::time::sleep_until(now + KEEP_ALIVE)),
            last_sent: now,
        }
    }

    /// The queued chunks as one frame of events (`None` when none is queued).
    fn events(&mut self) -> Option<Bytes> {
        if self.queue.is_empty() {
            return None;
        }
        let len = self.queue.iter().map(|c| c.len() + 8).sum();
        let mut out = Vec::with_capacity(len);
        for chunk in self.queue.drain(..) {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(chunk.as_bytes());
            out.extend_from_slice(b"\n\n");
        }
        self.last_sent = Instant::now();
        Some(Bytes::from(out))
    }
}

impl<S> Body for SseBody<S>
where
    S: Stream<Item = Result<Delta, DispatchError>> + Unpin,
{
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(events) = this.events() {
                return Poll::Ready(Some(Ok(Frame::data(events))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.rs).poll_next(cx) {
                Poll::Ready(Some(Ok(d))) => {
                    this.enc.chunks(&d, &mut this.queue);
                    // With several choices, the stream ends after the last one's end.
                    if d.finish.is_some() && this.enc.finished() {
                        this.queue.push_back("[DONE]".into());
                        this.ended = true;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.queue.push_back(ApiError::from(e).to_json());
                    this.ended = true;
                }
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => {
                    ready!(this.keep_alive.as_mut().poll(cx));
                    // The timer was armed a while ago: speak only if nothing went out for a
                    // whole interval, else re-arm it from the last event.
                    let now = Instant::now();
                    let due = this.last_sent + KEEP_ALIVE;
                    if due <= now {
                        this.last_sent = now;
                        this.keep_alive.as_mut().reset(now + KEEP_ALIVE);
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(COMMENT)))));
                    }
                    this.keep_alive.as_mut().reset(due);
                    // Polled once re-armed, so that it wakes this task when it fires.
                    if this.keep_alive.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use super::*;
    use crate::http::completions::Endpoint;

    type Deltas = futures::channel::mpsc::UnboundedReceiver<Result<Delta, DispatchError>>;

    fn body() -> (
        futures::channel::mpsc::UnboundedSender<Result<Delta, DispatchError>>,
        SseBody<Deltas>,
    ) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let enc = Encoder::new(Endpoint::Completions, "cmpl-1".into(), "m".into(), 0, false);
        (tx, SseBody::new(rx, enc))
    }

    fn delta(text: &str) -> Delta {
        Delta {
            token_ids: vec![1],
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            text: text.into(),
            finish: None,
            choice: 0,
            joins: Vec::new(),
        }
    }

    /// The next frame's data, or `None` when the body is pending.
    fn next(body: &mut SseBody<Deltas>) -> Option<Option<String>> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match Pin::new(body).poll_frame(&mut cx) {
            Poll::Pending => None,
            Poll::Ready(frame) => Some(frame.map(|f| {
                let data = f.unwrap().into_data().expect("a data frame");
                String::from_utf8(data.to_vec()).unwrap()
            })),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_gets_a_comment_every_interval_and_events_push_it_back() {
        let (tx, mut body) = body();
        assert_eq!(next(&mut body), None);
        tokio::time::advance(KEEP_ALIVE - Duration::from_secs(1)).await;
        assert_eq!(next(&mut body), None, "not yet silent for a whole interval");
        tx.unbounded_send(Ok(delta("a"))).unwrap();
        let event = next(&mut body).unwrap().unwrap();
        assert!(
            event.starts_with("data: {") && event.ends_with("}\n\n"),
            "{event}"
        );
        // The timer armed at the start fires now, but the event reset the silence.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(next(&mut body), None);
        tokio::time::advance(KEEP_ALIVE).await;
        assert_eq!(next(&mut body), Some(Some(":\n\n".into())));
        assert_eq!(next(&mut body), None);
        tokio::time::advance(KEEP_ALIVE).await;
        assert_eq!(next(&mut body), Some(Some(":\n\n".into())));
    }

    #[tokio::test]
    async fn the_events_of_one_delta_go_out_as_one_frame_and_done_ends_the_stream() {
        let (tx, mut body) = body();
        let mut last = delta("z");
        last.finish = Some(crate::stream::Finish {
            reason: dolphin_proto::v1::FinishReason::Stop,
            usage: Default::default(),
            timings: Default::default(),
            fell_back: false,
            routing: Default::default(),
            stop_sequence: None,
        });
        tx.unbounded_send(Ok(last)).unwrap();
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let text =
            String::from_utf8(frame.unwrap().unwrap().into_data().unwrap().to_vec()).unwrap();
        let events: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(events.len(), 2, "{text}");
        assert!(events[0].contains("\"finish_reason\":\"stop\""), "{text}");
        assert_eq!(events[1], "data: [DONE]");
        assert!(
            poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
                .await
                .is_none()
        );
    }

    #[tokio::test]
    async fn an_error_is_the_last_event() {
        let (tx, mut body) = body();
        tx.unbounded_send(Err(DispatchError::NoDecodeWorkers))
            .unwrap();
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let text =
            String::from_utf8(frame.unwrap().unwrap().into_data().unwrap().to_vec()).unwrap();
        assert!(text.starts_with("data: {\"error\":"), "{text}");
        assert!(
            poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
                .await
                .is_none()
        );
    }
}

//! Resumable answer streams (2025-11-25 polling): a call's messages recorded in its
//! buffer, read back as SSE events with ids, and resumed by `GET /mcp` with `Last-Event-ID`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use tokio::sync::mpsc;

use super::reject::http_error;
use super::{HttpState, ListenGuard};
use crate::metrics::Refusal;
use crate::transport::resume::{Buffer, Next, Resumable, ResumeError};

/// A resumable answer: the call runs on in a task that records what it sends in `buf`,
/// and the response reads `buf` from its start.
pub(super) fn resumable_answer<F>(
    r: &Resumable,
    buf: Arc<Buffer>,
    first: Option<Vec<u8>>,
    mut call: std::pin::Pin<Box<F>>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    deadline: std::time::Instant,
) -> Response
where
    F: std::future::Future<Output = Option<(Vec<u8>, u16)>> + Send + 'static,
{
    let options = *r.options();
    if let Some(m) = first {
        buf.push(m.into(), &options);
    }
    let recorder = buf.clone();
    tokio::spawn(async move {
        let b = recorder;
        loop {
            tokio::select! {
                biased;
                () = b.cancel.cancelled() => break,
                Some(m) = rx.recv() => b.push(m.into(), &options),
                out = &mut call => {
                    while let Ok(m) = rx.try_recv() {
                        b.push(m.into(), &options);
                    }
                    if let Some((body, _)) = out {
                        b.push(body.into(), &options);
                    }
                    break;
                }
            }
        }
        b.finish();
    });
    buffered_stream(buf, 0, options.retry, deadline, true, ())
}

/// An SSE response reading `buf` after event `after`, each event with its id, until the
/// stream ends or the poll interval has passed (then the client resumes from the last id).
/// `prime` opens it with the priming event (an id, the retry hint, empty data). A client that
/// closes it before either cancels the call. `hold` lives as long as the response.
fn buffered_stream(
    buf: Arc<Buffer>,
    after: u64,
    retry: Duration,
    deadline: std::time::Instant,
    prime: bool,
    hold: impl Send + 'static,
) -> Response {
    const KEEP_ALIVE: Duration = Duration::from_secs(15);
    buf.attach();
    let priming = prime.then(|| {
        Ok::<_, Infallible>(Bytes::from(format!(
            "id: {}\nretry: {}\ndata: \n\n",
            buf.event_id(0),
            retry.as_millis()
        )))
    });
    let reader = Reader {
        buf,
        seq: after,
        ended: false,
    };
    let events = stream::unfold((reader, hold), move |(mut r, hold)| async move {
        loop {
            match r.buf.next_after(r.seq) {
                Next::Event(seq, m) => {
                    r.seq = seq;
                    let e = sse_event(&r.buf.event_id(seq), &m);
                    return Some((Ok(e), (r, hold)));
                }
                Next::Wait => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        // The interval passed: the server ends the stream, the client resumes.
                        r.close();
                        return None;
                    }
                    if !r.buf.changed(r.seq, deadline.min(now + KEEP_ALIVE)).await
                        && std::time::Instant::now() < deadline
                    {
                        return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), (r, hold)));
                    }
                }
                // Ended, or the events sought were dropped (a resume then learns they are gone).
                Next::Done | Next::Dropped => {
                    r.close();
                    return None;
                }
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream::iter(priming).chain(events)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One SSE `message` event with its id (a line break in the message, which serialized JSON
/// never has, would continue the data on a new `data:` line).
fn sse_event(id: &str, m: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(m.len() + id.len() + 32);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\nevent: message\ndata: ");
    for (i, line) in m.split(|b| matches!(b, b'\n' | b'\r')).enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\ndata: ");
        }
        out.extend_from_slice(line);
    }
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// Reads a buffer; when its client goes away before the stream ends (not when the server
/// ends it), the call is cancelled.
struct Reader {
    buf: Arc<Buffer>,
    seq: u64,
    ended: bool,
}

impl Reader {
    /// The server ends the stream (its interval passed, or nothing more will come).
    fn close(&mut self) {
        self.ended = true;
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if self.buf.detach() && !self.ended {
            self.buf.cancel.cancel();
        }
    }
}

/// `GET /mcp` with `Last-Event-ID`: the rest of an answer stream of this session, from its
/// buffer, as a stream counted against the stream cap. 404 when the id names nothing this
/// session can resume (unknown, expired, or its events dropped), 400 when it is no id of
/// this server's.
pub(super) fn resume_stream(state: &Arc<HttpState>, r: &Resumable, last: &[u8], session: &str) -> Response {
    let (buf, after) = match r.resume(last, session) {
        Ok(x) => x,
        Err(e) => {
            let status = if e == ResumeError::Malformed {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::NOT_FOUND
            };
            return http_error(status, &e.to_string());
        }
    };
    if !state.load.streams.try_enter_detached() {
        state.server.metrics.refused(Refusal::Streams);
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open streams on this server, retry later",
        );
    }
    state.server.metrics.streams.inc();
    let o = r.options();
    let deadline = std::time::Instant::now() + o.poll_after;
    buffered_stream(buf, after, o.retry, deadline, false, ListenGuard(state.clone()))
}

//! The answer to a slow tool call: JSON, or an SSE stream when the call sends the client
//! something before its result.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::mpsc;

use super::reject::json_response;
use super::resumable::resumable_answer;
use crate::dispatch::Deferred;
use crate::peer::Peer;
use crate::transport::limits::Load;
use crate::transport::resume::Resumable;

/// Runs a slow tool call. Its answer is `application/json` unless the call sends the client
/// something first; then it is an SSE stream of those messages ending with the response.
/// Dropping the stream (the client went away) drops the call. A call the client cancelled
/// gets no response: its stream just ends. With `resume` (a session, resumable streams on),
/// a call still running after the poll interval is answered too, by a stream of
/// [`crate::transport::resume`] that the server ends and the client resumes.
pub(super) async fn answer_call(
    d: Deferred,
    held: Option<HeldPass>,
    resume: Option<(&Resumable, &str)>,
) -> Response {
    let started = std::time::Instant::now();
    let (peer, mut rx) = Peer::channel();
    let mut call = Box::pin(async move {
        let _held = held;
        d.run(Some(&peer)).await.map(|r| (r.body, r.status))
    });
    let poll = resume.map(|(r, _)| r.options().poll_after);
    let first = tokio::select! {
        biased;
        Some(m) = rx.recv() => Some(m),
        out = &mut call => match rx.try_recv() {
            Ok(m) => return sse_answer(stream::iter(std::iter::once(m)).chain(drain(rx, out.map(|(b, _)| b)))),
            Err(_) => {
                return match out {
                    Some((body, status)) => json_response(StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body),
                    None => sse_answer(stream::empty()),
                };
            }
        },
        () = sleep_or_never(poll) => None,
    };
    if let Some((r, session)) = resume
        && let Some(buf) = r.open(session)
    {
        // The interval counts from the request: a call past it ends its stream at once.
        return resumable_answer(r, buf, first, call, rx, started + r.options().poll_after);
    }
    // No place for a resumable stream: the answer streams as without them.
    let first = match first {
        Some(m) => m,
        None => tokio::select! {
            biased;
            Some(m) = rx.recv() => m,
            out = &mut call => return sse_answer(drain(rx, out.map(|(b, _)| b))),
        },
    };
    let rest = stream::unfold(Some((call, rx)), |st| async move {
        let (mut call, mut rx) = st?;
        tokio::select! {
            biased;
            Some(m) = rx.recv() => Some((stream::iter(vec![m]).left_stream(), Some((call, rx)))),
            out = &mut call => Some((drain(rx, out.map(|(b, _)| b)).right_stream(), None)),
        }
    })
    .flatten();
    sse_answer(stream::iter(std::iter::once(first)).chain(rest))
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// What is still queued, then the response (if any).
fn drain(mut rx: mpsc::Receiver<Vec<u8>>, out: Option<Vec<u8>>) -> impl Stream<Item = Vec<u8>> {
    let mut queued = Vec::new();
    while let Ok(m) = rx.try_recv() {
        queued.push(m);
    }
    stream::iter(queued.into_iter().chain(out))
}

pub(super) fn sse_answer(messages: impl Stream<Item = Vec<u8>> + Send + 'static) -> Response {
    let events = messages.map(|m| {
        Ok::<_, Infallible>(
            Event::default()
                .event("message")
                .data(String::from_utf8_lossy(&m)),
        )
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// A place in the in-flight gate held by a call that may outlive its handler.
pub(super) struct HeldPass(pub(super) Arc<Load>);

impl Drop for HeldPass {
    fn drop(&mut self) {
        self.0.inflight.release();
    }
}

//! `GET /mcp`: the server-to-client SSE stream of a session (handshake era).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::HttpState;
use super::caller::Caller;
use super::reject::{http_error, not_in_stateless};
use super::resumable::resume_stream;
use super::session::{check_session, session_id};
use crate::metrics::Refusal;

pub(super) async fn get_mcp(
    State(state): State<Arc<HttpState>>,
    caller: Caller,
    headers: HeaderMap,
) -> Response {
    if !headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"))
    {
        return http_error(
            StatusCode::NOT_ACCEPTABLE,
            "GET /mcp opens an SSE stream: Accept must include text/event-stream",
        );
    }
    match &caller.version {
        Err(r) => return r.clone().into_response(),
        Ok((_, true)) => return not_in_stateless("GET"),
        Ok(_) => {}
    }
    let session =
        match session_id(&headers).and_then(|s| check_session(&state, s, caller.principal()).map(|()| s)) {
            Ok(s) => s.to_owned(),
            Err(r) => return r.into_response(),
        };
    if let (Some(r), Some(last)) = (&state.resume, headers.get("last-event-id")) {
        return resume_stream(&state, r, last.as_bytes(), &session);
    }
    if !state.load.streams.try_enter_detached() {
        state.server.metrics.refused(Refusal::Streams);
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open streams on this server, retry later",
        );
    }
    let token = state.shutdown.child_token();
    let id = state.next_stream.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut s) = state.streams.lock() {
        s.entry(session.clone()).or_default().push((id, token.clone()));
    }
    Sse::new(event_stream(state, session, id, token))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Unregisters a GET stream when the client goes away or the stream is ended.
struct StreamGuard {
    state: Arc<HttpState>,
    session: String,
    id: u64,
    token: CancellationToken,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.state.server.metrics.streams.dec();
        self.state.load.streams.release();
        if let Ok(mut s) = self.state.streams.lock()
            && let Some(list) = s.get_mut(&self.session)
        {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                s.remove(&self.session);
            }
        }
    }
}

fn event_stream(
    state: Arc<HttpState>,
    session: String,
    id: u64,
    token: CancellationToken,
) -> impl Stream<Item = Result<Event, Infallible>> {
    state.server.metrics.streams.inc();
    let rx = state.server.subscribe();
    let guard = StreamGuard {
        state,
        session,
        id,
        token,
    };
    stream::unfold((rx, guard), move |(mut rx, guard)| {
        let token = guard.token.clone();
        async move {
            loop {
                tokio::select! {
                    () = token.cancelled() => return None,
                    msg = rx.recv() => match msg {
                        Ok(m) if m.is_for(&guard.session) => {
                            return Some((Ok(Event::default().event("message").data(&*m.message)), (rx, guard)));
                        }
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => return None,
                    },
                }
            }
        }
    })
}

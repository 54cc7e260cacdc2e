//! A 2026-07-28 `subscriptions/listen` answer: an SSE stream of the notifications it asked
//! for.

use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::stream::{self, StreamExt};
use tokio::sync::broadcast::error::RecvError;

use super::reject::http_error;
use super::sse::sse_answer;
use super::{HttpState, ListenGuard};
use crate::dispatch::Listen;
use crate::metrics::Refusal;

/// A `subscriptions/listen` answer: an SSE stream that opens with the acknowledgement and
/// carries the notifications the listen asked for, until the client closes it or the server
/// shuts down (then the listen's response ends it). Counts against the stream cap.
pub(super) fn listen_stream(state: &Arc<HttpState>, listen: Listen) -> Response {
    if !state.load.streams.try_enter_detached() {
        state.server.metrics.refused(Refusal::Streams);
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open streams on this server, retry later",
        );
    }
    state.server.metrics.streams.inc();
    let rx = state.server.subscribe();
    let ack = listen.acknowledgement();
    let token = state.shutdown.child_token();
    let guard = ListenGuard(state.clone());
    let rest = stream::unfold(Some((rx, listen, token, guard)), |st| async move {
        let (mut rx, listen, token, guard) = st?;
        loop {
            tokio::select! {
                () = token.cancelled() => {
                    let last = listen.closing();
                    return Some((last, None));
                }
                msg = rx.recv() => match msg {
                    Ok(e) => {
                        if let Some(m) = listen.wants(&e) {
                            return Some((m, Some((rx, listen, token, guard))));
                        }
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    });
    let mut resp = sse_answer(stream::iter(std::iter::once(ack)).chain(rest));
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

//! Sessions at the HTTP edge: the `Mcp-Session-Id` header, whether its session is the
//! caller's, and `DELETE /mcp` ending one.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::caller::Caller;
use super::reject::{Reject, http_error, not_in_stateless};
use super::{HttpState, SESSION_HEADER};
use crate::protocol;
use crate::spec::access::Principal;

/// The `Mcp-Session-Id` header: absent is `""`; present, it must be 1 to 128 visible ASCII
/// characters.
pub(super) fn session_id(headers: &HeaderMap) -> Result<&str, Reject> {
    let Some(v) = headers.get(SESSION_HEADER) else {
        return Ok("");
    };
    if !protocol::valid_session_id(v.as_bytes()) {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            format!(
                "Invalid Mcp-Session-Id: it must be 1 to {} visible ASCII characters",
                protocol::MAX_SESSION_ID_LEN
            ),
        ));
    }
    // Visible ASCII is valid UTF-8.
    Ok(v.to_str().unwrap_or(""))
}

/// 404 for a session that is not the caller's (another caller's, or an id no server issued)
/// and for one this server ended (DELETE): to a caller, both are unknown sessions.
pub(super) fn check_session(
    state: &HttpState,
    session: &str,
    caller: Option<&Principal>,
) -> Result<(), Reject> {
    if session.is_empty() {
        return Ok(());
    }
    if !crate::session::owned_by(session, caller.map_or("", |c| &c.subject)) {
        return Err(Reject(
            StatusCode::NOT_FOUND,
            "Session not found; initialize a new one".to_owned(),
        ));
    }
    if state.ended.ended(session) {
        Err(Reject(
            StatusCode::NOT_FOUND,
            "Session not found: it was ended; initialize a new one".to_owned(),
        ))
    } else {
        Ok(())
    }
}

pub(super) async fn delete_mcp(
    State(state): State<Arc<HttpState>>,
    caller: Caller,
    headers: HeaderMap,
) -> Response {
    if matches!(caller.version, Ok((_, true))) {
        return not_in_stateless("DELETE");
    }
    let session = match session_id(&headers) {
        Ok("") => {
            return http_error(
                StatusCode::BAD_REQUEST,
                "DELETE /mcp ends a session: Mcp-Session-Id is required",
            );
        }
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    // Another caller's session is unknown to this one: it can neither end nor touch it.
    if let Err(r) = check_session(&state, session, caller.principal()) {
        return r.into_response();
    }
    if !state.ended.end(session) {
        return StatusCode::NO_CONTENT.into_response();
    }
    let tokens = state
        .streams
        .lock()
        .ok()
        .and_then(|mut s| s.remove(session))
        .unwrap_or_default();
    for (_, t) in tokens {
        t.cancel();
    }
    state.server.sessions.close(session);
    StatusCode::NO_CONTENT.into_response()
}

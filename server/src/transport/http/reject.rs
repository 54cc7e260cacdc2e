//! Refusals the HTTP layer writes itself, before or instead of dispatch: a status with a
//! JSON-RPC error body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::protocol::{self, INVALID_REQUEST};

/// A request refused before dispatch: an HTTP status and a JSON-RPC error body.
#[derive(Clone)]
pub(super) struct Reject(pub(super) StatusCode, pub(super) String);

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        http_error(self.0, &self.1)
    }
}

impl Reject {
    /// The refusal naming the request's id when the body shows it.
    pub(super) fn for_body(self, body: &[u8]) -> Response {
        http_error_for(protocol::peek_id(body), self.0, &self.1)
    }
}

pub(super) fn http_error(status: StatusCode, message: &str) -> Response {
    http_error_for(None, status, message)
}

fn http_error_for(id: Option<&serde_json::value::RawValue>, status: StatusCode, message: &str) -> Response {
    json_response(status, protocol::error_response(id, INVALID_REQUEST, message))
}

/// An error after which the connection is closed (the rest of the body is not read).
pub(super) fn http_error_close(status: StatusCode, message: &str) -> Response {
    let mut resp = http_error(status, message);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// An `application/json` answer.
pub(super) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
        .into_response()
}

/// 405 for the handshake era's GET stream and DELETE under 2026-07-28.
pub(super) fn not_in_stateless(method: &str) -> Response {
    let mut resp = http_error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("{method} /mcp is not part of protocol 2026-07-28 (use subscriptions/listen)"),
    );
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    resp
}

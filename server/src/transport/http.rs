//! MCP Streamable HTTP at `/mcp`: POST answers with `application/json`, GET opens the
//! server-to-client SSE stream (`notifications/*/list_changed`), DELETE ends a session.
//!
//! Stateless by default: a session id is issued on `initialize` (clients need one to open
//! the GET stream) but no request depends on server-side session state, so any replica can
//! answer any request and unknown session ids are accepted.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::stream::{self, Stream};
use rustc_hash::FxHashMap;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::dispatch::{Ctx, Server};
use crate::protocol::{self, INVALID_REQUEST};

/// Session id header.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// Protocol version header.
pub const VERSION_HEADER: &str = "mcp-protocol-version";

/// Options of the HTTP transport.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Origins allowed besides loopback ones (`http://localhost[:port]`, `http://127.0.0.1[:port]`,
    /// `http://[::1][:port]`). `*` allows every origin.
    pub allowed_origins: Vec<String>,
    /// Requests handled at once; excess requests get 503 immediately.
    pub max_concurrency: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            allowed_origins: Vec::new(),
            max_concurrency: 4096,
        }
    }
}

/// Shared state of the HTTP transport.
#[derive(Debug)]
pub struct HttpState {
    server: Arc<Server>,
    options: HttpOptions,
    streams: Mutex<FxHashMap<String, Vec<(u64, CancellationToken)>>>,
    next_stream: AtomicU64,
    shutdown: CancellationToken,
}

impl HttpState {
    /// State for `app`.
    pub fn new(server: Arc<Server>, options: HttpOptions, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            server,
            options,
            streams: Mutex::new(FxHashMap::default()),
            next_stream: AtomicU64::new(0),
            shutdown,
        })
    }
}

/// The `/mcp` router.
pub fn app(state: Arc<HttpState>) -> Router {
    let limit = state.options.max_body_bytes;
    let concurrency = state.options.max_concurrency;
    Router::new()
        .route("/mcp", post(post_mcp).get(get_mcp).delete(delete_mcp))
        .layer(DefaultBodyLimit::max(limit))
        .layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(
                    |_: tower::BoxError| async {
                        http_error(StatusCode::SERVICE_UNAVAILABLE, "server overloaded, retry later")
                    },
                ))
                .load_shed()
                .concurrency_limit(concurrency),
        )
        .with_state(state)
}

/// A request refused before dispatch: an HTTP status and a JSON-RPC error body.
struct Reject(StatusCode, String);

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        http_error(self.0, &self.1)
    }
}

fn http_error(status: StatusCode, message: &str) -> Response {
    let body = protocol::error_response(None, INVALID_REQUEST, message);
    (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
        .into_response()
}

fn is_loopback_origin(origin: &str) -> bool {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    let host = if rest.starts_with('[') {
        rest.split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default()
    } else {
        rest.split(':').next().unwrap_or("").to_owned()
    };
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

fn check_origin(state: &HttpState, headers: &HeaderMap) -> Result<(), Reject> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let allowed = is_loopback_origin(origin)
        || state
            .options
            .allowed_origins
            .iter()
            .any(|a| a == "*" || a == origin);
    if allowed {
        Ok(())
    } else {
        Err(Reject(
            StatusCode::FORBIDDEN,
            format!("Origin {origin} is not allowed"),
        ))
    }
}

fn accepts(headers: &HeaderMap, wanted: &str) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let family = wanted.split('/').next().unwrap_or("");
    accept
        .split(',')
        .map(|part| part.split(';').next().unwrap_or("").trim())
        .any(|t| t == wanted || t == "*/*" || t.strip_suffix("/*") == Some(family))
}

fn version(headers: &HeaderMap) -> Result<&'static str, Reject> {
    match headers.get(VERSION_HEADER) {
        None => Ok(protocol::DEFAULT_HTTP_VERSION),
        Some(v) => v.to_str().ok().and_then(protocol::supported).ok_or_else(|| {
            Reject(
                StatusCode::BAD_REQUEST,
                format!(
                    "Unsupported MCP-Protocol-Version {:?}; supported: {}",
                    v,
                    protocol::SUPPORTED_VERSIONS.join(", ")
                ),
            )
        }),
    }
}

fn new_session_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // Unreachable on Linux; fall back to a time-derived id rather than failing initialize.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b = t.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn post_mcp(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if let Err(r) = check_origin(&state, &headers) {
        return r.into_response();
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !is_json {
        return http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        );
    }
    if !accepts(&headers, "application/json") {
        return http_error(StatusCode::NOT_ACCEPTABLE, "Accept must allow application/json");
    }
    let version = match version(&headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body exceeds {} bytes", state.options.max_body_bytes),
            );
        }
        Err(e) => return http_error(e.status(), &e.body_text()),
    };
    let session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ctx = Ctx { session, version };
    let handled = state.server.handle(&body, ctx, version == "2025-03-26").await;
    let Some(out) = handled.body else {
        return StatusCode::ACCEPTED.into_response();
    };
    let status = if handled.malformed {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let mut resp = (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        out,
    )
        .into_response();
    if handled.initialized
        && let Ok(v) = HeaderValue::from_str(&if session.is_empty() {
            new_session_id()
        } else {
            session.to_owned()
        })
    {
        resp.headers_mut().insert(SESSION_HEADER, v);
    }
    resp
}

async fn get_mcp(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if let Err(r) = check_origin(&state, &headers) {
        return r.into_response();
    }
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
    if let Err(r) = version(&headers) {
        return r.into_response();
    }
    let session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
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
                        Ok(m) => return Some((Ok(Event::default().event("message").data(&*m)), (rx, guard))),
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => return None,
                    },
                }
            }
        }
    })
}

async fn delete_mcp(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if let Err(r) = check_origin(&state, &headers) {
        return r.into_response();
    }
    let Some(session) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
        return http_error(
            StatusCode::BAD_REQUEST,
            "DELETE /mcp ends a session: Mcp-Session-Id is required",
        );
    };
    let tokens = state
        .streams
        .lock()
        .ok()
        .and_then(|mut s| s.remove(session))
        .unwrap_or_default();
    for (_, t) in tokens {
        t.cancel();
    }
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins() {
        assert!(is_loopback_origin("http://localhost:3000"));
        assert!(is_loopback_origin("http://127.0.0.1"));
        assert!(is_loopback_origin("http://[::1]:8080"));
        assert!(!is_loopback_origin("http://evil.example"));
        assert!(!is_loopback_origin("http://localhost.evil.example"));
    }
}

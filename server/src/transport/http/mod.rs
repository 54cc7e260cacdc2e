//! MCP Streamable HTTP at `/mcp`: POST answers with `application/json`, or with an SSE stream
//! when a tool call sends the client something before its result (progress, log messages,
//! sampling and elicitation requests); GET opens the server-to-client SSE stream
//! (`notifications/*/list_changed`, `notifications/resources/updated`); DELETE ends a session.
//!
//! Stateless by default: a session id is issued on `initialize` (clients need one to open
//! the GET stream) but no request depends on server-side session state, so any replica can
//! answer any request. A session id is the server's and bound to the caller it was issued to
//! ([`crate::session::mint`]): one this replica never saw is accepted from that caller, any
//! other (another caller's, or made up) is a 404 like an unknown session; a malformed one,
//! empty or not visible ASCII, is a 400. Request bodies are read against a size cap and a deadline; the
//! accept loop in [`super::listen`] bounds connections and header time.
//!
//! This module holds the options, the shared state and the router; each route and each
//! check is a child module. The MCP listener serves [`Mcp`], which answers `POST /mcp`
//! without the router and hands every other request to it.

mod caller;
pub mod card;
mod lean;
mod metadata;
mod mirror;
mod origin;
mod post;
mod reject;
mod resumable;
mod session;
mod sign_in;
mod sse;
mod stream;
mod subscription;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Response;
use axum::routing::{get, post};
use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

use super::limits::Load;
use super::resume::{Resumable, ResumeOptions};
use super::sessions::EndedSessions;
use crate::dispatch::Server;

pub use lean::Mcp;

/// Session id header. A `HeaderName`, not text: looking a header up by text parses and checks
/// the name on every request.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
/// Protocol version header.
pub const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// The 2026-07-28 method and name mirrors of a request's body.
pub(super) const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");
pub(super) const NAME_HEADER: HeaderName = HeaderName::from_static("mcp-name");

/// Options of the HTTP transport.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Origins allowed besides loopback ones (`http://localhost[:port]`, `http://127.0.0.1[:port]`,
    /// `http://[::1][:port]`). `*` allows every origin.
    pub allowed_origins: Vec<String>,
    /// `Host` header values accepted (`host` or `host:port`, `*` for any) besides loopback
    /// names; `None` accepts every host. A browser page on an attacker's domain that resolves
    /// to 127.0.0.1 (DNS rebinding) sends its own domain as `Host`, which this refuses.
    pub allowed_hosts: Option<Vec<String>>,
    /// POST requests dispatched at once; excess requests get 503 immediately.
    pub max_concurrency: usize,
    /// Open GET (SSE) streams; excess streams get 503.
    pub max_streams: usize,
    /// Connections to the MCP port (the accept loop's cap; see [`super::listen`]).
    pub max_connections: usize,
    /// Time for a whole request body to arrive once the headers are in; then 408.
    pub body_read_timeout: Duration,
    /// Client authentication; `None` serves every caller that passes the Origin and Host checks.
    pub auth: Option<Arc<super::auth::Auth>>,
    /// Resumable answer streams (2025-11-25 polling with `Last-Event-ID`); `None`: off.
    pub resume: Option<ResumeOptions>,
    /// Proxies whose `X-Forwarded-For` names the client a caller without credentials is
    /// counted by; from any other peer the header is ignored.
    pub trusted_proxies: super::forwarded::TrustedProxies,
    /// The server card (`--server-card-name`); `None`: no card, no AI Catalog.
    pub card: Option<Arc<card::CardOptions>>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            allowed_origins: Vec::new(),
            allowed_hosts: None,
            max_concurrency: 4096,
            max_streams: 1024,
            max_connections: 10_000,
            body_read_timeout: Duration::from_secs(30),
            auth: None,
            resume: None,
            trusted_proxies: super::forwarded::TrustedProxies::default(),
            card: None,
        }
    }
}

/// Shared state of the HTTP transport.
#[derive(Debug)]
pub struct HttpState {
    server: Arc<Server>,
    options: HttpOptions,
    load: Arc<Load>,
    streams: Mutex<FxHashMap<String, Vec<(u64, CancellationToken)>>>,
    next_stream: AtomicU64,
    ended: EndedSessions,
    shutdown: CancellationToken,
    resume: Option<Resumable>,
}

impl HttpState {
    /// State for `app`. Cancelling `shutdown` ends every GET stream.
    pub fn new(server: Arc<Server>, options: HttpOptions, shutdown: CancellationToken) -> Arc<Self> {
        let load = Load::new(
            options.max_connections,
            options.max_concurrency,
            options.max_streams,
        );
        let resume = options.resume.map(Resumable::new);
        Arc::new(Self {
            server,
            options,
            load,
            streams: Mutex::new(FxHashMap::default()),
            next_stream: AtomicU64::new(0),
            ended: EndedSessions::default(),
            shutdown,
            resume,
        })
    }

    /// The capacity of this transport (for the accept loop and `/readyz`).
    pub fn load(&self) -> Arc<Load> {
        self.load.clone()
    }
}

/// The `/mcp` router.
pub fn app(state: Arc<HttpState>) -> Router {
    Router::new()
        .route(
            "/mcp",
            post(post::post_mcp)
                .get(stream::get_mcp)
                .delete(session::delete_mcp),
        )
        .route(
            "/.well-known/oauth-protected-resource",
            get(metadata::protected_resource),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(metadata::protected_resource),
        )
        .route(
            "/mcp/server-card",
            get(card::server_card).options(card::preflight),
        )
        .route(
            "/.well-known/ai-catalog.json",
            get(card::catalog).options(card::preflight),
        )
        .route("/oauth/start", get(sign_in::start))
        .route("/oauth/callback", get(sign_in::callback))
        .route("/oauth/client.json", get(sign_in::client_metadata))
        .layer(axum::middleware::map_response_with_state(
            state.clone(),
            close_when_draining,
        ))
        .with_state(state)
}

/// While the server drains (after SIGTERM, during `--shutdown-delay`), every response tells
/// the client to close its connection: each keep-alive connection moves to a new one, which
/// the Service sends to a pod that is not stopping, before this pod closes its idle
/// connections (a request racing such a close is the one a client could lose).
async fn close_when_draining(State(state): State<Arc<HttpState>>, mut resp: Response) -> Response {
    close_if_draining(&state, &mut resp);
    resp
}

/// `Connection: close` on `resp` while the server drains (see `close_when_draining`).
fn close_if_draining(state: &HttpState, resp: &mut Response) {
    if state.load.draining() {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// Releases the place of a stream counted against the stream cap (a `subscriptions/listen`
/// stream, a resumed answer) when it ends.
struct ListenGuard(Arc<HttpState>);

impl Drop for ListenGuard {
    fn drop(&mut self) {
        self.0.server.metrics.streams.dec();
        self.0.load.streams.release();
    }
}

/// A transport over an empty registry, for the tests of this folder's modules: one that
/// authenticates its clients (`auth`, accepting no credential) or not, with `edit` applied to
/// its options.
#[cfg(test)]
fn test_state(auth: bool, edit: impl FnOnce(&mut HttpOptions)) -> Arc<HttpState> {
    let metrics = crate::metrics::Metrics::new("test", "system");
    let server = crate::dispatch::Server::new(crate::registry::Registry::new(&metrics), metrics);
    let mut options = HttpOptions {
        auth: auth.then(|| {
            Arc::new(crate::transport::auth::Auth {
                bearer: None,
                oidc: None,
            })
        }),
        ..HttpOptions::default()
    };
    edit(&mut options);
    HttpState::new(server, options, tokio_util::sync::CancellationToken::new())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::StatusCode;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn every_mcp_route_checks_origin_and_host_before_anything_else() {
        let metrics = crate::metrics::Metrics::new("test", "system");
        let server = Server::new(crate::registry::Registry::new(&metrics), metrics);
        let options = HttpOptions {
            allowed_hosts: Some(vec!["mcp.example".into()]),
            ..HttpOptions::default()
        };
        let app = app(HttpState::new(server, options, CancellationToken::new()));
        let routes = [
            ("POST", "/mcp"),
            ("GET", "/mcp"),
            ("DELETE", "/mcp"),
            ("GET", "/.well-known/oauth-protected-resource"),
        ];
        for (method, path) in routes {
            let req = |host: &str, origin: Option<&str>| {
                let mut b = axum::http::Request::builder()
                    .method(method)
                    .uri(path)
                    .header(header::HOST, host);
                if let Some(o) = origin {
                    b = b.header(header::ORIGIN, o);
                }
                // Nothing else about the request is right: the checks answer first.
                b.body(Body::from("not json")).unwrap()
            };
            for (host, origin, want) in [
                ("evil.example", None, StatusCode::FORBIDDEN),
                ("localhost:1@evil.example", None, StatusCode::BAD_REQUEST),
                ("mcp.example", Some("http://evil.example"), StatusCode::FORBIDDEN),
            ] {
                let resp = app.clone().oneshot(req(host, origin)).await.unwrap();
                assert_eq!(
                    resp.status(),
                    want,
                    "{method} {path} host {host} origin {origin:?}"
                );
            }
            let allowed = app
                .clone()
                .oneshot(req("mcp.example", Some("http://localhost:3000")))
                .await
                .unwrap();
            assert_ne!(allowed.status(), StatusCode::FORBIDDEN, "{method} {path}");
        }
    }
}

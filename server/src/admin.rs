//! The admin listener: `/metrics`, `/healthz`, `/readyz`, `/status`, `/pins` (pinned tool
//! definitions, read only), and `DELETE /oauth/tokens` (an administrator revoking a user's
//! upstream sign-ins). Kept off the MCP port so probes and scrapes never queue behind tool
//! calls.

use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{delete, get};
use serde_json::json;

use crate::dispatch::Server;
use crate::transport::limits::Load;
use crate::transport::listen::ConnOptions;
use crate::tuning::Tuning;

/// Connections the admin listener takes at once (probes and scrapes need a handful); its
/// descriptors are part of the headroom kept out of the MCP connection cap.
pub const MAX_CONNECTIONS: usize = 64;

/// Header-read (and keep-alive idle) timeout of the admin listener.
pub const CONN_OPTIONS: ConnOptions = ConnOptions {
    header_read_timeout: std::time::Duration::from_secs(5),
    // Probes and scrapers speak HTTP/1.1; HTTP/2's stalled-reader hold on connections must
    // never reach the port the kubelet's probes need.
    http2: false,
};

/// State of the admin router.
#[derive(Debug)]
pub struct AdminState {
    /// The MCP server.
    pub server: Arc<Server>,
    /// Where the config comes from (for `/status`).
    pub source: String,
    /// Worker and pinning facts.
    pub tuning: Tuning,
    /// Process start.
    pub started: Instant,
    /// Capacity of the MCP port: `/readyz` fails while it is saturated or draining.
    pub load: Arc<Load>,
    /// Client authentication on `/mcp` (`none` or `bearer`).
    pub auth: &'static str,
}

/// The admin router.
pub fn app(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/oauth/tokens", delete(revoke))
        .route("/pins", get(pins))
        .with_state(state)
}

async fn metrics(State(s): State<Arc<AdminState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.server.metrics.encode(),
    )
        .into_response()
}

/// Ready when a config is loaded and the MCP port can take more work: not shutting down,
/// connections and in-flight requests below their caps.
async fn readyz(State(s): State<Arc<AdminState>>) -> Response {
    if !s.server.registry.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, "no tool config loaded yet").into_response();
    }
    match s.load.unready_reason() {
        None => (StatusCode::OK, "ready").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

/// `DELETE /oauth/tokens?subject=ISS%7CSUB[&upstream=NAME]`: forgets the upstream tokens
/// the user `ISS|SUB` (the issuer and `sub` of their access tokens) holds, for one upstream
/// or all; answers `{"removed": N}`. 404 when the server has no upstream sign-in.
async fn revoke(State(s): State<Arc<AdminState>>, RawQuery(q): RawQuery) -> Response {
    let Some(sign_in) = s.server.exec.identity.sign_in() else {
        return (StatusCode::NOT_FOUND, "this server has no upstream sign-in").into_response();
    };
    let params = crate::oauth::flow::parse_query(q.as_deref().unwrap_or_default()).unwrap_or_default();
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let subject =
        get("subject").filter(|s| s.contains('|') && s.len() <= 1024 && !s.chars().any(char::is_control));
    let Some(subject) = subject else {
        return (
            StatusCode::BAD_REQUEST,
            "want ?subject=ISS|SUB (the user's issuer and sub, `|` written %7C) and optionally &upstream=NAME",
        )
            .into_response();
    };
    let upstream = get("upstream").filter(|u| !u.is_empty());
    if upstream.is_some_and(|u| u.len() > 63) {
        return (StatusCode::BAD_REQUEST, "not an upstream name").into_response();
    }
    let upstreams = s.server.exec.upstreams.user_identities();
    match sign_in.revoke(subject, upstream, &upstreams).await {
        Ok(n) => Json(json!({"removed": n})).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

/// `GET /pins`: the pinned tool definitions of every pinned upstream (approved, pending),
/// where they are kept, and the served names held back.
async fn pins(State(s): State<Arc<AdminState>>) -> Json<serde_json::Value> {
    Json(s.server.exec.upstreams.pins.report())
}

async fn status(State(s): State<Arc<AdminState>>) -> Json<serde_json::Value> {
    // Readiness first: the snapshot read after it is at least the one that made the server
    // ready (it is stored before readiness is set), so `ready` never comes with the empty
    // snapshot of before the first load.
    let ready = s.server.registry.is_ready();
    let snap = s.server.registry.load();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "ready": ready,
        "source": s.source,
        "generation": snap.generation,
        "configHash": snap.hash,
        "tools": snap.tools.len(),
        "resources": snap.config.resources.len(),
        "prompts": snap.config.prompts.len(),
        "loadedAtUnix": snap.loaded_at.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "lastReload": s.server.registry.last_reload(),
        // Names and whether each was read; never a value.
        "secrets": s.server.exec.secrets.status(),
        "upstreams": s.server.exec.upstreams.status(),
        "auth": s.auth,
        // What stdio upstreams and exec tools are kept from.
        "childIsolation": crate::sys::sandbox::policy().status(),
        "uptimeSeconds": s.started.elapsed().as_secs(),
        "tuning": s.tuning,
        "load": {
            "draining": s.load.draining(),
            "connections": s.load.connections.open(),
            "maxConnections": s.load.connections.max(),
            "inflight": s.load.inflight.current(),
            "maxInflight": s.load.inflight.max(),
            "streams": s.load.streams.current(),
            "maxStreams": s.load.streams.max(),
        },
    }))
}

//! The routes of each user's own sign-in to upstreams, on the MCP listener (browsers reach
//! them through the same Ingress or HTTPRoute as `/mcp`): `GET /oauth/start`,
//! `GET /oauth/callback` and `GET /oauth/client.json`. What they do is
//! [`crate::oauth::sign_in`]; this module turns its pages into responses that no cache keeps,
//! that send no `Referer` on, and that load nothing. 404 when the server has no sign-in.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::HttpState;
use crate::oauth::sign_in::{Page, SignIn};
use crate::spec::identity::{Identity, IdentityMode};

/// Longest `Cookie` header read.
const MAX_COOKIE_HEADER: usize = 16 << 10;

fn sign_in(state: &HttpState) -> Option<&Arc<SignIn>> {
    state.server.exec.identity.sign_in()
}

/// The identity of the upstream `name` in the configuration in force, if it signs users in.
fn lookup(state: &HttpState, name: &str) -> Option<Identity> {
    let snap = state.server.registry.load();
    snap.upstreams
        .iter()
        .find(|l| l.name == name)
        .and_then(|l| l.identity())
        .filter(|i| i.mode == IdentityMode::User)
        .cloned()
}

/// The headers every sign-in answer carries.
fn guarded(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
    );
    resp
}

fn respond(page: Page) -> Response {
    let status = StatusCode::from_u16(page.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page.body,
    )
        .into_response();
    let h = resp.headers_mut();
    if let Some(loc) = page.location.and_then(|l| HeaderValue::try_from(l).ok()) {
        h.insert(header::LOCATION, loc);
    }
    for c in page.cookies {
        if let Ok(v) = HeaderValue::try_from(c) {
            h.append(header::SET_COOKIE, v);
        }
    }
    guarded(resp)
}

fn not_here() -> Response {
    guarded((StatusCode::NOT_FOUND, "not found").into_response())
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::COOKIE)
        .filter(|v| v.len() <= MAX_COOKIE_HEADER)
        .and_then(|v| v.to_str().ok())
}

/// `GET /oauth/start?t=TICKET`: the link a call answered with.
pub(super) async fn start(State(state): State<Arc<HttpState>>, RawQuery(q): RawQuery) -> Response {
    let Some(s) = sign_in(&state) else {
        return not_here();
    };
    let find = |name: &str| lookup(&state, name);
    respond(s.start(q.as_deref().unwrap_or_default(), &find).await)
}

/// `GET /oauth/callback`: back from the client-facing issuer or an upstream's authorization
/// server.
pub(super) async fn callback(
    State(state): State<Arc<HttpState>>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let Some(s) = sign_in(&state) else {
        return not_here();
    };
    let find = |name: &str| lookup(&state, name);
    respond(
        s.callback(q.as_deref().unwrap_or_default(), cookie(&headers), &find)
            .await,
    )
}

/// `GET /oauth/client.json`: the Client ID Metadata Document (only when the URL is https: its
/// URL is the client id).
pub(super) async fn client_metadata(State(state): State<Arc<HttpState>>) -> Response {
    match sign_in(&state).and_then(|s| s.client_metadata()) {
        Some(doc) => {
            let mut resp = axum::Json(doc).into_response();
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
            resp
        }
        None => not_here(),
    }
}

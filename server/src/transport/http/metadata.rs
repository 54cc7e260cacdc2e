//! `/.well-known/oauth-protected-resource[/mcp]`: the protected-resource metadata document
//! (RFC 9728).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::HttpState;
use super::origin::Allowed;

/// `/.well-known/oauth-protected-resource[/mcp]`: where clients learn which authorization
/// server issues tokens for this endpoint (RFC 9728). 404 unless an issuer is configured.
/// The Origin and Host checks of `/mcp` apply (it is the first thing a client reads), and the
/// document names the resource from configuration, never from the request's Host.
pub(super) async fn protected_resource(State(state): State<Arc<HttpState>>, _: Allowed) -> Response {
    let snap = state.server.registry.load();
    let scopes: Vec<&str> = snap.scopes.iter().map(AsRef::as_ref).collect();
    match state
        .options
        .auth
        .as_ref()
        .and_then(|a| a.metadata(state.options.allowed_hosts.as_deref(), &scopes))
    {
        Some(doc) => {
            let mut resp = axum::Json(doc).into_response();
            // Browser-based clients read it from another origin.
            resp.headers_mut()
                .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            resp
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

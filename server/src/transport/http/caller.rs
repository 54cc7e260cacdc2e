//! The [`Caller`] extractor of every `/mcp` route: Origin and Host allowed, credentials
//! accepted, and the protocol revision its `MCP-Protocol-Version` names.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::reject::{Reject, http_error};
use super::{HttpState, VERSION_HEADER};
use crate::metrics::Refusal;
use crate::protocol;
use crate::spec::access::Principal;

/// The caller of an `/mcp` request, checked before anything else is read: its Origin and
/// Host are allowed ([`super::origin::Allowed`]) and its credentials accepted. Carries who it is and what
/// its credentials grant, and the protocol revision its `MCP-Protocol-Version` names (each
/// route answers a version it does not speak in its own way and order).
pub(crate) struct Caller {
    /// What the caller's credentials grant; `None` when the server does not authenticate
    /// clients.
    pub(super) principal: Option<Arc<Principal>>,
    /// The revision the request names, and whether it is the stateless one (2026-07-28).
    pub(super) version: Result<(&'static str, bool), Reject>,
    /// The address a caller without credentials is counted by (`None` for one with
    /// credentials, whose subject counts, and without a socket).
    pub(super) client: Option<crate::limits::ClientAddr>,
}

impl Caller {
    pub(super) fn principal(&self) -> Option<&Principal> {
        self.principal.as_deref()
    }
}

impl Caller {
    /// The checks of [`Caller`], in their order: Origin and Host, then credentials; the
    /// refusal as a response. Both the router's extractor and the lean `POST /mcp` path
    /// ([`super::lean`]) call this, so the two cannot drift apart.
    pub(super) async fn check(state: &HttpState, headers: &HeaderMap) -> Result<Self, Response> {
        super::origin::allowed(state, headers).map_err(IntoResponse::into_response)?;
        let principal = match &state.options.auth {
            None => None,
            Some(auth) => match crate::otel::spans::auth(headers, auth.check(headers)).await {
                Ok(p) => Some(p),
                Err(denied) => {
                    state.server.metrics.refused(Refusal::Unauthenticated);
                    state.server.audit_unauthenticated(denied.message());
                    let mut resp = http_error(StatusCode::UNAUTHORIZED, denied.message());
                    let metadata = auth.metadata_url(state.options.allowed_hosts.as_deref());
                    resp.headers_mut()
                        .insert(header::WWW_AUTHENTICATE, denied.challenge(metadata.as_deref()));
                    return Err(resp);
                }
            },
        };
        // Only a caller without credentials is counted by its address.
        let client = match principal {
            Some(_) => None,
            None => crate::transport::listen::peer().map(|peer| {
                crate::limits::ClientAddr::of(state.options.trusted_proxies.client(peer, headers))
            }),
        };
        Ok(Self {
            principal,
            version: version(headers),
            client,
        })
    }
}

impl FromRequestParts<Arc<HttpState>> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<HttpState>) -> Result<Self, Response> {
        Self::check(state, &parts.headers).await
    }
}

/// The revision a request names in `MCP-Protocol-Version`, and whether it is the stateless
/// one (2026-07-28). Absent: 2025-03-26 (clients before 2025-06-18 did not send it).
fn version(headers: &HeaderMap) -> Result<(&'static str, bool), Reject> {
    let Some(v) = headers.get(VERSION_HEADER) else {
        return Ok((protocol::DEFAULT_HTTP_VERSION, false));
    };
    let text = v.to_str().unwrap_or("");
    if let Some(m) = protocol::stateless(text) {
        return Ok((m, true));
    }
    protocol::supported(text).map(|l| (l, false)).ok_or_else(|| {
        Reject(
            StatusCode::BAD_REQUEST,
            format!(
                "Unsupported MCP-Protocol-Version {v:?}; supported: {}",
                protocol::ALL_VERSIONS.join(", ")
            ),
        )
    })
}

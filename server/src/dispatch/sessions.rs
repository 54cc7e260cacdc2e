//! The sessions and cancellation family: `initialize` and `ping` (handshake era),
//! `server/discover` and `subscriptions/listen` (2026-07-28), and the notifications a
//! client sends (`notifications/cancelled`).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::envelope::parse_params;
use super::error::RpcError;
use super::listen::{Listen, ListenFilter, ListenRegistration, MAX_LISTEN_URIS};
use super::request::{Done, Request};
use super::server::{Ctx, Server};
use crate::protocol;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeParams<'a> {
    #[serde(borrow)]
    protocol_version: Cow<'a, str>,
    #[serde(borrow, default)]
    capabilities: Option<&'a RawValue>,
}

/// `subscriptions/listen` params.
#[derive(Deserialize)]
struct ListenParams {
    #[serde(default)]
    notifications: Option<ListenFilter>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelParams<'a> {
    #[serde(borrow)]
    request_id: &'a RawValue,
}

/// `initialize`: the server's capabilities in the revision agreed; dispatch then opens the
/// session with what the client declared.
pub(super) fn initialize(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: InitializeParams<'_> = parse_params(req.params)?;
    let version = protocol::supported(&p.protocol_version).unwrap_or(protocol::LATEST_VERSION);
    protocol::write_result(out, req.id, s.registry.load().initialize_result(version));
    let mut caps = crate::dispatch::stateless::client_caps(p.capabilities);
    caps.core_tasks = version == crate::registry::CORE_TASKS_VERSION;
    Ok(Done::Initialized(caps))
}

/// `ping`.
pub(super) fn ping(_: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    protocol::write_result(out, req.id, b"{}");
    Ok(Done::Written)
}

/// `server/discover` (2026-07-28): what `initialize` told, with cache hints.
pub(super) fn discover(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let snap = s.registry.load();
    let mut result = snap.discover.to_vec();
    result.pop();
    result.extend_from_slice(&crate::dispatch::stateless::cache_fields(s.limits.cache_ttl_ms));
    result.push(b'}');
    protocol::write_result(out, req.id, &result);
    Ok(Done::Written)
}

/// `subscriptions/listen` (2026-07-28): a stream of the notifications asked for. In a
/// session (stdio), `notifications/cancelled` naming the request ends it.
pub(super) fn listen(s: &Server, req: &Request<'_>, _: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: ListenParams = parse_params(req.params)?;
    let filter = p.notifications.unwrap_or_default();
    if filter.resource_subscriptions.len() > MAX_LISTEN_URIS {
        return Err(RpcError::invalid_params(format!(
            "Invalid params: a listen may watch at most {MAX_LISTEN_URIS} resources"
        )));
    }
    if let Some(u) = filter
        .resource_subscriptions
        .iter()
        .find(|u| u.len() > crate::session::MAX_URI_BYTES)
    {
        return Err(RpcError::invalid_params(format!(
            "Invalid params: a resource URI is longer than {} bytes ({}...)",
            crate::session::MAX_URI_BYTES,
            u.chars().take(32).collect::<String>()
        )));
    }
    let snap = s.registry.load();
    for uri in &filter.resource_subscriptions {
        super::resources::watch_upstream(s, req, &snap, uri)?;
    }
    let registration = (!filter.resource_subscriptions.is_empty())
        .then(|| ListenRegistration::new(&s.watched, &filter.resource_subscriptions));
    let cancel = (!req.ctx.session.is_empty()).then(|| {
        let token = CancellationToken::new();
        let entry = s.cancels.register(req.ctx.session, req.id, &token);
        (token, entry)
    });
    Ok(Done::Listen(Listen {
        id: req.id.to_owned(),
        filter,
        registration,
        cancel,
    }))
}

/// A notification from the client. `notifications/cancelled` cancels the named request of
/// the same session; sessionless calls are never registered, so a sessionless cancel has
/// nothing to match (one client must not cancel another's call by guessing its request id).
pub(super) fn notification(s: &Server, method: &str, params: Option<&RawValue>, ctx: Ctx<'_>) {
    if method == "notifications/cancelled"
        && !ctx.session.is_empty()
        && let Some(p) = params.and_then(|p| serde_json::from_str::<CancelParams<'_>>(p.get()).ok())
    {
        s.cancels.cancel(ctx.session, p.request_id);
    }
}

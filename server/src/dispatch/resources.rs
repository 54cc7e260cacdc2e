//! The resources family: lists, `resources/read`, the handshake era's subscriptions, and
//! telling subscribers and listens what a reload changed.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::envelope::parse_params;
use super::error::RpcError;
use super::request::{Done, Request, Waiting};
use super::server::{Event, EventKind, Server};
use super::tools::page;
use crate::config::ResourceKind;
use crate::protocol::{self, INTERNAL_ERROR, INVALID_PARAMS, RESOURCE_NOT_FOUND};
use crate::registry::{ListKind, Snapshot};
use crate::upstream::CallError;

#[derive(Deserialize)]
struct ReadParams<'a> {
    #[serde(borrow)]
    uri: Cow<'a, str>,
}

/// `resources/list`.
pub(super) fn list(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    page(s, ListKind::Resources, req, out)
}

/// `resources/templates/list`.
pub(super) fn templates(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    page(s, ListKind::ResourceTemplates, req, out)
}

/// The error for a URI no resource has (it names the URI in `data`; the era decides whether
/// that is sent).
pub(super) fn not_found(uri: &str) -> RpcError {
    RpcError::new(RESOURCE_NOT_FOUND, format!("Resource not found: {uri}")).with_data(json!({"uri": uri}))
}

/// `resources/read`: a resource of this ToolSet at once, an upstream's from its upstream.
pub(super) fn read<'a>(s: &'a Arc<Server>, req: &'a Request<'a>, out: &'a mut Vec<u8>) -> Waiting<'a> {
    Box::pin(async move {
        let p: ReadParams<'_> = parse_params(req.params)?;
        let snap = s.registry.load_full();
        let Some((r, vars)) = find_resource(&snap, &p.uri) else {
            return Err(not_found(&p.uri));
        };
        let Some((link, remote)) = upstream_of(&snap, r, &p.uri) else {
            return read_local(s, req, r, vars, &p.uri, out);
        };
        permitted(s, req, r, vars, &p.uri)?;
        // The upstream's limits count its reads as they count its calls.
        let _permits = match &r.kind {
            ResourceKind::Upstream { upstream, .. } => match snap.config.upstreams.get(*upstream) {
                Some(u) => super::govern::admit(s, &u.limits, "resources/read", req).await?,
                None => None,
            },
            _ => None,
        };
        // A 2026-07-28 client answers the upstream's questions in its input rounds.
        let m = super::rounds::stateless_args(req)?
            .map(|m| s.stateless_call("resources/read", &p.uri, &Value::Null, m))
            .transpose()?;
        let read = link
            .read_resource(remote, super::rounds::round_cx(m.as_ref()).as_ref())
            .await;
        let mut answered = false;
        if let Some(m) = m {
            let round = m.inputs.finish();
            answered = !round.used.is_empty();
            if s.interrupted(round, &m.call, &snap, req.id, out)? {
                return Ok(Done::Stamped);
            }
        }
        let mut result = read.map_err(|e| upstream_error(link, &e, Some(&p.uri)))?;
        // Contents it names by URIs its filter does not let through are not passed on.
        if let (Some(Value::Array(contents)), ResourceKind::Upstream { upstream, .. }) =
            (result.get_mut("contents"), &r.kind)
        {
            let u = &snap.config.upstreams[*upstream];
            contents.retain(|c| {
                c.get("uri")
                    .and_then(Value::as_str)
                    .is_some_and(|uri| u.remote_uri(uri).is_some())
            });
        }
        protocol::write_result(out, req.id, &serde_json::to_vec(&result).unwrap_or_default());
        if answered {
            // A read that took the user's answers is theirs for this once: no cache hints.
            crate::dispatch::stateless::stamp(out, &snap.result_stamp);
            return Ok(Done::Stamped);
        }
        Ok(Done::Written)
    })
}

/// Refuses a read (or subscription) of `uri`, resource `r`, that a policy of `r` does not
/// allow; policies see the URI template's variables (`vars`) as `args` (none: an empty map).
pub(super) fn permitted(
    s: &Server,
    req: &Request<'_>,
    r: &crate::config::CompiledResource,
    vars: Option<Value>,
    uri: &str,
) -> Result<Value, RpcError> {
    let args = vars.unwrap_or_else(|| Value::Object(serde_json::Map::new()));
    super::govern::permitted(
        s,
        r.policies.as_deref(),
        req,
        crate::config::policy::Target::Resource(uri),
        &args,
    )?;
    Ok(args)
}

/// For a resource `r` of an upstream: its link and the upstream's own URI of `uri` (which
/// its filter lets through); `None` for a resource of this ToolSet.
pub(super) fn upstream_of<'s, 'u>(
    snap: &'s Snapshot,
    r: &crate::config::CompiledResource,
    uri: &'u str,
) -> Option<(&'s Arc<crate::upstream::Link>, &'u str)> {
    let ResourceKind::Upstream { upstream, .. } = &r.kind else {
        return None;
    };
    let u = snap.config.upstreams.get(*upstream)?;
    Some((snap.upstreams.get(*upstream)?, u.remote_uri(uri)?))
}

/// The error a client gets for a request its upstream failed: the upstream's own "not
/// found" as this server's (for `uri`, when a resource was read), anything else named by
/// the upstream, Secret values redacted.
pub(super) fn upstream_error(link: &crate::upstream::Link, e: &CallError, uri: Option<&str>) -> RpcError {
    match (e, uri) {
        (CallError::Rpc(c, _), Some(uri)) if *c == i64::from(RESOURCE_NOT_FOUND) => not_found(uri),
        (CallError::Rpc(c, msg), _) if *c == i64::from(INVALID_PARAMS) => {
            RpcError::invalid_params(link.describe(msg))
        }
        _ => RpcError::new(INTERNAL_ERROR, link.describe(&e.to_string())),
    }
}

/// `resources/read` of a resource of this ToolSet (`vars`: its URI template's variables).
fn read_local(
    s: &Server,
    req: &Request<'_>,
    r: &crate::config::CompiledResource,
    vars: Option<Value>,
    uri: &str,
    out: &mut Vec<u8>,
) -> Result<Done, RpcError> {
    let args = permitted(s, req, r, vars, uri)?;
    let (text, blob, mime) = contents(r, Some(args));
    let text = text.map_err(|e| RpcError::invalid_params(format!("Resource {uri}: {e}")))?;
    let result = if blob {
        if !crate::config::content::is_base64(&text) {
            return Err(RpcError::invalid_params(format!(
                "Resource {uri}: the blob is not valid base64"
            )));
        }
        json!({"contents": [{"uri": uri, "mimeType": mime, "blob": text}]})
    } else {
        json!({"contents": [{"uri": uri, "mimeType": mime, "text": text}]})
    };
    protocol::write_result(out, req.id, &serde_json::to_vec(&result).unwrap_or_default());
    Ok(Done::Written)
}

/// `resources/subscribe` (handshake era): `notifications/resources/updated` for the URI on
/// the session's GET stream.
pub(super) fn subscribe(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: ReadParams<'_> = parse_params(req.params)?;
    let snap = s.registry.load();
    if find_resource(&snap, &p.uri).is_none() {
        return Err(RpcError::new(
            RESOURCE_NOT_FOUND,
            format!("Resource not found: {}", p.uri),
        ));
    }
    watch_upstream(s, req, &snap, &p.uri)?;
    s.sessions
        .subscribe(req.ctx.session, &p.uri)
        .map_err(|e| RpcError::invalid_params(e.to_string()))?;
    protocol::write_result(out, req.id, b"{}");
    Ok(Done::Written)
}

/// `resources/unsubscribe` (handshake era).
pub(super) fn unsubscribe(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: ReadParams<'_> = parse_params(req.params)?;
    s.sessions.unsubscribe(req.ctx.session, &p.uri);
    protocol::write_result(out, req.id, b"{}");
    Ok(Done::Written)
}

/// Subscribes to `uri` at its upstream when an upstream serves it (and the caller may read
/// it). A full set of an upstream's subscriptions first drops those no session or listen
/// watches any more.
pub(super) fn watch_upstream(
    s: &Server,
    req: &Request<'_>,
    snap: &Snapshot,
    uri: &str,
) -> Result<(), RpcError> {
    let Some((r, vars)) = find_resource(snap, uri) else {
        return Ok(());
    };
    let Some((link, remote)) = upstream_of(snap, r, uri) else {
        return Ok(());
    };
    permitted(s, req, r, vars, uri)?;
    let live = |served: &str| {
        s.sessions.subscriptions().iter().any(|(_, u)| &**u == served)
            || s.watched.lock().is_ok_and(|w| w.contains_key(served))
    };
    link.watch(remote, &live).map_err(RpcError::invalid_params)
}

impl Server {
    /// An upstream said its resource served as `uri` was updated: tells the sessions
    /// subscribed to it and the listens that watch it.
    pub(super) fn upstream_resource_updated(&self, uri: &str) {
        let uri: Box<str> = uri.into();
        for (session, u) in self.sessions.subscriptions() {
            if u == uri {
                self.resource_updated(Some(session), &uri);
            }
        }
        if self.watched.lock().is_ok_and(|w| w.contains_key(&uri)) {
            self.resource_updated(None, &uri);
        }
    }

    /// `notifications/resources/updated` of `uri` for `session`, or (`None`) for the
    /// listens that watch it.
    fn resource_updated(&self, session: Option<Box<str>>, uri: &str) {
        let message = match session {
            Some(_) => serde_json::to_string(&json!({
                "jsonrpc": "2.0",
                "method": "notifications/resources/updated",
                "params": {"uri": uri},
            }))
            .unwrap_or_default()
            .into(),
            None => Box::from(""),
        };
        let _ = self.events.send(Arc::new(Event {
            session,
            message,
            kind: EventKind::ResourceUpdated(uri.into()),
        }));
    }

    /// Tells every session subscribed to a resource whose contents differ between `old` and
    /// `new` (or that is gone) with `notifications/resources/updated`.
    pub fn resources_updated(&self, old: &Snapshot, new: &Snapshot) {
        for (session, uri) in self.sessions.subscriptions() {
            let before = resource_contents(old, &uri);
            let after = resource_contents(new, &uri);
            if before != after {
                self.resource_updated(Some(session), &uri);
            }
        }
        let watched: Vec<Box<str>> = self
            .watched
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default();
        for uri in watched {
            if resource_contents(old, &uri) != resource_contents(new, &uri) {
                self.resource_updated(None, &uri);
            }
        }
    }
}

/// A resource's contents: the text (base64 when the flag says blob, or why it could not be
/// rendered) and its MIME type; `None` when no resource of this ToolSet has the URI.
fn resource_contents<'s>(snap: &'s Snapshot, uri: &str) -> Option<(Result<String, String>, bool, &'s str)> {
    let (r, vars) = find_resource(snap, uri)?;
    if matches!(r.kind, ResourceKind::Upstream { .. }) {
        return None;
    }
    Some(contents(r, vars))
}

/// The contents of `r`, read with the URI template's variables `vars`.
fn contents(
    r: &crate::config::CompiledResource,
    vars: Option<Value>,
) -> (Result<String, String>, bool, &str) {
    let mime = r.mime_type.as_str();
    match (&r.kind, vars) {
        (ResourceKind::Static { text, blob, .. }, _) => (Ok(text.clone()), *blob, mime),
        (ResourceKind::Templated { text, blob, .. }, vars) => (
            text.render(&vars.unwrap_or(Value::Null))
                .map_err(|e| e.to_string()),
            *blob,
            mime,
        ),
        // Read from the upstream, never from the registry (`find_resource` does not return it).
        (ResourceKind::Upstream { .. }, _) => (Err("an upstream's resource".into()), false, mime),
    }
}

/// The resource a URI names, with the URI template's variables when it matched one (nothing
/// is rendered).
fn find_resource<'s>(
    snap: &'s Snapshot,
    uri: &str,
) -> Option<(&'s crate::config::CompiledResource, Option<Value>)> {
    let resources = &snap.config.resources;
    if let Some(i) = snap.static_resource(uri) {
        return Some((&resources[i], None));
    }
    resources.iter().find_map(|r| match &r.kind {
        ResourceKind::Templated { pattern, .. } => pattern.matches(uri).map(|vars| (r, Some(vars))),
        ResourceKind::Upstream {
            pattern: Some(pattern),
            ..
        } => pattern.matches_segments(uri).map(|vars| (r, Some(vars))),
        ResourceKind::Static { .. } | ResourceKind::Upstream { .. } => None,
    })
}

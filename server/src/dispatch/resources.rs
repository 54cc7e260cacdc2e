//! The resources family: lists, `resources/read`, the handshake era's subscriptions, and
//! telling subscribers and listens what a reload changed.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::envelope::parse_params;
use super::error::RpcError;
use super::request::{Done, Request};
use super::server::{Event, EventKind, Server};
use super::tools::page;
use crate::config::ResourceKind;
use crate::protocol::{self, RESOURCE_NOT_FOUND};
use crate::registry::{ListKind, Snapshot};

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

/// `resources/read`.
pub(super) fn read(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: ReadParams<'_> = parse_params(req.params)?;
    let snap = s.registry.load();
    let Some((r, vars)) = find_resource(&snap, &p.uri) else {
        return Err(not_found(&p.uri));
    };
    // Policies see the URI template's variables as `args` (none: an empty map).
    let args = vars.unwrap_or_else(|| Value::Object(serde_json::Map::new()));
    super::govern::permitted(
        s,
        r.policies.as_deref(),
        req,
        crate::config::policy::Target::Resource(&p.uri),
        &args,
    )?;
    let (text, blob, mime) = contents(r, Some(args));
    let text = text.map_err(|e| RpcError::invalid_params(format!("Resource {}: {e}", p.uri)))?;
    let result = if blob {
        if !crate::config::content::is_base64(&text) {
            return Err(RpcError::invalid_params(format!(
                "Resource {}: the blob is not valid base64",
                p.uri
            )));
        }
        json!({"contents": [{"uri": p.uri, "mimeType": mime, "blob": text}]})
    } else {
        json!({"contents": [{"uri": p.uri, "mimeType": mime, "text": text}]})
    };
    protocol::write_result(out, req.id, &serde_json::to_vec(&result).unwrap_or_default());
    Ok(Done::Written)
}

/// `resources/subscribe` (handshake era): `notifications/resources/updated` for the URI on
/// the session's GET stream.
pub(super) fn subscribe(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: ReadParams<'_> = parse_params(req.params)?;
    if find_resource(&s.registry.load(), &p.uri).is_none() {
        return Err(RpcError::new(
            RESOURCE_NOT_FOUND,
            format!("Resource not found: {}", p.uri),
        ));
    }
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

impl Server {
    /// Tells every session subscribed to a resource whose contents differ between `old` and
    /// `new` (or that is gone) with `notifications/resources/updated`.
    pub fn resources_updated(&self, old: &Snapshot, new: &Snapshot) {
        for (session, uri) in self.sessions.subscriptions() {
            let before = resource_contents(old, &uri);
            let after = resource_contents(new, &uri);
            if before != after {
                let msg = serde_json::to_string(&json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/resources/updated",
                    "params": {"uri": &*uri},
                }))
                .unwrap_or_default();
                let _ = self.events.send(Arc::new(Event {
                    session: Some(session),
                    message: msg.into(),
                    kind: EventKind::ResourceUpdated(uri.clone()),
                }));
            }
        }
        let watched: Vec<Box<str>> = self
            .watched
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default();
        for uri in watched {
            if resource_contents(old, &uri) != resource_contents(new, &uri) {
                let _ = self.events.send(Arc::new(Event {
                    session: None,
                    message: Box::from(""),
                    kind: EventKind::ResourceUpdated(uri),
                }));
            }
        }
    }
}

/// A resource's contents: the text (base64 when the flag says blob, or why it could not be
/// rendered) and its MIME type; `None` when no resource has the URI.
fn resource_contents<'s>(snap: &'s Snapshot, uri: &str) -> Option<(Result<String, String>, bool, &'s str)> {
    let (r, vars) = find_resource(snap, uri)?;
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
        ResourceKind::Static { .. } => None,
    })
}

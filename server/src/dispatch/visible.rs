//! What one caller may do with the tools: the policies a call must meet, and the
//! `tools/list` pages of a registry where who sees a tool depends on who asks (some tool has
//! `access` or policies). A caller sees a tool when its grants let it call the tool and no
//! policy rules every call out; a policy that reads the arguments, whatever they are, is
//! decided as far as it can be without them (`'sre' in caller.groups && args.x == 1` hides
//! the tool from others; `... || args.x == 1` shows it).

use serde::Deserialize;
use serde_json::{Value, json};

use super::envelope::parse_params;
use super::error::RpcError;
use super::request::Request;
use super::server::Server;
use crate::metrics::Refusal;
use crate::protocol;
use crate::registry::{Snapshot, Tool};

/// Refuses a call a policy of the tool does not allow.
#[inline]
pub(super) fn permitted(
    server: &Server,
    tool: &Tool,
    req: &Request<'_>,
    args: &Value,
) -> Result<(), RpcError> {
    let Some(policies) = &tool.policies else {
        return Ok(());
    };
    // Tracing: a span of the decision when the request is sampled (one branch when not).
    let span = crate::otel::internal("quiver.policy");
    let checked = policies.check(&tool.def.name, req.ctx.caller, Some(args));
    if let Some(cx) = span {
        super::govern::policy_span_end(&cx, policies.list.len(), checked.as_ref().err());
    }
    checked.map_err(|denied| {
        server.metrics.refused(Refusal::Forbidden);
        RpcError::new(protocol::FORBIDDEN, denied.message(&tool.def.name)).with_data(json!({
            "tool": tool.def.name,
            "policy": if denied.inline { None } else { Some(&*denied.policy) },
        }))
    })
}

#[derive(Deserialize)]
struct CursorParams<'a> {
    #[serde(borrow, default)]
    cursor: Option<std::borrow::Cow<'a, str>>,
}

/// Whether the caller may see `tool` in `tools/list` (and find it with `find_tools`).
pub(super) fn visible(tool: &Tool, req: &Request<'_>) -> bool {
    tool.def
        .access
        .as_ref()
        .is_none_or(|a| a.check(req.ctx.caller).is_ok())
        && tool
            .policies
            .as_ref()
            .is_none_or(|p| p.check(&tool.def.name, req.ctx.caller, None).is_ok())
}

/// A `tools/list` page of the tools this caller sees; `None` when the snapshot lists every
/// tool to everyone (its pre-serialized pages serve).
///
/// Cursors are `TAG-vN`: go on from tool N.
pub(super) fn page(snap: &Snapshot, req: &Request<'_>) -> Option<Result<Vec<u8>, RpcError>> {
    if !snap.per_caller {
        return None;
    }
    let entries = snap.tool_entries.as_deref()?;
    Some(render(snap, entries, req))
}

fn render(snap: &Snapshot, entries: &[Box<[u8]>], req: &Request<'_>) -> Result<Vec<u8>, RpcError> {
    let cursor = match req.params {
        Some(_) => parse_params::<CursorParams<'_>>(req.params)?.cursor,
        None => None,
    };
    let bad = || {
        RpcError::invalid_params(
            "Invalid cursor: not issued by the current list (it may have changed; list again without a cursor)",
        )
    };
    let from = match cursor.as_deref() {
        None => 0,
        Some(c) => {
            let (tag, n) = c.rsplit_once("-v").ok_or_else(bad)?;
            if tag != snap.cursor_tag() {
                return Err(bad());
            }
            n.parse::<usize>()
                .ok()
                .filter(|n| *n <= snap.tools.len())
                .ok_or_else(bad)?
        }
    };
    let size = snap.config.page_size;
    let mut page = Vec::with_capacity(256);
    page.extend_from_slice(b"{\"tools\":[");
    let mut shown = 0;
    let mut next = None;
    for (i, t) in snap.tools.iter().enumerate().skip(from) {
        if !snap.listed(i) || !visible(t, req) {
            continue;
        }
        if shown == size {
            next = Some(i);
            break;
        }
        if shown > 0 {
            page.push(b',');
        }
        page.extend_from_slice(entries.get(i).map_or(&b"{}"[..], |e| &**e));
        shown += 1;
    }
    page.push(b']');
    if let Some(n) = next {
        page.extend_from_slice(b",\"nextCursor\":");
        serde_json::to_writer(&mut page, &format!("{}-v{n}", snap.cursor_tag())).unwrap_or_default();
    }
    page.push(b'}');
    Ok(page)
}

//! What one caller may do with the tools: the policies a call must meet, and the
//! `tools/list` pages of a registry where who sees a tool depends on who asks (some tool has
//! `access` or policies). A caller sees a tool when its grants let it call the tool and no
//! policy rules every call out; a policy that reads the arguments, whatever they are, is
//! decided as far as it can be without them (`'sre' in caller.groups && args.x == 1` hides
//! the tool from others; `... || args.x == 1` shows it).

use std::cell::Cell;

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

/// The most policy evaluations one `tools/list` page or one `find_tools` search spends on
/// deciding what the caller sees. A page that would need more ends early, with a cursor to
/// the first tool it did not judge (the next page starts there with a new budget); a tool
/// whose decision alone needs more is never shown. Both are counted
/// (`quiver_policy_list_unjudged_total`).
pub const MAX_LIST_EVALUATIONS: usize = 1024;

/// What is left of one request's budget of policy evaluations, and the tools it left unjudged.
#[derive(Debug)]
pub(super) struct Spend {
    left: Cell<usize>,
    pub(super) unjudged: Cell<u64>,
}

impl Spend {
    pub(super) fn new() -> Self {
        Self {
            left: Cell::new(MAX_LIST_EVALUATIONS),
            unjudged: Cell::new(0),
        }
    }

    /// Counts what it left unjudged.
    pub(super) fn record(&self, gov: &crate::metrics::governance::GovMetrics) {
        if self.unjudged.get() > 0 {
            gov.policy_unjudged.inc_by(self.unjudged.get());
            tracing::debug!(
                tools = self.unjudged.get(),
                "policy evaluation budget spent: tools left out of this listing"
            );
        }
    }
}

/// Whether the caller sees a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    Shown,
    Hidden,
    /// Not judged: the request's budget of evaluations is short of what it needs.
    Unjudged,
}

/// The policy evaluations deciding whether `tool` is listed: its own and, for a pipeline,
/// those of the tools it runs.
fn cost(snap: &Snapshot, tool: &Tool) -> usize {
    tool.policies.as_ref().map_or(0, |p| {
        let steps = p
            .steps
            .iter()
            .filter_map(|&j| snap.tools.get(j)?.policies.as_ref());
        p.list.len() + steps.map(|q| q.list.len()).sum::<usize>()
    })
}

/// Whether the caller may see `tool` in `tools/list` (and find it with `find_tools`): its
/// grants let it call the tool and no policy rules every call out, nor one of the policies
/// of a tool it runs as a pipeline's step.
pub(super) fn visible(snap: &Snapshot, tool: &Tool, req: &Request<'_>, spend: &Spend) -> Seen {
    let caller = req.ctx.caller;
    if tool.def.access.as_ref().is_some_and(|a| a.check(caller).is_err()) {
        return Seen::Hidden;
    }
    let Some(p) = &tool.policies else {
        return Seen::Shown;
    };
    let Some(left) = spend.left.get().checked_sub(cost(snap, tool)) else {
        spend.unjudged.set(spend.unjudged.get() + 1);
        return Seen::Unjudged;
    };
    spend.left.set(left);
    let steps = p.steps.iter().filter_map(|&j| snap.tools.get(j));
    let allowed = p.check(&tool.def.name, caller, None).is_ok()
        && steps.into_iter().all(|t| {
            t.policies
                .as_ref()
                .is_none_or(|q| q.check(&t.def.name, caller, None).is_ok())
        });
    if allowed { Seen::Shown } else { Seen::Hidden }
}

/// A `tools/list` page of the tools this caller sees; `None` when the snapshot lists every
/// tool to everyone (its pre-serialized pages serve).
///
/// Cursors are `TAG-vN`: go on from tool N. With `core` (2025-11-25), each tool that runs
/// as a task says so (`execution.taskSupport`).
pub(super) fn page(
    snap: &Snapshot,
    req: &Request<'_>,
    gov: &crate::metrics::governance::GovMetrics,
    core: bool,
) -> Option<Result<Vec<u8>, RpcError>> {
    if !snap.per_caller {
        return None;
    }
    let entries = snap.tool_entries.as_deref()?;
    let spend = Spend::new();
    let page = render(snap, entries, req, &spend, core);
    spend.record(gov);
    Some(page)
}

fn render(
    snap: &Snapshot,
    entries: &[Box<[u8]>],
    req: &Request<'_>,
    spend: &Spend,
    core: bool,
) -> Result<Vec<u8>, RpcError> {
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
        if !snap.listed(i) {
            continue;
        }
        if shown == size {
            next = Some(i);
            break;
        }
        match visible(snap, t, req, spend) {
            Seen::Shown => {}
            Seen::Hidden => continue,
            // Never judged, so never shown.
            Seen::Unjudged if cost(snap, t) > MAX_LIST_EVALUATIONS => continue,
            Seen::Unjudged => {
                next = Some(i);
                break;
            }
        }
        if shown > 0 {
            page.push(b',');
        }
        let entry = entries.get(i).map_or(&b"{}"[..], |e| &**e);
        match crate::registry::task_support(t.def.task).filter(|_| core) {
            Some(support) if entry.len() > 2 => {
                page.extend_from_slice(&entry[..entry.len() - 1]);
                page.extend_from_slice(b",\"execution\":{\"taskSupport\":\"");
                page.extend_from_slice(support.as_bytes());
                page.extend_from_slice(b"\"}}");
            }
            _ => page.extend_from_slice(entry),
        }
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

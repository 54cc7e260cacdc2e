//! `find_tools`: the tools best matching a query, among those this caller may see, with
//! their `tools/list` entries. Its call has passed every check of a call (access, policies,
//! limits, schema) before it gets here.

use std::cell::RefCell;

use serde_json::Value;

use super::request::Request;
use super::visible::{Seen, Spend};
use crate::config::CompiledHandler;
use crate::protocol::output::ToolOutput;
use crate::registry::Snapshot;
use crate::search::Scratch;

thread_local! {
    /// Query state and hits, reused by every search on this thread.
    static SCRATCH: RefCell<(Scratch, Vec<(usize, f32)>)> = RefCell::default();
}

/// The answer of `find_tools`, or `None` when the tool at `index` is another.
#[inline]
pub(super) fn run(
    snap: &Snapshot,
    index: usize,
    args: &Value,
    req: &Request<'_>,
    gov: &crate::metrics::governance::GovMetrics,
) -> Option<ToolOutput> {
    matches!(snap.tools[index].def.handler, CompiledHandler::FindTools).then(|| {
        let spend = Spend::new();
        let out = answer(snap, index, args, req, &spend);
        spend.record(gov);
        out
    })
}

fn answer(snap: &Snapshot, me: usize, args: &Value, req: &Request<'_>, spend: &Spend) -> ToolOutput {
    let (Some(catalog), Some(entries)) = (snap.search.as_deref(), snap.tool_entries.as_deref()) else {
        return ToolOutput::error("tool search is not enabled on this server");
    };
    let query = args.get("query").and_then(Value::as_str).unwrap_or_default();
    let limit = args
        .get("limit")
        .and_then(Value::as_u64)
        .map_or(catalog.default_limit, |l| {
            usize::try_from(l).unwrap_or(usize::MAX).min(catalog.max_limit)
        })
        .max(1);
    // Re-entry cannot happen (the search calls no tool); if it did, a fresh scratch serves.
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => {
            let (scratch, hits) = &mut *s;
            found(
                snap, me, entries, catalog, query, limit, scratch, hits, req, spend,
            )
        }
        Err(_) => {
            let (mut scratch, mut hits) = Default::default();
            found(
                snap,
                me,
                entries,
                catalog,
                query,
                limit,
                &mut scratch,
                &mut hits,
                req,
                spend,
            )
        }
    })
}

#[allow(clippy::too_many_arguments)] // the call's parts and the reused scratch
fn found(
    snap: &Snapshot,
    me: usize,
    entries: &[Box<[u8]>],
    catalog: &crate::search::Catalog,
    query: &str,
    limit: usize,
    scratch: &mut Scratch,
    hits: &mut Vec<(usize, f32)>,
    req: &Request<'_>,
    spend: &Spend,
) -> ToolOutput {
    // Fails closed: a tool the budget did not reach is not found.
    let seen = |i: usize| i != me && super::visible::visible(snap, &snap.tools[i], req, spend) == Seen::Shown;
    catalog.index.search(query, limit, scratch, seen, hits);
    let size: usize = hits
        .iter()
        .map(|(i, _)| entries.get(*i).map_or(2, |e| e.len() + 1))
        .sum();
    let mut text = Vec::with_capacity(size + 16);
    text.extend_from_slice(b"{\"tools\":[");
    for (k, (i, _)) in hits.iter().enumerate() {
        if k > 0 {
            text.push(b',');
        }
        text.extend_from_slice(entries.get(*i).map_or(&b"{}"[..], |e| &**e));
    }
    text.extend_from_slice(b"]}");
    ToolOutput {
        structured: serde_json::from_slice(&text).ok(),
        text: String::from_utf8(text).unwrap_or_default(),
        content: None,
        is_error: false,
    }
}

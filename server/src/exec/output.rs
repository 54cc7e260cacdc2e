//! What a tool's result goes through before it is sent (or handed to a pipeline's next
//! step): its output schema, then its result guard, then (sent only) its token budget.

use crate::config::guards::{GuardAction, ResultGuard, Verdict};
use crate::guard::Scan;
use crate::protocol::output::ToolOutput;
use crate::registry::Snapshot;

/// What a result's checks found, for its audit record and the caller's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    /// What the result guard found (`None`: nothing, or no guard).
    pub guard: Option<Verdict>,
    /// The result's tokens (before a cut), when its tool meters them.
    pub tokens: Option<u64>,
}

/// Checks a result against the tool's output schema, passes it through the tool's result
/// guard, if it has one, and holds it to the tool's token budget: the result to send, and
/// what was found.
pub fn check_output(snap: &Snapshot, tool: usize, out: ToolOutput) -> (ToolOutput, Checked) {
    let (out, guard) = guard_output(snap, tool, check_schema(snap, tool, out));
    let t = &snap.tools[tool];
    match t.def.governance.result_guard.as_ref().and_then(|g| g.tokens) {
        None => (out, Checked { guard, tokens: None }),
        Some(b) => {
            let (out, tokens) = super::budget::budgeted(t, &b, out);
            (out, Checked { guard, tokens })
        }
    }
}

/// Passes a result through the tool's result guard, if it has one (a pipeline's step
/// passes its result to the next through its tool's guard too).
#[inline]
pub fn guard_output(snap: &Snapshot, tool: usize, out: ToolOutput) -> (ToolOutput, Option<Verdict>) {
    let t = &snap.tools[tool];
    match &t.def.governance.result_guard {
        Some(g) if g.searches() => guarded(t, g, out),
        _ => (out, None),
    }
}

/// Searches a result's text, content blocks and structured content; redacts, or withholds
/// the result, as the guard says.
fn guarded(t: &crate::registry::Tool, g: &ResultGuard, mut out: ToolOutput) -> (ToolOutput, Option<Verdict>) {
    let (mut scan, mut v) = (Scan::default(), Verdict::default());
    match &mut out.content {
        Some(blocks) => {
            for b in blocks {
                g.check_block(b, &mut scan, &mut v);
            }
            // The text of the text blocks, which a pipeline's next step reads: searched
            // again only when the blocks had something (counted once, in the blocks).
            if v.count > 0
                && let Some(r) = g.check_str(&out.text, &mut scan, &mut Verdict::default())
            {
                out.text = r;
            }
        }
        None => {
            if let Some(r) = g.check_str(&out.text, &mut scan, &mut v) {
                out.text = r;
            }
        }
    }
    if let Some(s) = &mut out.structured {
        g.check_value(s, &mut scan, &mut v);
    }
    if v.count == 0 {
        return (out, None);
    }
    t.metrics.guarded(&t.def.name, &v);
    if v.action == GuardAction::Refuse {
        out = ToolOutput::error(v.refusal());
    }
    (out, Some(v))
}

/// Checks a successful result against the tool's output schema.
fn check_schema(snap: &Snapshot, tool: usize, out: ToolOutput) -> ToolOutput {
    let Some(schema) = &snap.tools[tool].def.output else {
        return out;
    };
    if out.is_error {
        return out;
    }
    match &out.structured {
        None => ToolOutput::error("the tool declares an outputSchema but produced no structured content"),
        Some(s) => {
            let mut errs = Vec::new();
            schema.validate(s, &mut errs);
            if errs.is_empty() {
                out
            } else {
                ToolOutput::error(format!(
                    "the result does not match the tool's outputSchema: {}",
                    errs.join("; ").replace("arguments", "result")
                ))
            }
        }
    }
}

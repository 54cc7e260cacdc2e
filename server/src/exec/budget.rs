//! A result held to its tool's token budget (`resultGuards.tokens`): its tokens counted as
//! a client hands them to a model, metered, and a result over `maxResultTokens` cut at a
//! token boundary with a note, or withheld.
//!
//! What is counted is the text of the result: its text blocks and the text of embedded
//! resources (or its one text), and its structured content (as JSON) only when it has no
//! text. Images and audio are not counted: what they cost depends on the model.

use serde_json::Value;

use crate::config::guards::{OverBudget, TokenBudget, TokenEncoding};
use crate::protocol::output::ToolOutput;
use crate::registry::Tool;
use crate::tokens::{self, Encoding};

fn encoding(e: TokenEncoding) -> Encoding {
    match e {
        TokenEncoding::O200kBase => Encoding::O200kBase,
        TokenEncoding::Cl100kBase => Encoding::Cl100kBase,
    }
}

/// Holds `out` to the budget `b` of `tool`: the result to send and its tokens (before a
/// cut), when they were counted.
pub(super) fn budgeted(tool: &Tool, b: &TokenBudget, out: ToolOutput) -> (ToolOutput, Option<u64>) {
    let enc = encoding(b.encoding);
    // Every token is at least one byte: a result within the budget in bytes is within it
    // in tokens, and is counted only when metered.
    let bytes = text_bytes(&out);
    if !b.meter && b.max.is_none_or(|max| bytes <= max) {
        return (out, None);
    }
    let n = count(enc, &out);
    let name = &tool.def.name;
    if b.meter {
        tool.metrics.tokens.returned(name, n);
    }
    let Some(max) = b.max.filter(|&max| n > max) else {
        return (out, Some(n));
    };
    // A cut result cannot meet an output schema: such a tool's result is withheld.
    let over = if tool.def.output.is_some() {
        OverBudget::Refuse
    } else {
        b.over
    };
    tool.metrics.tokens.over(name, over.label());
    let out = match over {
        OverBudget::Refuse => ToolOutput::error(format!(
            "the server withheld this result: it has {n} tokens, over this tool's limit of {max}. Ask for less (a narrower query, a smaller page)"
        )),
        OverBudget::Truncate => truncate(enc, out, n, max),
    };
    (out, Some(n))
}

/// The texts counted: the text blocks' and embedded resources' (or the one text).
fn texts(out: &ToolOutput) -> impl Iterator<Item = &str> {
    let blocks = out.content.iter().flatten().filter_map(block_text);
    out.content
        .is_none()
        .then_some(out.text.as_str())
        .into_iter()
        .chain(blocks)
}

fn block_text(b: &Value) -> Option<&str> {
    match b.get("type").and_then(Value::as_str) {
        Some("text") => b.get("text").and_then(Value::as_str),
        Some("resource") => b.pointer("/resource/text").and_then(Value::as_str),
        _ => None,
    }
}

fn block_text_mut(b: &mut Value) -> Option<&mut String> {
    let at = match b.get("type").and_then(Value::as_str) {
        Some("text") => "/text",
        Some("resource") => "/resource/text",
        _ => return None,
    };
    match b.pointer_mut(at) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

fn text_bytes(out: &ToolOutput) -> u64 {
    let text: usize = texts(out).map(str::len).sum();
    if text == 0 {
        // Structured content alone: a bound on its JSON's size (each string at least its
        // bytes, each value at least one), cheap to take.
        return out.structured.as_ref().map_or(0, |s| s.to_string().len() as u64);
    }
    text as u64
}

/// The tokens of a result's text, or of its structured content when it has no text.
fn count(enc: Encoding, out: &ToolOutput) -> u64 {
    let mut n = 0;
    let mut any = false;
    for t in texts(out) {
        any |= !t.is_empty();
        n += tokens::count(enc, t);
    }
    match (&out.structured, any) {
        (Some(s), false) => tokens::count(enc, &s.to_string()),
        _ => n,
    }
}

/// `out` cut to at most `max` tokens with a note at its end: text blocks past the cut are
/// dropped (and any block after them), structured content too (it is whole, and not what
/// was cut).
fn truncate(enc: Encoding, mut out: ToolOutput, n: u64, max: u64) -> ToolOutput {
    let note = format!(
        "[The server cut this result: it has {n} tokens, over this tool's limit of {max}. Ask for less (a narrower query, a smaller page) to see the rest.]"
    );
    if out.content.is_none() && texts(&out).all(str::is_empty) {
        // Structured content alone: its JSON text is what is cut.
        out.text = out.structured.as_ref().map(Value::to_string).unwrap_or_default();
    }
    out.structured = None;
    // The note and the line break before it, and one token for where the cut text meets it.
    let mut room = max.saturating_sub(tokens::count(enc, &note) + 2);
    // Counted alone, the cut text may split differently at its end than within the whole
    // (trailing whitespace): cut again, shorter, in the rare case it exceeds its room.
    for _ in 0..4 {
        let cut = cut_to(enc, out.clone(), room, &note);
        let total = count(enc, &cut);
        if total <= max {
            return cut;
        }
        room = room.saturating_sub(total - max);
    }
    cut_to(enc, out, 0, &note)
}

fn cut_to(enc: Encoding, mut out: ToolOutput, room: u64, note: &str) -> ToolOutput {
    let cut = |text: &mut String, room: u64| -> (u64, bool) {
        let (end, used, whole) = tokens::prefix(enc, text, room);
        text.truncate(end);
        (used, whole.is_some())
    };
    match &mut out.content {
        None => {
            cut(&mut out.text, room);
            out.text.push_str("\n\n");
            out.text.push_str(note);
        }
        Some(blocks) => {
            let mut left = room;
            let mut keep = blocks.len();
            for (i, b) in blocks.iter_mut().enumerate() {
                let Some(text) = block_text_mut(b) else { continue };
                let (used, was_cut) = cut(text, left);
                left -= used;
                if was_cut {
                    keep = i + 1;
                    break;
                }
            }
            blocks.truncate(keep);
            blocks.push(serde_json::json!({"type": "text", "text": note}));
            cut(&mut out.text, room);
        }
    }
    out
}

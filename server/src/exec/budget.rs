//! A result held to its tool's token budget (`resultGuards.tokens`): its tokens counted as
//! a client hands them to a model, metered, and a result over `maxResultTokens` cut at a
//! token boundary with a note, or withheld.
//!
//! What is counted: the result's text (its text blocks, the text or blob of embedded
//! resources, a resource link's names and URI, every string of a block of another type; or
//! its one text) and its structured content as JSON, whichever is larger (a client hands a
//! model one or the other). Images and audio are not counted: what they cost depends on the
//! model. A tool that is not metered is counted only up to its budget, so its cost is
//! bounded by the budget, not by the result.

use serde_json::Value;

use crate::config::guards::{OverBudget, TokenBudget};
use crate::protocol::output::ToolOutput;
use crate::registry::Tool;
use crate::tokens::{self, Encoding};

/// Holds `out` to the budget `b` of `tool`: the result to send and, when it is metered, its
/// tokens (before a cut).
pub(super) fn budgeted(tool: &Tool, b: &TokenBudget, out: ToolOutput) -> (ToolOutput, Option<u64>) {
    let enc = Encoding::from(b.encoding);
    // Every token is at least one byte: a result within the budget in bytes is within it
    // in tokens, and is counted only when metered.
    if !b.meter && b.max.is_none_or(|max| text_bytes(&out) <= max) {
        return (out, None);
    }
    let limit = if b.meter { None } else { b.max };
    let (n, exact) = measure(enc, &out, limit);
    let name = &tool.def.name;
    if b.meter {
        tool.metrics.tokens.returned(name, n);
    }
    let metered = b.meter.then_some(n);
    let Some(max) = b.max.filter(|&max| n > max) else {
        return (out, metered);
    };
    let size = if exact {
        format!("it has {n} tokens")
    } else {
        format!("it has more than {max} tokens")
    };
    // A cut result cannot meet an output schema: such a tool's result is withheld.
    let over = if tool.def.output.is_some() {
        OverBudget::Refuse
    } else {
        b.over
    };
    let out = match over {
        OverBudget::Truncate => truncate(enc, out, &size, max),
        OverBudget::Refuse => None,
    };
    let action = if out.is_some() { "truncate" } else { "refuse" };
    tool.metrics.tokens.over(name, action);
    let out = out.unwrap_or_else(|| {
        ToolOutput::error(format!(
            "the server withheld this result: {size}, over this tool's limit of {max}. Ask for less (a narrower query, a smaller page)"
        ))
    });
    (out, metered)
}

/// The texts of a result's content (or its one text), each with whether it can be cut.
fn texts(out: &ToolOutput) -> Vec<&str> {
    match &out.content {
        None => vec![out.text.as_str()],
        Some(blocks) => {
            let mut v = Vec::new();
            for b in blocks {
                block_texts(b, &mut v);
            }
            v
        }
    }
}

/// The strings of a content block a model reads: not its `type`, `_meta` or annotations,
/// nor the payload of an image or audio block.
fn block_texts<'a>(b: &'a Value, into: &mut Vec<&'a str>) {
    let Value::Object(map) = b else { return };
    let media = matches!(map.get("type").and_then(Value::as_str), Some("image" | "audio"));
    for (k, v) in map {
        match (k.as_str(), v) {
            ("type" | "_meta" | "annotations" | "mimeType", _) => {}
            ("data", _) if media => {}
            (_, v) => strings(v, into),
        }
    }
}

/// Every string in `v` (object keys aside).
fn strings<'a>(v: &'a Value, into: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => into.push(s),
        Value::Object(_) => block_texts(v, into),
        Value::Array(items) => items.iter().for_each(|x| strings(x, into)),
        Value::Number(_) | Value::Bool(_) | Value::Null => {}
    }
}

/// At least the bytes of what is counted (every token is at least one byte).
fn text_bytes(out: &ToolOutput) -> u64 {
    let text: usize = texts(out).iter().map(|t| t.len()).sum();
    let structured = out.structured.as_ref().map_or(0, json_len);
    text.max(structured) as u64
}

/// At least the length of `v`'s compact JSON, without writing it: strings with their
/// escapes, numbers at their longest.
fn json_len(v: &Value) -> usize {
    let string = |s: &str| {
        2 + s
            .bytes()
            .map(|c| match c {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0C => 2,
                0..0x20 => 6,
                _ => 1,
            })
            .sum::<usize>()
    };
    match v {
        Value::String(s) => string(s),
        Value::Array(items) => 2 + items.iter().map(|x| json_len(x) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, x)| string(k) + 2 + json_len(x))
                .sum::<usize>()
        }
        Value::Number(_) => 24,
        Value::Bool(_) | Value::Null => 5,
    }
}

/// The tokens of `out`, and whether the count is exact: counted up to `limit` (then more
/// than `limit`), or all of them.
fn measure(enc: Encoding, out: &ToolOutput, limit: Option<u64>) -> (u64, bool) {
    let count_to = |text: &str, so_far: u64| -> (u64, bool) {
        match limit {
            None => (tokens::count(enc, text), false),
            Some(max) => {
                let (_, used, cut) = tokens::prefix(enc, text, max.saturating_sub(so_far));
                (used, cut)
            }
        }
    };
    let mut text = 0;
    for t in texts(out) {
        let (n, cut) = count_to(t, text);
        text += n;
        if cut {
            return (limit.map_or(text, |m| m + 1), false);
        }
    }
    let structured = match &out.structured {
        None => 0,
        Some(s) => {
            let (n, cut) = count_to(&s.to_string(), 0);
            if cut {
                return (limit.map_or(n, |m| m + 1), false);
            }
            n
        }
    };
    (text.max(structured), true)
}

/// `out` cut to at most `max` tokens with a note at its end (`None`: it cannot be, the
/// budget is too small for the note): text past the cut is dropped, and any block after
/// it; structured content too (it is whole, and no longer what the text says).
fn truncate(enc: Encoding, mut out: ToolOutput, size: &str, max: u64) -> Option<ToolOutput> {
    let note = format!(
        "[The server cut this result: {size}, over this tool's limit of {max}. Ask for less (a narrower query, a smaller page) to see the rest.]"
    );
    if out.content.is_none() && out.text.is_empty() {
        // Structured content alone: its JSON text is what is cut.
        out.text = out.structured.as_ref().map(Value::to_string).unwrap_or_default();
    }
    out.structured = None;
    // The note and the line break before it, and a token where the cut text meets it.
    let mut room = max.checked_sub(tokens::count(enc, &note) + 2)?;
    // Counted alone, the cut text may split differently at its end than within the whole
    // (whitespace, punctuation meeting the line break): cut again, shorter, in the rare case
    // it exceeds its room. Each cut is of the one before, and each check counts to the
    // budget at most.
    for _ in 0..4 {
        cut_to(enc, &mut out, room);
        let mark = add_note(&mut out, &note);
        let (total, _) = measure(enc, &out, Some(max));
        if total <= max {
            return Some(out);
        }
        remove_note(&mut out, mark);
        room = room.checked_sub(total - max)?;
    }
    None
}

/// The tokens of the strings of `b` a model reads, counted to `limit` (then `limit + 1`).
fn block_tokens(enc: Encoding, b: &Value, limit: u64) -> u64 {
    let mut strings = Vec::new();
    block_texts(b, &mut strings);
    let mut n = 0;
    for t in strings {
        let (_, used, cut) = tokens::prefix(enc, t, limit - n);
        if cut {
            return limit + 1;
        }
        n += used;
    }
    n
}

/// Cuts `out`'s text to `room` tokens: a text block is cut (its other strings counted
/// first), a block past the cut is dropped, and any block after it.
fn cut_to(enc: Encoding, out: &mut ToolOutput, room: u64) {
    let cut = |text: &mut String, room: u64| -> (u64, bool) {
        let (end, used, cut) = tokens::prefix(enc, text, room);
        text.truncate(end);
        (used, cut)
    };
    match &mut out.content {
        None => {
            cut(&mut out.text, room);
        }
        Some(blocks) => {
            let mut left = room;
            let mut keep = blocks.len();
            for (i, b) in blocks.iter_mut().enumerate() {
                // The block's strings but the one that can be cut, which is taken out
                // meanwhile: they go whole, or the block not at all.
                let text = block_text_mut(b).map(std::mem::take);
                let others = block_tokens(enc, b, left);
                let Some(l) = left.checked_sub(others) else {
                    keep = i;
                    break;
                };
                left = l;
                if let (Some(mut text), Some(slot)) = (text, block_text_mut(b)) {
                    let (used, was_cut) = cut(&mut text, left);
                    *slot = text;
                    left -= used;
                    if was_cut {
                        keep = i + 1;
                        break;
                    }
                }
            }
            blocks.truncate(keep);
            cut(&mut out.text, room);
        }
    }
}

/// Appends the note; returns what [`remove_note`] needs to take it off again.
fn add_note(out: &mut ToolOutput, note: &str) -> usize {
    match &mut out.content {
        None => {
            let mark = out.text.len();
            out.text.push_str("\n\n");
            out.text.push_str(note);
            mark
        }
        Some(blocks) => {
            blocks.push(serde_json::json!({"type": "text", "text": note}));
            blocks.len() - 1
        }
    }
}

fn remove_note(out: &mut ToolOutput, mark: usize) {
    match &mut out.content {
        None => out.text.truncate(mark),
        Some(blocks) => blocks.truncate(mark),
    }
}

fn block_text_mut(b: &mut Value) -> Option<&mut String> {
    let at = match b.get("type").and_then(Value::as_str) {
        Some("text") => "/text",
        Some("resource") if b.pointer("/resource/text").is_some() => "/resource/text",
        _ => return None,
    };
    match b.pointer_mut(at) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const ENC: Encoding = Encoding::O200kBase;

    fn output(text: &str, structured: Option<Value>, content: Option<Vec<Value>>) -> ToolOutput {
        ToolOutput {
            text: text.to_owned(),
            structured,
            content,
            is_error: false,
        }
    }

    #[test]
    fn structured_content_counts_when_it_is_the_larger() {
        let big = json!({"rows": vec!["alpha beta gamma delta"; 200]});
        let out = output("ok", Some(big.clone()), None);
        let (n, exact) = measure(ENC, &out, None);
        assert!(exact);
        assert_eq!(n, tokens::count(ENC, &big.to_string()));
        // Counted to a budget: stops past it, and says so.
        assert_eq!(measure(ENC, &out, Some(100)), (101, false));
        assert!(
            text_bytes(&out) > 100,
            "a small text does not hide large structured content"
        );
    }

    #[test]
    fn every_string_a_model_reads_is_counted_but_media_payloads() {
        let blocks = vec![
            json!({"type": "resource_link", "uri": "file:///a", "name": "alpha beta", "_meta": {"x": "gamma"}}),
            json!({"type": "image", "mimeType": "image/png", "data": "QUJD".repeat(500)}),
            json!({"type": "resource", "resource": {"uri": "file:///b", "blob": "ZGVsdGE="}}),
            json!({"type": "novel", "words": ["one", {"more": "two"}]}),
        ];
        let out = output("", None, Some(blocks));
        let mut counted = texts(&out);
        counted.sort_unstable();
        assert_eq!(
            counted,
            ["ZGVsdGE=", "alpha beta", "file:///a", "file:///b", "one", "two"]
        );
    }

    #[test]
    fn a_cut_drops_a_block_it_cannot_cut_and_all_after() {
        let words = "alpha beta gamma delta ".repeat(30);
        let mut out = output(
            "",
            None,
            Some(vec![
                json!({"type": "text", "text": "short"}),
                json!({"type": "resource_link", "uri": "file:///x", "name": words}),
                json!({"type": "text", "text": "after"}),
            ]),
        );
        cut_to(ENC, &mut out, 50);
        let blocks = out.content.expect("blocks");
        assert_eq!(blocks, [json!({"type": "text", "text": "short"})]);
    }

    #[test]
    fn a_text_blocks_other_strings_count_toward_its_cut() {
        let big = "alpha beta ".repeat(200);
        let block = json!({"type": "text", "text": "short", "title": big});
        let mut out = output(
            "",
            None,
            Some(vec![json!({"type": "text", "text": "first"}), block]),
        );
        cut_to(ENC, &mut out, 50);
        assert_eq!(
            out.content.expect("blocks"),
            [json!({"type": "text", "text": "first"})]
        );
    }

    #[test]
    fn a_budget_too_small_for_its_note_refuses_rather_than_overflows() {
        let out = output(&"alpha ".repeat(500), None, None);
        assert!(truncate(ENC, out.clone(), "it has 500 tokens", 30).is_none());
        let cut = truncate(ENC, out, "it has 500 tokens", 100).expect("a cut");
        assert!(tokens::count(ENC, &cut.text) <= 100);
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            Just(Value::Null),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(".{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The bound on structured content's size is never below its JSON's length (the
        /// uncounted shortcut relies on it).
        #[test]
        fn the_json_length_bound_holds(v in json_value()) {
            prop_assert!(json_len(&v) >= v.to_string().len(), "{}", v);
        }
    }
}

//! A ToolSet document written as JSON (what the operator writes into the ConfigMap) read
//! with serde_json, about ten times faster than the YAML parser reads the same text.
//!
//! JSON is YAML, so this is only a faster route to the ToolSet the YAML parser would build
//! from the same text, and it must never change a verdict. It takes a document only when
//! that is plainly so: the text is one JSON object, no object in it repeats a key (the
//! YAML parser refuses duplicates; serde_json would keep the last), and it stays well
//! inside the YAML parser's nesting and node budgets. Anything else (YAML, JSON that
//! does not parse or does not fit the model, a document near a limit) goes to the YAML
//! parser, whose answer and error messages are then the ones given.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::model::ToolSet;

/// Deepest nesting taken here; the YAML parser's own limit is [`super::MAX_YAML_DEPTH`].
const MAX_DEPTH: usize = 40;
/// Most values (objects, arrays, scalars) taken here; the YAML budget is 250,000 nodes.
const MAX_NODES: usize = 200_000;

/// The document the operator writes: JSON (so pods read it with [`parse`]), one top-level
/// list entry (a tool, resource, prompt or upstream) per line, so that it stays readable in
/// `kubectl get configmap -o yaml` and diffs line by line.
///
/// # Errors
/// What serde_json reports for a ToolSet it cannot write (none is known).
pub fn write(ts: &ToolSet) -> Result<String, serde_json::Error> {
    let serde_json::Value::Object(top) = serde_json::to_value(ts)? else {
        return serde_json::to_string(ts);
    };
    let mut out = String::from("{");
    for (i, (key, value)) in top.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        out.push_str(&serde_json::to_string(key)?);
        out.push_str(": ");
        match value {
            serde_json::Value::Array(items) if !items.is_empty() => {
                out.push('[');
                for (j, item) in items.iter().enumerate() {
                    out.push_str(if j == 0 { "\n  " } else { ",\n  " });
                    out.push_str(&serde_json::to_string(item)?);
                }
                out.push_str("\n]");
            }
            v => out.push_str(&serde_json::to_string(v)?),
        }
    }
    out.push_str("\n}\n");
    Ok(out)
}

/// The ToolSet, when `text` is a plain JSON document that reads as one.
pub(super) fn parse(text: &str) -> Option<ToolSet> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    let mut nodes = 0usize;
    let mut de = serde_json::Deserializer::from_str(text);
    Plain {
        depth: 0,
        nodes: &mut nodes,
    }
    .deserialize(&mut de)
    .ok()?;
    de.end().ok()?;
    serde_json::from_str(text).ok()
}

/// Walks a JSON value, failing on a repeated key, or more depth or values than taken.
struct Plain<'n> {
    depth: usize,
    nodes: &'n mut usize,
}

impl<'de> DeserializeSeed<'de> for Plain<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        *self.nodes += 1;
        if *self.nodes > MAX_NODES {
            return Err(de::Error::custom("too many values"));
        }
        d.deserialize_any(self)
    }
}

impl Plain<'_> {
    fn inner<E: de::Error>(&mut self) -> Result<Plain<'_>, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom("nested too deep"));
        }
        Ok(Plain {
            depth: self.depth + 1,
            nodes: self.nodes,
        })
    }
}

impl<'de> Visitor<'de> for Plain<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        // SipHash with a random key, not FxHash: the keys are the document author's, and
        // crafted colliding keys must not turn this check quadratic.
        let mut seen = HashSet::new();
        while let Some(Key(k)) = map.next_key()? {
            if !seen.insert(k) {
                return Err(de::Error::custom("a repeated key"));
            }
            map.next_value_seed(self.inner()?)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.inner()?)?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// An object key, borrowed from the text unless it has escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Result<ToolSet, String> {
        serde_saphyr::from_str_with_options::<ToolSet>(text, super::super::yaml_options())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn takes_plain_json_and_reads_what_yaml_reads() {
        let text = r#"{"tools": [{"name": "a", "description": "x\u0041\n\"y\"", "input": {"n": "integer?", "s": {"type": "string", "maxLength": 3}}, "handler": {"template": "{{n}}"}}, {"name": "b", "handler": {"builtin": "add"}, "annotations": {"readOnlyHint": true}}], "server": {"name": "s", "version": "1.2"}}"#;
        let fast = parse(text).expect("plain JSON is taken");
        assert_eq!(fast, yaml(text).unwrap());
        assert_eq!(fast.tools[0].description.as_deref(), Some("xA\n\"y\""));
    }

    #[test]
    fn what_the_operator_writes_reads_back_the_same_by_either_parser() {
        let example =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/tools.yaml")).unwrap();
        let ts = yaml(&example).unwrap();
        assert!(ts.tools.len() >= 5, "the example has tools");
        let doc = write(&ts).unwrap();
        // One tool per line: readable, diffable.
        assert_eq!(
            doc.lines().filter(|l| l.starts_with("  {\"")).count(),
            ts.tools.len() + ts.resources.len() + ts.prompts.len() + ts.upstreams.len(),
            "{doc}"
        );
        assert_eq!(parse(&doc).as_ref(), Some(&ts), "{doc}");
        assert_eq!(yaml(&doc).unwrap(), ts, "{doc}");
    }

    #[test]
    fn leaves_everything_else_to_the_yaml_parser() {
        for text in [
            // YAML, including YAML flow style that starts like JSON.
            "tools: []\n",
            "{tools: [{name: a, handler: {builtin: add}}]}",
            "# a comment\n{\"tools\": []}",
            // Repeated keys: YAML refuses them, serde_json would keep the last one.
            r#"{"tools": [], "tools": [{"name": "a", "handler": {"builtin": "add"}}]}"#,
            r#"{"tools": [{"name": "a", "input": {"x": "string", "x": "integer"}, "handler": {"builtin": "add"}}]}"#,
            r#"{"tools": [{"name": "a", "input": {"x": "string", "\u0078": "integer"}, "handler": {"builtin": "add"}}]}"#,
            // Not JSON, or not a ToolSet, or more than one document.
            r#"{"tools": [}"#,
            r#"{"tools": 5}"#,
            r#"{"tool": []}"#,
            r#"{"tools": []} {"tools": []}"#,
        ] {
            assert!(parse(text).is_none(), "{text}");
        }
        // Near the YAML parser's limits: its verdict, not ours.
        let deep = format!(
            r#"{{"tools": [{{"name": "a", "handler": {{"builtin": "add"}}, "inputSchema": {}1{}}}]}}"#,
            "[".repeat(40),
            "]".repeat(40)
        );
        assert!(parse(&deep).is_none());
        let wide = format!(
            r#"{{"tools": [{{"name": "a", "handler": {{"builtin": "add"}}, "inputSchema": {{"enum": [{}]}}}}]}}"#,
            vec!["1"; MAX_NODES].join(",")
        );
        assert!(parse(&wide).is_none());
    }
}

//! Free-form JSON fields of a ToolSet (schemas, `input`, http bodies, step inputs) that read
//! any nesting depth without failing the document around them.
//!
//! serde_json stops at 128 levels of nesting, and the error fails the whole document being
//! read. The operator reads McpServers as JSON from the API server, which accepts far deeper
//! objects, and kube-rs reads a list of them as one document: one McpServer with a schema
//! nested 150 deep would make every list fail and stall the operator for the whole cluster.
//! So these fields are read from serde_json as raw text first, which serde_json scans without
//! recursion, and parsed only when they nest at most [`MAX_VALUE_DEPTH`] deep. A deeper
//! value becomes a marker the compiler reports as a problem of that one field, and the rest
//! of the McpServer (and of the list) reads normally. Other formats (the YAML of ToolSets)
//! have their own nesting budget and read these fields as plain values.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// JSON values in a ToolSet (schemas, `input`, bodies, step inputs) may nest at most this
/// deep. It keeps every walk over them shallow, and a value that fits re-parses from the
/// YAML the operator writes (whose nesting limit is 48, see `yaml_options`).
pub const MAX_VALUE_DEPTH: usize = 32;

/// The name serde_json gives its raw-value protocol (`serde_json::value::RawValue`).
const RAW_TOKEN: &str = "$serde_json::private::RawValue";

/// Key of the marker that stands for a value nested deeper than [`MAX_VALUE_DEPTH`]; its
/// value is the depth.
pub const TOO_DEEP: &str = "$quiver/nestsDeeperThanAccepted";

/// The depth of a too-deep marker, if `v` is one.
pub fn too_deep(v: &Value) -> Option<u64> {
    match v {
        Value::Object(o) if o.len() == 1 => o.get(TOO_DEEP).and_then(Value::as_u64),
        _ => None,
    }
}

/// How deeply JSON text nests (`1` and `"x"` are 1, `[1]` is 2), scanned without recursion.
fn text_depth(json: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in json.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest + 1
}

/// A JSON value read with the rules above.
struct Json(Value);

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct(RAW_TOKEN, JsonVisitor).map(Json)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Value::Object(Map::new()));
        };
        if first == RAW_TOKEN {
            // serde_json's raw text: parse it only when it is shallow enough.
            let raw: String = map.next_value()?;
            let depth = text_depth(&raw);
            if depth > MAX_VALUE_DEPTH {
                let mut marker = Map::new();
                marker.insert(TOO_DEEP.to_owned(), Value::from(depth));
                return Ok(Value::Object(marker));
            }
            return serde_json::from_str(&raw).map_err(de::Error::custom);
        }
        // A deserializer that ignored the raw-value request hands over the map itself.
        let mut out = Map::new();
        out.insert(first, map.next_value()?);
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Json::deserialize(d).map(|j| j.0)
    }
}

/// `deserialize_with` of an optional free-form value (`null` reads as absent).
pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Ok(Option::<Json>::deserialize(d)?
        .map(|j| j.0)
        .filter(|v| !v.is_null()))
}

/// `deserialize_with` of a required free-form value (depth-bounded like the others).
pub fn required<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Json::deserialize(d).map(|j| j.0)
}

/// `deserialize_with` of an optional map of free-form values.
pub fn optional_map<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, Value>>, D::Error> {
    Ok(Option::<BTreeMap<String, Json>>::deserialize(d)?
        .map(|m| m.into_iter().map(|(k, j)| (k, j.0)).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Doc {
        #[serde(default, deserialize_with = "optional")]
        v: Option<Value>,
        #[serde(default, deserialize_with = "optional_map")]
        m: Option<BTreeMap<String, Value>>,
    }

    fn nested(n: usize) -> String {
        format!("{}1{}", "[".repeat(n), "]".repeat(n))
    }

    #[test]
    fn deep_values_become_a_marker_and_the_document_still_reads() {
        for n in [40, 200, 100_000] {
            let doc: Doc =
                serde_json::from_str(&format!(r#"{{"v": {}, "m": {{"a": {}}}}}"#, nested(n), nested(n)))
                    .unwrap_or_else(|e| panic!("{n}: {e}"));
            assert_eq!(too_deep(doc.v.as_ref().unwrap()), Some(n as u64 + 1));
            assert_eq!(too_deep(&doc.m.unwrap()["a"]), Some(n as u64 + 1));
        }
        // Shallow values read as they are, strings with brackets included.
        let doc: Doc =
            serde_json::from_str(r#"{"v": {"a": ["[[[\"]]", {"b": null}]}, "m": {"x": 1}}"#).unwrap();
        assert_eq!(doc.v.unwrap(), serde_json::json!({"a": ["[[[\"]]", {"b": null}]}));
        assert_eq!(doc.m.unwrap()["x"], 1);
        let doc: Doc = serde_json::from_str(r#"{"v": null}"#).unwrap();
        assert!(doc.v.is_none() && doc.m.is_none());
    }

    #[test]
    fn other_formats_read_plain_values() {
        let doc: Doc = serde_saphyr::from_str("v: {a: [1, x]}\nm: {k: {type: string}}\n").unwrap();
        assert_eq!(doc.v.unwrap(), serde_json::json!({"a": [1, "x"]}));
        assert_eq!(doc.m.unwrap()["k"], serde_json::json!({"type": "string"}));
        let doc: Doc = serde_json::from_value(serde_json::json!({"v": [1, {"a": 2}]})).unwrap();
        assert_eq!(doc.v.unwrap(), serde_json::json!([1, {"a": 2}]));
    }

    #[test]
    fn text_depth_skips_strings() {
        assert_eq!(text_depth("1"), 1);
        assert_eq!(text_depth(r#"[{"a": "[[[[\"{{"}]"#), 3);
        assert_eq!(text_depth(&nested(33)), 34);
    }
}

//! An offline check of a document against the CRD's structural schema (the one the operator
//! generates): types, required and unknown fields, enums, lengths, ranges, counts and
//! patterns, each problem naming its field (`spec.replicas: ...`). CEL rules are left to the
//! API server (`kubectl apply --dry-run=server` runs them).

use quiver_model::schema::type_name;
use serde_json::Value;

/// Most problems reported.
pub const MAX_PROBLEMS: usize = 100;
/// Deepest nesting walked.
const MAX_DEPTH: usize = 64;

/// The problems of `value` against `schema`, at `path`.
pub fn problems(schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, value, path, 0, &mut out);
    out.truncate(MAX_PROBLEMS);
    out
}

fn num(s: &Value, key: &str) -> Option<f64> {
    s.get(key).and_then(Value::as_f64)
}

fn count(s: &Value, key: &str) -> Option<usize> {
    s.get(key)
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
}

fn walk(schema: &Value, value: &Value, path: &str, depth: usize, out: &mut Vec<String>) {
    if out.len() >= MAX_PROBLEMS || depth > MAX_DEPTH {
        return;
    }
    if value.is_null() && schema.get("nullable") == Some(&Value::Bool(true)) {
        return;
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            out.push(format!(
                "{path}: must be an integer or a string, not {}",
                type_name(value)
            ));
        }
        return;
    }
    let Some(want) = schema.get("type").and_then(Value::as_str) else {
        return;
    };
    let got = type_name(value);
    let fits = got == want || (want == "number" && got == "integer");
    if !fits {
        let article = if matches!(want, "integer" | "object" | "array") {
            "an"
        } else {
            "a"
        };
        out.push(format!("{path}: must be {article} {want}, not {got}"));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(format!("{path}: must be one of {}", list.join(", ")));
    }
    match value {
        Value::String(s) => string(schema, s, path, out),
        Value::Number(_) => {
            let n = value.as_f64().unwrap_or_default();
            if let Some(min) = num(schema, "minimum")
                && n < min
            {
                out.push(format!("{path}: must be at least {min}"));
            }
            if let Some(max) = num(schema, "maximum")
                && n > max
            {
                out.push(format!("{path}: must be at most {max}"));
            }
        }
        Value::Array(items) => {
            if let Some(max) = count(schema, "maxItems")
                && items.len() > max
            {
                out.push(format!("{path}: at most {max} items, not {}", items.len()));
            }
            if let Some(min) = count(schema, "minItems")
                && items.len() < min
            {
                out.push(format!("{path}: at least {min} items"));
            }
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    walk(item, v, &format!("{path}[{i}]"), depth + 1, out);
                }
            }
        }
        Value::Object(map) => object(schema, map, path, depth, out),
        _ => {}
    }
}

fn string(schema: &Value, s: &str, path: &str, out: &mut Vec<String>) {
    let len = s.chars().count();
    if let Some(max) = count(schema, "maxLength")
        && len > max
    {
        out.push(format!("{path}: at most {max} characters, not {len}"));
    }
    if let Some(min) = count(schema, "minLength")
        && len < min
    {
        out.push(format!("{path}: at least {min} character(s)"));
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(p) {
            Ok(re) if !re.is_match(s) => out.push(format!("{path}: must match {p}")),
            _ => {}
        }
    }
}

fn object(
    schema: &Value,
    map: &serde_json::Map<String, Value>,
    path: &str,
    depth: usize,
    out: &mut Vec<String>,
) {
    let dot = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    if let Some(max) = count(schema, "maxProperties")
        && map.len() > max
    {
        out.push(format!("{path}: at most {max} entries, not {}", map.len()));
    }
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(k) = r.as_str()
            && !map.contains_key(k)
        {
            out.push(format!("{}: required", dot(k)));
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let additional = schema.get("additionalProperties");
    for (k, v) in map {
        match (properties.and_then(|p| p.get(k)), additional) {
            (Some(s), _) => walk(s, v, &dot(k), depth + 1, out),
            (None, Some(s)) if s.is_object() => walk(s, v, &dot(k), depth + 1, out),
            (None, _) if properties.is_some() && !preserve => {
                out.push(format!("{}: unknown field", dot(k)));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_class_of_mismatch_names_its_field() {
        let schema = json!({"type": "object", "required": ["spec"], "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer", "minimum": 0, "maximum": 1000},
                "kind": {"type": "string", "enum": ["A", "B"]},
                "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
                "list": {"type": "array", "maxItems": 1, "items": {"type": "object", "properties": {"x": {"type": "boolean"}}}},
                "labels": {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "string"}},
                "port": {"x-kubernetes-int-or-string": true},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }}
        }});
        let doc = json!({"spec": {
            "replicas": 2000, "kind": "C", "name": "ABCD", "list": [{"x": 1}, {"y": true}],
            "labels": {"a": "1", "b": 2}, "port": [1], "free": {"anything": 1}, "extra": 1
        }});
        let p = problems(&schema, &doc, "");
        for want in [
            "spec.replicas: must be at most 1000",
            "spec.kind: must be one of \"A\", \"B\"",
            "spec.name: at most 3 characters, not 4",
            "spec.name: must match ^[a-z]+$",
            "spec.list: at most 1 items, not 2",
            "spec.list[0].x: must be a boolean, not integer",
            "spec.list[1].y: unknown field",
            "spec.labels: at most 1 entries, not 2",
            "spec.labels.b: must be a string, not integer",
            "spec.port: must be an integer or a string, not array",
            "spec.extra: unknown field",
        ] {
            assert!(p.contains(&want.to_owned()), "missing {want:?} in {p:#?}");
        }
        assert_eq!(p.len(), 11, "{p:#?}");
        assert_eq!(problems(&schema, &json!({}), ""), ["spec: required"]);
        assert_eq!(
            problems(&schema, &json!({"spec": 1}), ""),
            ["spec: must be an object, not integer"]
        );
    }
}

//! The "try it" form of a tool: fields from its input schema, and the arguments of a
//! submitted form. Fields the form cannot express plainly (objects, arrays, anything
//! without a simple type) take JSON.

use serde_json::{Map, Value};

/// Most fields of one form.
pub const MAX_FIELDS: usize = 64;
/// Longest value of one field, in bytes.
pub const MAX_VALUE: usize = 64 << 10;

/// How a field is entered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A line of text.
    Text,
    /// A whole number.
    Integer,
    /// A number.
    Number,
    /// A checkbox.
    Boolean,
    /// One of these values (their JSON).
    Choice(Vec<String>),
    /// JSON.
    Json,
}

/// One field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The argument's name.
    pub name: String,
    /// How it is entered.
    pub kind: Kind,
    /// Whether the tool requires it.
    pub required: bool,
    /// Its description.
    pub description: String,
}

/// The fields of `schema` (an object schema), in the order of its properties.
pub fn fields(schema: &Value) -> Vec<Field> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).take(MAX_FIELDS).collect())
        .unwrap_or_default();
    let Some(props) = schema["properties"].as_object() else {
        return Vec::new();
    };
    // The required fields first, in the order the schema requires them; then the rest by name.
    let first = required
        .iter()
        .enumerate()
        .filter(|(i, r)| !required[..*i].contains(r))
        .filter_map(|(_, r)| props.get_key_value(*r));
    let rest = props
        .iter()
        .filter(|(name, _)| !required.contains(&name.as_str()));
    first
        .chain(rest)
        .take(MAX_FIELDS)
        .map(|(name, p)| Field {
            name: name.clone(),
            kind: kind(p),
            required: required.contains(&name.as_str()),
            description: p["description"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

fn kind(p: &Value) -> Kind {
    if let Some(values) = p["enum"].as_array().filter(|v| !v.is_empty() && v.len() <= 256) {
        return Kind::Choice(values.iter().map(Value::to_string).collect());
    }
    match p["type"].as_str() {
        Some("string") => Kind::Text,
        Some("integer") => Kind::Integer,
        Some("number") => Kind::Number,
        Some("boolean") => Kind::Boolean,
        _ => Kind::Json,
    }
}

/// The arguments of a submitted form: `values` are its `(field, value)` pairs (unknown
/// fields are ignored; an empty optional field is left out).
///
/// # Errors
/// The first field that does not hold its kind, and why.
pub fn arguments(fields: &[Field], values: &[(String, String)]) -> Result<Map<String, Value>, String> {
    let mut args = Map::new();
    for f in fields {
        let given = values.iter().find(|(k, _)| *k == f.name).map(|(_, v)| v.as_str());
        if given.is_some_and(|v| v.len() > MAX_VALUE) {
            return Err(format!("{}: longer than {MAX_VALUE} bytes", f.name));
        }
        let value = match (&f.kind, given) {
            (Kind::Boolean, v) => {
                if v.is_none() && !f.required {
                    continue;
                }
                Value::Bool(v.is_some())
            }
            (_, None | Some("")) if !f.required => continue,
            (_, None | Some("")) => return Err(format!("{}: required", f.name)),
            (Kind::Text, Some(v)) => Value::String(v.to_owned()),
            (Kind::Integer, Some(v)) => v
                .trim()
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| format!("{}: not a whole number", f.name))?,
            (Kind::Number, Some(v)) => v
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|n| serde_json::Number::from_f64(n).map(Value::Number))
                .ok_or_else(|| format!("{}: not a number", f.name))?,
            (Kind::Choice(choices), Some(v)) => {
                let picked = choices
                    .iter()
                    .find(|c| *c == v)
                    .ok_or_else(|| format!("{}: not one of the choices", f.name))?;
                serde_json::from_str(picked).map_err(|_| format!("{}: not one of the choices", f.name))?
            }
            (Kind::Json, Some(v)) => {
                serde_json::from_str(v).map_err(|e| format!("{}: not JSON ({e})", f.name))?
            }
        };
        args.insert(f.name.clone(), value);
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "required": ["days", "city", "gone", "days"], "properties": {
            "city": {"type": "string", "description": "Where"},
            "days": {"type": "integer"},
            "ratio": {"type": "number"},
            "metric": {"type": "boolean"},
            "unit": {"enum": ["c", "f", 3]},
            "tags": {"type": "array", "items": {"type": "string"}},
        }})
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn fields_follow_the_schema() {
        let f = fields(&schema());
        let kinds: Vec<(&str, &Kind, bool)> =
            f.iter().map(|f| (f.name.as_str(), &f.kind, f.required)).collect();
        // Required fields first, in the schema's order; then the others by name.
        assert_eq!(kinds[0], ("days", &Kind::Integer, true));
        assert_eq!(kinds[1], ("city", &Kind::Text, true));
        assert_eq!(kinds[2], ("metric", &Kind::Boolean, false));
        assert_eq!(kinds[3], ("ratio", &Kind::Number, false));
        assert_eq!(kinds[4].1, &Kind::Json);
        assert_eq!(
            kinds[5].1,
            &Kind::Choice(vec!["\"c\"".into(), "\"f\"".into(), "3".into()])
        );
        assert_eq!(f[1].description, "Where");
        assert!(fields(&json!({"type": "object"})).is_empty());
        assert!(fields(&json!("not a schema")).is_empty());
    }

    #[test]
    fn a_submitted_form_becomes_typed_arguments() {
        let f = fields(&schema());
        let a = arguments(
            &f,
            &pairs(&[
                ("city", "Oslo"),
                ("days", " 3 "),
                ("ratio", "0.5"),
                ("metric", "on"),
                ("unit", "3"),
                ("tags", "[\"a\"]"),
                ("other", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(
            Value::Object(a),
            json!({"city": "Oslo", "days": 3, "ratio": 0.5, "metric": true, "unit": 3, "tags": ["a"]})
        );
        // Empty optional fields are left out; an unchecked optional box too.
        let a = arguments(
            &f,
            &pairs(&[("city", "Oslo"), ("days", "1"), ("ratio", ""), ("tags", "")]),
        )
        .unwrap();
        assert_eq!(Value::Object(a), json!({"city": "Oslo", "days": 1}));
    }

    #[test]
    fn a_wrong_value_is_named() {
        let f = fields(&schema());
        let bad = [
            (vec![("days", "1")], "city: required"),
            (vec![("city", "x"), ("days", "1.5")], "days: not a whole number"),
            (
                vec![("city", "x"), ("days", "1"), ("ratio", "NaN")],
                "ratio: not a number",
            ),
            (
                vec![("city", "x"), ("days", "1"), ("unit", "\"c\"; drop")],
                "unit: not one of the choices",
            ),
            (
                vec![("city", "x"), ("days", "1"), ("tags", "[")],
                "tags: not JSON",
            ),
        ];
        for (p, why) in bad {
            let e = arguments(&f, &pairs(&p)).unwrap_err();
            assert!(e.starts_with(why), "{e}");
        }
        let long = "x".repeat(MAX_VALUE + 1);
        assert!(
            arguments(&f, &pairs(&[("city", &long), ("days", "1")]))
                .unwrap_err()
                .contains("longer than")
        );
    }
}

//! OpenAPI schemas to the JSON Schema tools declare: every keyword is kept as the author
//! wrote it (composition, conditionals, annotations, extensions), 3.0's `nullable` and
//! boolean exclusive bounds are rewritten, and references to
//! `components/schemas` (2.0: `definitions`) become references into the tool schema's own
//! `$defs`, which holds just the components the operation reaches.

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};

use super::document::{Document, Version, shown};

/// Most components (`$defs`) one operation's schemas may reach.
pub const MAX_DEFS: usize = 256;
/// Longest description kept inside a schema, in characters.
const MAX_SCHEMA_DESCRIPTION: usize = 300;

/// The converter of one document: components converted once, shared by every operation.
pub(super) struct Converter<'a> {
    doc: &'a Document,
    components: Option<&'a Map<String, Value>>,
    cache: FxHashMap<&'a str, Result<(Value, Vec<String>), String>>,
}

/// What a converted schema reaches: component names, in the order met.
#[derive(Default)]
pub(super) struct Reached {
    pub names: Vec<String>,
}

impl<'a> Converter<'a> {
    pub(super) fn new(doc: &'a Document) -> Self {
        let components = match doc.version {
            Version::Swagger2 => doc.root.get("definitions"),
            _ => doc.root.get("components").and_then(|c| c.get("schemas")),
        }
        .and_then(Value::as_object);
        Self {
            doc,
            components,
            cache: FxHashMap::default(),
        }
    }

    /// The document.
    pub(super) fn root(&self) -> &'a Value {
        &self.doc.root
    }

    /// The document's version.
    pub(super) fn version(&self) -> Version {
        self.doc.version
    }

    /// Converts `v` (a schema of the document), adding the components it refers to to `reached`.
    ///
    /// # Errors
    /// A reference outside the document's component schemas.
    pub(super) fn convert(&self, v: &Value, reached: &mut Reached) -> Result<Value, String> {
        convert(v, self.doc.version, reached, 0)
    }

    /// The `$defs` of a schema that reached `reached`: every component it reaches, directly
    /// or through others (at most [`MAX_DEFS`]).
    ///
    /// # Errors
    /// A component that does not exist, or is not convertible, or more than [`MAX_DEFS`].
    pub(super) fn defs(&mut self, reached: &mut Reached) -> Result<Map<String, Value>, String> {
        let mut defs = Map::new();
        let mut i = 0;
        while let Some(name) = reached.names.get(i).cloned() {
            i += 1;
            if defs.contains_key(&name) {
                continue;
            }
            if defs.len() >= MAX_DEFS {
                return Err(format!(
                    "its schemas reach more than {MAX_DEFS} component schemas"
                ));
            }
            let (key, target) = self
                .components
                .and_then(|c| c.get_key_value(&name))
                .ok_or_else(|| format!("`{}` names no component schema", shown(&name)))?;
            let version = self.doc.version;
            let (converted, more) = self
                .cache
                .entry(key.as_str())
                .or_insert_with(|| {
                    let mut inner = Reached::default();
                    convert(target, version, &mut inner, 0).map(|v| (v, inner.names))
                })
                .clone()
                .map_err(|e| format!("component `{}`: {e}", shown(&name)))?;
            reached.names.extend(more);
            defs.insert(name, converted);
        }
        Ok(defs)
    }
}

/// The JSON pointer segment of a component name (RFC 6901 escapes).
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

/// The component a reference names, if it names one.
fn component_of(r: &str, version: Version) -> Option<String> {
    let prefix = match version {
        Version::Swagger2 => "#/definitions/",
        _ => "#/components/schemas/",
    };
    r.strip_prefix(prefix)
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
        .map(unescape)
}

fn convert(v: &Value, version: Version, reached: &mut Reached, depth: usize) -> Result<Value, String> {
    // The document's nesting is bounded; this only guards the recursion itself.
    if depth > super::MAX_OPENAPI_DEPTH {
        return Err("a schema nests too deep".to_owned());
    }
    let Some(o) = v.as_object() else {
        // `true`/`false` schemas (3.1) stay; anything else accepts anything.
        return Ok(if v.is_boolean() {
            v.clone()
        } else {
            Value::Bool(true)
        });
    };
    let mut out = Map::new();
    for (k, x) in o {
        match k.as_str() {
            "$ref" => {
                let r = x.as_str().unwrap_or_default();
                let name = component_of(r, version).ok_or_else(|| {
                    format!(
                        "`{}`: only references to component schemas are supported",
                        shown(r)
                    )
                })?;
                out.insert(k.clone(), Value::String(format!("#/$defs/{}", escape(&name))));
                reached.names.push(name);
            }
            "properties" => {
                let mut props = Map::new();
                for (name, sub) in x.as_object().into_iter().flatten() {
                    props.insert(name.clone(), convert(sub, version, reached, depth + 1)?);
                }
                out.insert(k.clone(), Value::Object(props));
            }
            "items" if x.is_object() || x.is_boolean() => {
                out.insert(k.clone(), convert(x, version, reached, depth + 1)?);
            }
            "additionalProperties" => {
                out.insert(k.clone(), convert(x, version, reached, depth + 1)?);
            }
            "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "additionalItems"
            | "unevaluatedItems"
            | "unevaluatedProperties"
            | "contentSchema" => {
                out.insert(k.clone(), convert(x, version, reached, depth + 1)?);
            }
            "patternProperties" | "dependentSchemas" => {
                let mut map = Map::new();
                for (name, sub) in x.as_object().into_iter().flatten() {
                    map.insert(name.clone(), convert(sub, version, reached, depth + 1)?);
                }
                out.insert(k.clone(), Value::Object(map));
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" | "items" => {
                let list = x
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| convert(s, version, reached, depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                if !list.is_empty() {
                    out.insert(k.clone(), Value::Array(list));
                }
            }
            "description" => {
                if let Some(d) = x.as_str() {
                    out.insert(k.clone(), Value::String(bounded(d, MAX_SCHEMA_DESCRIPTION)));
                }
            }
            // 3.0's forms, rewritten below; 2.0's `file` is no JSON type.
            "nullable" => {}
            "exclusiveMinimum" | "exclusiveMaximum" if !x.is_number() => {}
            "type" if x.as_str() == Some("file") => {}
            // Every other keyword as the author wrote it: checked ones, annotations
            // (`example`, `discriminator`, `externalDocs`), extensions (`x-...`).
            _ => {
                out.insert(k.clone(), x.clone());
            }
        }
    }
    exclusive(o, &mut out);
    if version != Version::V31 && o.get("nullable") == Some(&Value::Bool(true)) {
        nullable(&mut out);
    }
    Ok(Value::Object(out))
}

/// 3.0's boolean `exclusiveMinimum: true` (beside `minimum`) in 3.1's number form.
fn exclusive(o: &Map<String, Value>, out: &mut Map<String, Value>) {
    for (ex, bound) in [("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")] {
        if o.get(ex) == Some(&Value::Bool(true))
            && let Some(n) = o.get(bound).filter(|n| n.is_number())
        {
            out.insert(ex.to_owned(), n.clone());
            out.remove(bound);
        }
    }
}

/// 3.0's `nullable: true`: `null` joins the types (and the enum, if any).
fn nullable(out: &mut Map<String, Value>) {
    match out.get_mut("type") {
        Some(Value::String(t)) => {
            let t = std::mem::take(t);
            out.insert(
                "type".into(),
                Value::Array(vec![Value::String(t), Value::String("null".into())]),
            );
        }
        Some(Value::Array(types)) if !types.iter().any(|t| t == "null") => {
            types.push(Value::String("null".into()));
        }
        _ => {}
    }
    if let Some(Value::Array(values)) = out.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
}

/// `s` cut to at most `max` characters (with `…` when cut).
pub(super) fn bounded(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((i, _)) => {
            let mut out = s[..i].to_owned();
            out.push('…');
            out
        }
    }
}

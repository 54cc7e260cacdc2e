//! An OpenAPI document: parsed within bounds (size, nesting, YAML expansion, operations),
//! its version told, its base URL found, and its operations listed.

use std::io::Read;

use serde_json::{Map, Value};

/// Largest document accepted, in bytes.
pub const MAX_OPENAPI_BYTES: usize = 16 << 20;
/// Deepest nesting accepted in a document.
pub const MAX_OPENAPI_DEPTH: usize = 64;
/// Most operations a document may declare (served or not).
pub const MAX_OPERATIONS: usize = 10_000;

/// The methods an OpenAPI path item may have operations for, that a tool can call.
pub(super) const METHODS: [&str; 6] = ["get", "put", "post", "delete", "patch", "head"];

/// Reads a document file, refusing one over [`MAX_OPENAPI_BYTES`].
pub(super) fn read_bounded(path: &std::path::Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_OPENAPI_BYTES as u64 + 1)
        .read_to_string(&mut text)?;
    if text.len() > MAX_OPENAPI_BYTES {
        return Err(std::io::Error::other("too large"));
    }
    Ok(text)
}

/// Which specification a document follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    /// Swagger 2.0.
    Swagger2,
    /// OpenAPI 3.0.x.
    V30,
    /// OpenAPI 3.1.x.
    V31,
}

/// A parsed document.
pub(super) struct Document {
    pub root: Value,
    pub version: Version,
}

fn yaml_options() -> serde_saphyr::Options {
    let mut options = crate::config::yaml_options();
    if let Some(b) = options.budget.as_mut() {
        b.max_reader_input_bytes = Some(MAX_OPENAPI_BYTES);
        b.max_total_scalar_bytes = MAX_OPENAPI_BYTES;
        // API documents are large; aliases still cannot multiply them ("billion laughs").
        b.max_nodes = 2_000_000;
        b.max_events = 4_000_000;
    }
    options
}

/// Parses a document (JSON, or YAML) and checks its bounds and version.
///
/// # Errors
/// Too large, too deep, not JSON or YAML, not an OpenAPI 3.0/3.1 or Swagger 2.0 document,
/// or more than [`MAX_OPERATIONS`] operations; the message never quotes the document.
pub(super) fn parse(text: &str) -> Result<Document, String> {
    if text.len() > MAX_OPENAPI_BYTES {
        return Err(format!(
            "the document has {} bytes; at most {MAX_OPENAPI_BYTES} are accepted",
            text.len()
        ));
    }
    let trimmed = text.trim_start();
    let root: Value = if trimmed.starts_with('{') {
        serde_json::from_str(text).map_err(|e| {
            format!(
                "not JSON: {} at line {} column {}",
                json_error_kind(&e),
                e.line(),
                e.column()
            )
        })?
    } else {
        serde_saphyr::from_str_with_options(text, yaml_options())
            .map_err(|e| format!("not YAML: {}", crate::config::redact_message(&e.to_string())))?
    };
    let depth = crate::template::depth(&root);
    if depth > MAX_OPENAPI_DEPTH {
        return Err(format!(
            "nests {depth} deep; at most {MAX_OPENAPI_DEPTH} levels are accepted"
        ));
    }
    let version = version(&root)?;
    let count = operations(&root).count();
    if count > MAX_OPERATIONS {
        return Err(format!(
            "declares {count} operations; at most {MAX_OPERATIONS} are accepted"
        ));
    }
    Ok(Document { root, version })
}

fn json_error_kind(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "a syntax error (or nesting over 128 levels)",
        serde_json::error::Category::Data => "an unexpected value",
        serde_json::error::Category::Eof => "the text ends early",
    }
}

fn version(root: &Value) -> Result<Version, String> {
    if let Some(v) = root.get("openapi").and_then(Value::as_str) {
        if v.starts_with("3.0") {
            return Ok(Version::V30);
        }
        if v.starts_with("3.1") {
            return Ok(Version::V31);
        }
        return Err("`openapi`: only versions 3.0 and 3.1 are supported".to_owned());
    }
    if root.get("swagger").and_then(Value::as_str) == Some("2.0") {
        return Ok(Version::Swagger2);
    }
    Err("not an OpenAPI document: no `openapi: 3.x` (or `swagger: \"2.0\"`) field".to_owned())
}

/// One operation: its method (lower case), path template, path item and operation object.
pub(super) struct Op<'a> {
    pub method: &'static str,
    pub path: &'a str,
    pub item: &'a Map<String, Value>,
    pub op: &'a Map<String, Value>,
}

/// Every operation of the document, by path (in key order) and method.
pub(super) fn operations(root: &Value) -> impl Iterator<Item = Op<'_>> {
    root.get("paths")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(path, item)| Some((path.as_str(), item.as_object()?)))
        .flat_map(|(path, item)| {
            METHODS.iter().filter_map(move |m| {
                Some(Op {
                    method: m,
                    path,
                    item,
                    op: item.get(*m)?.as_object()?,
                })
            })
        })
}

/// Which of the document's servers requests go to: `serverIndex`, `serverVariables`, and
/// where the document was fetched from (relative server URLs are resolved against it).
pub(super) struct ServerChoice<'a> {
    pub index: usize,
    pub variables: &'a std::collections::BTreeMap<String, String>,
    pub fetched_from: Option<&'a str>,
}

/// The base URL of the document's requests: the chosen server (variables as set, else at
/// their defaults) for 3.x, `schemes[0]://host basePath` for 2.0, resolved against the URL
/// the document came from when relative or absent; `None` when it cannot be made absolute.
///
/// # Errors
/// A `serverIndex` past the document's servers, or a variable it does not declare or whose
/// value its `enum` does not allow.
pub(super) fn base_url(doc: &Document, choice: &ServerChoice<'_>) -> Result<Option<String>, String> {
    let root = &doc.root;
    if doc.version == Version::Swagger2 {
        let from = choice.fetched_from.and_then(split_origin);
        let Some(host) = root.get("host").and_then(Value::as_str).or(from.map(|f| f.1)) else {
            return Ok(None);
        };
        let scheme = root
            .get("schemes")
            .and_then(Value::as_array)
            .and_then(|s| {
                s.iter()
                    .filter_map(Value::as_str)
                    .find(|s| *s == "https" || *s == "http")
            })
            .or(from.map(|f| f.0))
            .unwrap_or("https");
        let base = root.get("basePath").and_then(Value::as_str).unwrap_or("");
        return Ok(Some(format!("{scheme}://{host}{base}")));
    }
    // No `servers` means one server at `/`: where the document is served.
    let slash = serde_json::json!({"url": "/"});
    let servers = root
        .get("servers")
        .and_then(Value::as_array)
        .filter(|s| !s.is_empty());
    let server = match servers {
        Some(list) => list.get(choice.index).ok_or_else(|| {
            format!(
                "`serverIndex` is {} but the document has {} servers",
                choice.index,
                list.len()
            )
        })?,
        None if choice.index == 0 => &slash,
        None => {
            return Err(format!(
                "`serverIndex` is {} but the document has no servers",
                choice.index
            ));
        }
    };
    let Some(mut url) = server.get("url").and_then(Value::as_str).map(str::to_owned) else {
        return Ok(None);
    };
    let declared = server.get("variables").and_then(Value::as_object);
    for name in choice.variables.keys() {
        if !declared.is_some_and(|d| d.contains_key(name)) {
            return Err(format!(
                "`serverVariables.{}`: the server declares no such variable",
                shown(name)
            ));
        }
    }
    for (name, var) in declared.into_iter().flatten() {
        let allowed: Vec<&str> = var
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let value = match choice.variables.get(name) {
            Some(v) if !allowed.is_empty() && !allowed.contains(&v.as_str()) => {
                return Err(format!(
                    "`serverVariables.{}`: `{}` is not one of {allowed:?}",
                    shown(name),
                    shown(v)
                ));
            }
            Some(v) => v.as_str(),
            None => match var.get("default").and_then(Value::as_str) {
                Some(d) => d,
                None => continue,
            },
        };
        url = url.replace(&format!("{{{name}}}"), value);
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Some(url));
    }
    Ok(choice.fetched_from.and_then(|from| resolve(from, &url)))
}

/// `(scheme, authority)` of an absolute http(s) URL.
fn split_origin(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (matches!(scheme, "http" | "https") && !authority.is_empty()).then_some((scheme, authority))
}

/// A relative server URL (`/api`, `api/v1`, `./v1`) resolved against the URL of the document;
/// `None` for anything else (`..`, a scheme-relative `//host`, a query or fragment).
fn resolve(from: &str, rel: &str) -> Option<String> {
    let (scheme, authority) = split_origin(from)?;
    if rel.starts_with("//") || rel.contains(['?', '#', '{', '}']) || rel.split('/').any(|s| s == "..") {
        return None;
    }
    if rel.starts_with('/') {
        return Some(format!("{scheme}://{authority}{rel}"));
    }
    let path = from[scheme.len() + 3 + authority.len()..]
        .split(['?', '#'])
        .next()
        .unwrap_or("");
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let dir = if dir.is_empty() { "/" } else { dir };
    Some(format!(
        "{scheme}://{authority}{dir}{}",
        rel.trim_start_matches("./")
    ))
}

/// Follows a local `$ref` of the document (`#/components/parameters/x`), up to 8 in a row.
///
/// # Errors
/// A reference that is not local or points at nothing, or a chain longer than 8.
pub(super) fn deref<'a>(root: &'a Value, mut v: &'a Value) -> Result<&'a Value, String> {
    for _ in 0..8 {
        let Some(r) = v.get("$ref").and_then(Value::as_str) else {
            return Ok(v);
        };
        let pointer = r.strip_prefix('#').ok_or_else(|| {
            format!(
                "`{}`: only references within the document are supported",
                shown(r)
            )
        })?;
        v = root
            .pointer(pointer)
            .ok_or_else(|| format!("`{}` points at nothing in the document", shown(r)))?;
    }
    Err("references refer to references more than 8 times in a row".to_owned())
}

/// A string of the document as messages show it: at most 100 characters.
pub(super) fn shown(s: &str) -> String {
    if s.chars().count() <= 100 {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(100).collect();
    out.push('…');
    out
}

//! The pinned view of an OpenAPI operation (`pin: warn | enforce`): what the document says
//! of the operation's tool and of the request it makes, and nothing the author sets (a
//! rename, a description or annotations override, a projection: changing those needs no
//! approval). Kept within bounds: a hostile document chooses the size of every part.

use serde_json::{Map, Value, json};

use super::document::{Op, Version, deref};
use super::security::schemes;
use crate::config::upstream::pin::{PinMode, Seen, digest};
use crate::handlers::http::{ArgParts, BodyEncoding, ParamPlace};
use crate::template::approx_size;

/// Largest definition kept whole for the diff; a larger one keeps its digest only (which
/// covers all of it).
const MAX_VIEW_BYTES: usize = 16 * 1024;
/// Most bytes of definitions one source keeps; past them, digests only.
const MAX_SOURCE_VIEW_BYTES: usize = 4 << 20;

/// The pinned views of the tools of an OpenAPI source with `pin: warn | enforce`.
#[derive(Debug, Clone)]
pub struct PinnedSource {
    /// `openapi.NAME` ([`crate::config::upstream::pin::openapi_source`]): the source's record
    /// key, and how people see it named (`kubectl quiver approve --upstream openapi.NAME`).
    pub source: String,
    /// `warn` or `enforce`.
    pub mode: PinMode,
    /// Each served tool's name and the pinned view of its operation, whose `remote` is the
    /// operation's key (as in `tools.rename`).
    pub tools: Vec<(String, Seen)>,
    /// Bytes of the definitions kept so far.
    kept: usize,
}

impl PinnedSource {
    /// No views yet.
    pub(super) fn new(source: String, mode: PinMode) -> Self {
        Self {
            source,
            mode,
            tools: Vec::new(),
            kept: 0,
        }
    }

    /// Adds the view of the tool served as `name`; past the source's byte budget, only its
    /// digest is kept.
    pub(super) fn push(&mut self, name: String, mut seen: Seen) {
        let size = approx_size(&seen.definition);
        if self.kept + size > MAX_SOURCE_VIEW_BYTES {
            seen.definition = digest_only(&seen.remote, size);
        } else {
            self.kept += size;
        }
        self.tools.push((name, seen));
    }
}

fn digest_only(key: &str, size: usize) -> Value {
    json!({"name": key, "kept": format!("digest only: the definition has about {size} bytes")})
}

/// What an operation's view is made of.
pub(super) struct ViewParts<'a> {
    /// The operation's key.
    pub key: &'a str,
    pub op: &'a Op<'a>,
    pub root: &'a Value,
    pub version: Version,
    /// The description the document gives (before any override).
    pub description: Option<String>,
    /// The input schema served.
    pub input: Option<&'a Value>,
    /// The answer's schema as the document gives it (before any projection).
    pub output: Option<&'a Value>,
    /// Where each argument goes.
    pub parts: &'a ArgParts,
    /// The server the document chose (`None`: the author's `server`).
    pub server: Option<&'a str>,
}

/// The view: its description, input and output schemas, and its request (method, path,
/// server, where each parameter goes and how, the body's encoding, the security
/// requirement and the definitions of the schemes it names).
pub(super) fn view(v: &ViewParts<'_>) -> Seen {
    let mut d = Map::new();
    d.insert("name".into(), Value::String(v.key.to_owned()));
    if let Some(text) = &v.description {
        d.insert("description".into(), Value::String(text.clone()));
    }
    if let Some(input) = v.input {
        d.insert("inputSchema".into(), input.clone());
    }
    if let Some(output) = v.output {
        d.insert("outputSchema".into(), bounded(output));
    }
    d.insert("request".into(), Value::Object(request(v)));
    let definition = Value::Object(d);
    let hash = digest(&definition);
    let size = approx_size(&definition);
    Seen {
        remote: v.key.to_owned(),
        hash,
        definition: if size <= MAX_VIEW_BYTES {
            definition
        } else {
            digest_only(v.key, size)
        },
    }
}

/// A schema, or its digest when it is larger than a whole view may be (the digest alone
/// still pins it).
fn bounded(schema: &Value) -> Value {
    if approx_size(schema) <= MAX_VIEW_BYTES {
        schema.clone()
    } else {
        json!({"sha256": digest(schema)})
    }
}

fn request(v: &ViewParts<'_>) -> Map<String, Value> {
    let mut r = Map::new();
    r.insert("method".into(), Value::String(v.op.method.to_owned()));
    r.insert("path".into(), Value::String(v.op.path.to_owned()));
    if let Some(server) = v.server {
        r.insert("server".into(), Value::String(server.to_owned()));
    }
    let params: Vec<Value> = v
        .parts
        .params
        .iter()
        .map(|p| {
            let place = match p.place {
                ParamPlace::Query => "query",
                ParamPlace::Header => "header",
                ParamPlace::Cookie => "cookie",
            };
            json!({"name": &*p.name, "in": place, "explode": p.explode, "separator": p.separator.to_string()})
        })
        .collect();
    if !params.is_empty() {
        r.insert("params".into(), Value::Array(params));
    }
    if let Some((name, encoding)) = &v.parts.body {
        let encoding = match encoding {
            BodyEncoding::Json => "json",
            BodyEncoding::Form => "form",
        };
        r.insert("body".into(), json!({"name": &**name, "encoding": encoding}));
    }
    if let Some(requirement) = v.op.op.get("security").or_else(|| v.root.get("security")) {
        r.insert("security".into(), bounded(requirement));
        // What each scheme it names is: its type, where the credential goes, its token URL.
        let named: Map<String, Value> = requirement
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .flat_map(|alt| alt.keys())
            .filter_map(|name| {
                let scheme = schemes(v.root, v.version)?.get(name)?;
                let scheme = deref(v.root, scheme).unwrap_or(scheme);
                Some((name.clone(), bounded(scheme)))
            })
            .collect();
        if !named.is_empty() {
            r.insert("schemes".into(), Value::Object(named));
        }
    }
    r
}

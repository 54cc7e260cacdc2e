//! One OpenAPI operation compiled into an http tool: its name, description, annotations,
//! input schema (parameters and body), output schema (the 2xx JSON answer) and request.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};
use serde_json::{Map, Value, json};

use super::document::{self, Document, Op, Version, deref, shown};
use super::pin::PinnedSource;
use super::schema::{Converter, Reached, bounded};
use super::security::{self, Applied};
use super::{MAX_OPENAPI_BYTES, MAX_OPENAPI_SOURCES, OpenApiSpec, valid_source_name};
use crate::config::compiled::{CompiledHandler, CompiledTool};
use crate::config::governance::{self, ToolGovernance};
use crate::config::upstream::pin::{Seen, openapi_source};
use crate::config::upstream::{Glob, MAX_DESCRIPTOR_BYTES};
use crate::handlers::http::project::Projection;
use crate::handlers::http::{self, ArgParam, ArgParts, BodyEncoding, ParamPlace, RequestParts};
use crate::schema::Schema;
use crate::spec::context::{Cx, Names, Problems, SecretRef, valid_tool_name};
use crate::template::{Authored, Template};

/// Longest tool description made from an operation's summary and description, in characters.
pub(super) const MAX_DESCRIPTION: usize = 1024;

/// What every operation of a source shares.
struct Shared<'a> {
    spec: &'a OpenApiSpec,
    base: String,
    include: Vec<Glob>,
    exclude: Vec<Glob>,
    access: Option<Arc<crate::spec::access::Access>>,
    limits: Arc<[Arc<governance::Limit>]>,
    /// OAuth2 grants of the operations so far: operations of one grant share its token.
    grants: std::cell::RefCell<Vec<Arc<http::auth::OAuth2>>>,
    /// Compiled `project` lists, by operation key.
    project: FxHashMap<String, Arc<Projection>>,
    /// Where the document came from, and the origin requests go to.
    trust: security::Trust,
    /// A fetched document chose the server ([`http::HttpCall::guarded`]).
    guarded: bool,
}

/// Where requests of source `s` go, and whether the author pinned it: `server`, an origin
/// of `allowedOrigins`, or the document's own when the document is the author's. A fetched
/// document's unpinned server may not carry credentials, nor be this host or link-local.
fn target(
    s: &OpenApiSpec,
    doc: &Document,
    at: &str,
    p: &mut Problems,
) -> Option<(String, security::Trust, bool)> {
    let base = base_url(s, doc, at, p)?;
    let Some(origin) = super::origin_of(&base) else {
        p.push(
            format!("{at}.server"),
            format!("`{}` is not an absolute http(s) URL", shown(&base)),
        );
        return None;
    };
    let allowed = super::allowed_origins(s, at, &mut Problems::default());
    if !allowed.is_empty() && !allowed.contains(&origin) {
        p.push(
            format!("{at}.server"),
            format!(
                "requests would go to `{}`, which is not one of `allowedOrigins`",
                shown(&origin)
            ),
        );
        return None;
    }
    let pinned = s.server.is_some() || !allowed.is_empty() || !s.fetched;
    if !pinned {
        if super::has_credentials(s) {
            p.push(
                format!("{at}.server"),
                format!(
                    "the document read from `url` or `configMap` sends requests to `{}`; credentials go only \
                     where the author pins them: set `server` or `allowedOrigins`",
                    shown(&origin)
                ),
            );
            return None;
        }
        if let Some(why) = crate::config::egress::host_refused(&origin) {
            p.push(
                format!("{at}.server"),
                format!(
                    "the document read from `url` or `configMap` sends requests to `{}`, {why}; \
                     set `server` or `allowedOrigins` to call it",
                    shown(&origin)
                ),
            );
            return None;
        }
    }
    let trust = security::Trust {
        fetched: s.fetched,
        origin,
    };
    Some((base, trust, !pinned))
}

/// Where the requests of source `s` go: `server`, or the document's chosen server.
fn base_url(s: &OpenApiSpec, doc: &Document, at: &str, p: &mut Problems) -> Option<String> {
    if let Some(server) = &s.server {
        return Some(server.clone());
    }
    let choice = document::ServerChoice {
        index: s.server_index.unwrap_or(0) as usize,
        variables: &s.server_variables,
        fetched_from: s.fetched_from.as_deref(),
    };
    match document::base_url(doc, &choice) {
        Ok(Some(base)) => Some(base),
        Ok(None) => {
            p.push(
                format!("{at}.server"),
                "the document names no absolute server URL; set `server`",
            );
            None
        }
        Err(e) => {
            p.push(format!("{at}.server"), e);
            None
        }
    }
}

/// What the operations of source `s` share, and the problems of its shared settings (the
/// security schemes against the document); `None` when requests can go nowhere.
fn shared<'a>(s: &'a OpenApiSpec, doc: &Document, at: &str, p: &mut Problems) -> Option<Shared<'a>> {
    let (base, trust, guarded) = target(s, doc, at, p)?;
    let t = &s.tools;
    security::check_against(&s.security, &s.headers, (&doc.root, doc.version), &trust, at, p);
    Some(Shared {
        spec: s,
        base: base.trim_end_matches('/').to_owned(),
        include: t.include.iter().map(|g| Glob::new(g)).collect(),
        exclude: t.exclude.iter().map(|g| Glob::new(g)).collect(),
        access: t
            .access
            .as_ref()
            .and_then(|a| a.compile(&format!("{at}.tools.access"), p))
            .map(Arc::new),
        limits: governance::compile_limits(
            &t.limits,
            governance::Scope::Upstream,
            &s.name,
            &format!("{at}.tools.limits"),
            p,
        )
        .into(),
        grants: Default::default(),
        project: projections(s, doc, at, p),
        trust,
        guarded,
    })
}

/// Compiles the selected operations of one source (at `at`), and their pinned views when
/// the source pins them.
pub(super) fn compile_source(
    s: &OpenApiSpec,
    doc: &Document,
    at: &str,
    taken: &mut FxHashSet<String>,
    p: &mut Problems,
) -> (Vec<CompiledTool>, Option<PinnedSource>) {
    let Some(shared) = shared(s, doc, at, p) else {
        return (Vec::new(), None);
    };
    let t = &s.tools;
    if let Some(prefix) = &t.prefix
        && !valid_tool_name(prefix)
    {
        p.push(
            format!("{at}.tools.prefix"),
            "1-128 characters of A-Z a-z 0-9 _ - .",
        );
    }
    let mut conv = Converter::new(doc);
    let mut tools = Vec::new();
    let mut seen_problems = FxHashSet::default();
    let mut pinned = s
        .pin
        .is_on()
        .then(|| PinnedSource::new(openapi_source(&s.name), s.pin));
    for op in document::operations(&doc.root) {
        let key = operation_key(&op);
        let tags: Vec<&str> = op
            .op
            .get("tags")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let selected = (shared.include.is_empty() || shared.include.iter().any(|g| g.matches(&key)))
            && !shared.exclude.iter().any(|g| g.matches(&key))
            && s.operations.selects(op.method, op.path, &tags);
        if !selected {
            continue;
        }
        let op_at = format!("{at}.paths.{}.{}", shown(op.path), op.method);
        let name = t
            .rename
            .get(&key)
            .cloned()
            .unwrap_or_else(|| format!("{}{key}", t.prefix.as_deref().unwrap_or("")));
        if !valid_tool_name(&name) {
            p.push(&op_at, format!("`{}` is not a valid tool name", shown(&name)));
            continue;
        }
        if !taken.insert(name.clone()) {
            p.push(&op_at, format!("`{name}` is already the name of another tool"));
            continue;
        }
        let mut local = Problems::default();
        match compile_op(&shared, &mut conv, &op, &key, &name, &op_at, &mut local) {
            Ok((tool, view)) => {
                if let (Some(pinned), Some(view)) = (pinned.as_mut(), view) {
                    pinned.push(name.clone(), view);
                }
                tools.push(tool);
            }
            Err(e) => p.push(&op_at, e),
        }
        for prob in local.0 {
            // What every operation shares (headers, TLS, identity) is reported once.
            let path = prob.path.replacen(&op_at, at, 1);
            if prob.path.ends_with(".url") || seen_problems.insert((path.clone(), prob.message.clone())) {
                let path = if prob.path.ends_with(".url") {
                    prob.path
                } else {
                    path
                };
                p.push(path, prob.message);
            }
        }
    }
    (tools, pinned)
}

/// The `project` lists of a source, compiled, by operation key; a key that names no operation
/// of the document is a problem (a typo would silently keep whole answers).
fn projections(
    s: &OpenApiSpec,
    doc: &Document,
    at: &str,
    p: &mut Problems,
) -> FxHashMap<String, Arc<Projection>> {
    if s.project.len() > document::MAX_OPERATIONS {
        p.push(
            format!("{at}.project"),
            format!("at most {} operations", document::MAX_OPERATIONS),
        );
    }
    if s.project.is_empty() || s.project.len() > document::MAX_OPERATIONS {
        return FxHashMap::default();
    }
    let keys: FxHashSet<String> = document::operations(&doc.root)
        .map(|op| operation_key(&op))
        .collect();
    let mut out = FxHashMap::default();
    for (key, paths) in &s.project {
        let here = format!("{at}.project.{}", shown(key));
        if !keys.contains(key) {
            p.push(
                &here,
                "names no operation of the document (keys are operationIds, as in `tools.rename`)",
            );
            continue;
        }
        if let Some(pj) = http::project::compile(paths, &here, p) {
            out.insert(key.clone(), Arc::new(pj));
        }
    }
    out
}

/// The name an operation is known by in `tools` (include, exclude, rename, descriptions):
/// its operationId sanitized to tool-name characters, or one made from its method and path.
pub(super) fn operation_key(op: &Op<'_>) -> String {
    let sanitize = |s: &str| -> String {
        let mut out = String::with_capacity(s.len());
        for c in s.chars() {
            let c = if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            };
            if !(c == '_' && out.ends_with('_')) {
                out.push(c);
            }
        }
        out.trim_matches('_').chars().take(128).collect()
    };
    if let Some(id) = op.op.get("operationId").and_then(Value::as_str) {
        let s = sanitize(id);
        if !s.is_empty() {
            return s;
        }
    }
    sanitize(&format!("{}_{}", op.method, op.path.replace(['{', '}'], "")))
}

/// The tool of one operation, and its pinned view when the source pins its operations;
/// problems of its request (headers, URL) go to `local`.
fn compile_op(
    sh: &Shared<'_>,
    conv: &mut Converter<'_>,
    op: &Op<'_>,
    key: &str,
    name: &str,
    op_at: &str,
    local: &mut Problems,
) -> Result<(CompiledTool, Option<Seen>), String> {
    let root = conv.root();
    let inputs = inputs(conv, root, op)?;
    let mut descriptor = Map::new();
    descriptor.insert("name".into(), Value::String(name.to_owned()));
    if let Some(d) = description(sh.spec, op, key) {
        descriptor.insert("description".into(), Value::String(d));
    }
    let schema_json = inputs.schema;
    let input = Schema::compile(&crate::schema::enforceable(&schema_json))
        .map_err(|e| format!("input schema: {}", first_of(&e)))?;
    descriptor.insert("inputSchema".into(), schema_json);
    let projection = sh.project.get(key);
    let mut output = output_schema(conv, root, op);
    let document_output = sh
        .spec
        .pin
        .is_on()
        .then(|| output.as_ref().map(|(json, _)| json.clone()))
        .flatten();
    if let Some(pj) = projection {
        output = output.and_then(|(json, _)| {
            let json = pj.output_schema(&json)?;
            let compiled = Schema::compile(&crate::schema::enforceable(&json)).ok()?;
            Some((json, compiled))
        });
    }
    if let Some((json, _)) = &output {
        descriptor.insert("outputSchema".into(), json.clone());
    }
    descriptor.insert("annotations".into(), annotations(sh.spec, op.method, key));
    let mut descriptor = Value::Object(descriptor);
    if crate::template::approx_size(&descriptor) > MAX_DESCRIPTOR_BYTES {
        // The answer's schema is only a hint: drop it before refusing the operation.
        if let Some(o) = descriptor.as_object_mut() {
            o.remove("outputSchema");
        }
        output = None;
        let size = crate::template::approx_size(&descriptor);
        if size > MAX_DESCRIPTOR_BYTES {
            return Err(format!(
                "its tool descriptor is about {size} bytes; at most {MAX_DESCRIPTOR_BYTES} (exclude the operation)"
            ));
        }
    }
    let applied = security::resolve(&sh.spec.security, (root, conv.version()), &sh.trust, op.op)?;
    let view = sh.spec.pin.is_on().then(|| {
        super::pin::view(&super::pin::ViewParts {
            key,
            op,
            root,
            version: conv.version(),
            description: document_description(op),
            input: descriptor.get("inputSchema"),
            output: document_output.as_ref(),
            parts: &inputs.parts,
            server: sh.spec.server.is_none().then_some(sh.base.as_str()),
        })
    });
    let mut call = request(sh, op, &inputs.path_params, inputs.parts, applied, op_at, local);
    call.project = projection.cloned();
    let tool = CompiledTool {
        name: name.to_owned(),
        descriptor,
        input,
        output: output.map(|(_, s)| Box::new(s)),
        handler: CompiledHandler::Http(Box::new(call)),
        access: sh.access.clone(),
        governance: ToolGovernance {
            limits: sh.limits.clone(),
            audit_arguments: None,
            result_guard: sh
                .spec
                .tools
                .result_guards
                .as_ref()
                .map(crate::config::guards::ResultGuard::compile),
        },
        task: (sh.spec.tools.tasks.get(key).copied()).unwrap_or(crate::config::TaskSupport::Optional),
    };
    Ok((tool, view))
}

/// Whether a header parameter is one its caller may not write: one the client sets
/// (`Accept`, `Content-Type`), one that frames the request or says which server it is for
/// (`Host`: a shared front end would hand it, with the author's credential, to another), or
/// one that carries a credential (`Authorization`, `Cookie`).
fn reserved_header(name: &str) -> bool {
    let more = [
        "host",
        "cookie",
        "authorization",
        "proxy-authorization",
        "accept",
        "content-type",
    ];
    crate::spec::checks::header_name_problem(name, &more).is_some()
}

/// The input of an operation: its schema, the path parameters the URL names, and the
/// parts of the request taken from the arguments.
struct Inputs {
    schema: Value,
    path_params: Vec<String>,
    parts: ArgParts,
}

/// The parameters of an operation: the path item's, overridden by the operation's (by name
/// and place).
fn parameters<'a>(root: &'a Value, op: &Op<'a>) -> Result<Vec<&'a Map<String, Value>>, String> {
    let mut out: Vec<&Map<String, Value>> = Vec::new();
    for list in [op.item.get("parameters"), op.op.get("parameters")] {
        for v in list.and_then(Value::as_array).into_iter().flatten() {
            let param = deref(root, v)?
                .as_object()
                .ok_or("a parameter is not an object")?;
            let id = |m: &Map<String, Value>| (m.get("name").cloned(), m.get("in").cloned());
            out.retain(|q| id(q) != id(param));
            out.push(param);
        }
    }
    Ok(out)
}

// Long: one pass over the parameters, each place in its own arm; splitting would pass seven accumulators around.
fn inputs(conv: &mut Converter<'_>, root: &Value, op: &Op<'_>) -> Result<Inputs, String> {
    let swagger = conv.version() == Version::Swagger2;
    let mut props = Map::new();
    let mut required = Vec::new();
    let mut reached = Reached::default();
    let mut parts = ArgParts::default();
    let mut path_params = Vec::new();
    let mut form = Map::new();
    let mut form_required = Vec::new();
    for param in parameters(root, op)? {
        let pname = param
            .get("name")
            .and_then(Value::as_str)
            .ok_or("a parameter has no name")?;
        let place = param.get("in").and_then(Value::as_str).unwrap_or_default();
        let is_required = place == "path" || param.get("required") == Some(&Value::Bool(true));
        let mut schema = conv.convert(&param_schema(param, swagger), &mut reached)?;
        if let (Some(d), Some(o)) = (
            param.get("description").and_then(Value::as_str),
            schema.as_object_mut(),
        ) && !o.contains_key("description")
        {
            o.insert("description".into(), Value::String(bounded(d, 300)));
        }
        let place = match place {
            "path" => {
                path_params.push(pname.to_owned());
                None
            }
            "query" => Some(ParamPlace::Query),
            "header" if reserved_header(pname) => continue,
            "header" => Some(ParamPlace::Header),
            "cookie" => Some(ParamPlace::Cookie),
            "body" if swagger => {
                let b = body_name(&props, &form);
                parts.body = Some((b.as_str().into(), BodyEncoding::Json));
                if is_required {
                    required.push(Value::String(b.clone()));
                }
                props.insert(b, schema);
                continue;
            }
            "formData" if swagger => {
                if is_required {
                    form_required.push(Value::String(pname.to_owned()));
                }
                form.insert(pname.to_owned(), schema);
                continue;
            }
            other => {
                return Err(format!(
                    "parameter `{}`: unknown place `{}`",
                    shown(pname),
                    shown(other)
                ));
            }
        };
        if props.contains_key(pname) {
            return Err(format!(
                "parameter `{}` is declared twice (in two places)",
                shown(pname)
            ));
        }
        if let Some(place) = place {
            let (explode, separator) = style(param, place, swagger);
            parts.params.push(ArgParam {
                name: pname.into(),
                place,
                explode,
                separator,
            });
        }
        if is_required {
            required.push(Value::String(pname.to_owned()));
        }
        props.insert(pname.to_owned(), schema);
    }
    if !form.is_empty() {
        let b = body_name(&props, &Map::new());
        parts.body = Some((b.as_str().into(), BodyEncoding::Form));
        if !form_required.is_empty() {
            required.push(Value::String(b.clone()));
        }
        props.insert(
            b,
            json!({"type": "object", "properties": form, "required": form_required}),
        );
    }
    if !swagger {
        request_body(
            conv,
            root,
            op,
            &mut props,
            &mut required,
            &mut parts,
            &mut reached,
        )?;
    }
    let defs = conv.defs(&mut reached)?;
    let mut schema = json!({"type": "object", "properties": props, "additionalProperties": false});
    if !required.is_empty() {
        schema["required"] = Value::Array(required);
    }
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    Ok(Inputs {
        schema,
        path_params,
        parts,
    })
}

/// The name of the body's argument: `body`, or `requestBody` when a parameter has that name.
fn body_name(props: &Map<String, Value>, form: &Map<String, Value>) -> String {
    if props.contains_key("body") || form.contains_key("body") {
        "requestBody".to_owned()
    } else {
        "body".to_owned()
    }
}

/// The schema of a parameter: 3.x `schema` (or its `content`'s), 2.0 the parameter itself.
fn param_schema(param: &Map<String, Value>, swagger: bool) -> Value {
    if swagger {
        if let Some(s) = param.get("schema") {
            return s.clone();
        }
        let mut s = param.clone();
        for k in [
            "name",
            "in",
            "required",
            "description",
            "collectionFormat",
            "allowEmptyValue",
        ] {
            s.remove(k);
        }
        return Value::Object(s);
    }
    param
        .get("schema")
        .or_else(|| {
            param
                .get("content")
                .and_then(Value::as_object)
                .and_then(|c| c.values().next())
                .and_then(|m| m.get("schema"))
        })
        .cloned()
        .unwrap_or(Value::Bool(true))
}

/// How an array of a parameter is written: exploded (repeated), or joined by a separator.
fn style(param: &Map<String, Value>, place: ParamPlace, swagger: bool) -> (bool, char) {
    if swagger {
        return match param.get("collectionFormat").and_then(Value::as_str) {
            Some("multi") => (true, ','),
            Some("ssv") => (false, ' '),
            Some("pipes") => (false, '|'),
            Some("tsv") => (false, '\t'),
            _ => (false, ','),
        };
    }
    let style = param.get("style").and_then(Value::as_str);
    let default_explode = place != ParamPlace::Header && matches!(style, None | Some("form"));
    let explode = param
        .get("explode")
        .and_then(Value::as_bool)
        .unwrap_or(default_explode);
    match style {
        Some("spaceDelimited") => (false, ' '),
        Some("pipeDelimited") => (false, '|'),
        _ => (explode, ','),
    }
}

/// The JSON or form request body of a 3.x operation, as the argument `body`.
fn request_body(
    conv: &Converter<'_>,
    root: &Value,
    op: &Op<'_>,
    props: &mut Map<String, Value>,
    required: &mut Vec<Value>,
    parts: &mut ArgParts,
    reached: &mut Reached,
) -> Result<(), String> {
    let Some(rb) = op.op.get("requestBody") else {
        return Ok(());
    };
    let rb = deref(root, rb)?;
    let content = rb.get("content").and_then(Value::as_object);
    let pick = |want: &dyn Fn(&str) -> bool| {
        content
            .into_iter()
            .flatten()
            .find(|(k, _)| want(&k.split(';').next().unwrap_or("").trim().to_ascii_lowercase()))
    };
    let chosen = pick(&|m: &str| m == "application/json" || m.ends_with("+json"))
        .map(|c| (c, BodyEncoding::Json))
        .or_else(|| {
            pick(&|m: &str| m == "application/x-www-form-urlencoded").map(|c| (c, BodyEncoding::Form))
        })
        // "Any type" (the Kubernetes API says this of its JSON bodies): sent as JSON.
        .or_else(|| pick(&|m: &str| m == "*/*").map(|c| (c, BodyEncoding::Json)));
    let is_required = rb.get("required") == Some(&Value::Bool(true));
    let Some(((_, media), encoding)) = chosen else {
        if is_required {
            let types: Vec<&str> = content
                .into_iter()
                .flatten()
                .map(|(k, _)| k.as_str())
                .take(4)
                .collect();
            return Err(format!(
                "its request body is {}: only JSON and form bodies are supported (exclude the operation)",
                shown(&types.join(", "))
            ));
        }
        return Ok(());
    };
    let mut schema = conv.convert(media.get("schema").unwrap_or(&Value::Bool(true)), reached)?;
    if let (Some(d), Some(o)) = (
        rb.get("description").and_then(Value::as_str),
        schema.as_object_mut(),
    ) && !o.contains_key("description")
    {
        o.insert("description".into(), Value::String(bounded(d, 300)));
    }
    let b = body_name(props, &Map::new());
    parts.body = Some((b.as_str().into(), encoding));
    if is_required {
        required.push(Value::String(b.clone()));
    }
    props.insert(b, schema);
    Ok(())
}

/// The schema of the operation's first 2xx JSON answer, when it is an object schema the
/// compiler accepts; `None` otherwise (the answer is then text and, if JSON, unchecked).
fn output_schema(conv: &mut Converter<'_>, root: &Value, op: &Op<'_>) -> Option<(Value, Schema)> {
    let responses = op.op.get("responses")?.as_object()?;
    let (_, response) = responses
        .iter()
        .filter(|(code, _)| code.starts_with('2'))
        .min_by(|a, b| a.0.cmp(b.0))?;
    let response = deref(root, response).ok()?;
    let schema = if conv.version() == Version::Swagger2 {
        response.get("schema")?
    } else {
        response
            .get("content")?
            .as_object()?
            .iter()
            .find(|(k, _)| {
                let m = k.split(';').next().unwrap_or("").trim();
                m == "application/json" || m.ends_with("+json")
            })?
            .1
            .get("schema")?
    };
    let mut reached = Reached::default();
    let mut out = conv.convert(schema, &mut reached).ok()?;
    let mut defs = conv.defs(&mut reached).ok()?;
    // An answer declared as a reference is the component itself, at the top (and not again
    // under `$defs`: only a cycle, which the schema compiler refuses, could refer to it).
    if let Some(r) = out.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/$defs/")?.replace("~1", "/").replace("~0", "~");
        out = defs.remove(&name)?;
    }
    if out.get("type").and_then(Value::as_str) != Some("object") {
        return None;
    }
    if !defs.is_empty() {
        out["$defs"] = Value::Object(defs);
    }
    let compiled = Schema::compile(&crate::schema::enforceable(&out)).ok()?;
    Some((out, compiled))
}

/// The description of an operation's tool: the override, or its summary and description.
fn description(s: &OpenApiSpec, op: &Op<'_>, key: &str) -> Option<String> {
    if let Some(d) = s.tools.descriptions.get(key) {
        return Some(d.clone());
    }
    document_description(op)
}

/// An operation's summary and description, joined and bounded.
fn document_description(op: &Op<'_>) -> Option<String> {
    let text = |k: &str| {
        op.op
            .get(k)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
    };
    let joined = match (text("summary"), text("description")) {
        (Some(a), Some(b)) if a != b => format!("{a}\n\n{b}"),
        (Some(a), _) => a.to_owned(),
        (None, Some(b)) => b.to_owned(),
        (None, None) => return None,
    };
    Some(bounded(&joined, MAX_DESCRIPTION))
}

/// Annotations from the method (GET and HEAD read-only, DELETE destructive, PUT and DELETE
/// idempotent), or the override.
fn annotations(s: &OpenApiSpec, method: &str, key: &str) -> Value {
    if let Some(a) = s.tools.annotations.get(key) {
        return serde_json::to_value(a).unwrap_or_default();
    }
    match method {
        "get" | "head" => json!({"readOnlyHint": true}),
        "delete" => json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true}),
        "put" => json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true}),
        _ => json!({"readOnlyHint": false, "destructiveHint": false, "idempotentHint": false}),
    }
}

/// The compiled request: the http tool of this method and URL, with the source's headers,
/// TLS and identity, and the parameters and body taken from the arguments. The URL is the
/// document's text, literal; only the path parameters and the credentials' Secrets are
/// variables.
fn request(
    sh: &Shared<'_>,
    op: &Op<'_>,
    path_params: &[String],
    mut parts: ArgParts,
    applied: Applied,
    op_at: &str,
    local: &mut Problems,
) -> http::HttpCall {
    let s = sh.spec;
    let mut url = url_template(&sh.base, op.path, path_params).unwrap_or_else(|e| {
        local.push(format!("{op_at}.url"), e);
        Template::builder().lit(&sh.base)
    });
    for (i, q) in applied.query.iter().enumerate() {
        let sep = if i == 0 && !sh.base.contains('?') && !op.path.contains('?') {
            "?"
        } else {
            "&"
        };
        url = url.lit(sep).append(q);
    }
    let headers = headers(s, applied.headers, &applied.cookies, op_at, local);
    // A header the author sets (a credential, say) is not the caller's to send a second time.
    parts.params.retain(|a| {
        a.place != ParamPlace::Header || !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(&a.name))
    });
    let names = Names::arguments(path_params.iter().map(String::as_str).collect());
    let index = FxHashMap::default();
    let mut cx = Cx {
        at: op_at.to_owned(),
        names: &names,
        p: local,
        index: &index,
    };
    let request = RequestParts {
        method: op.method,
        url: Some(url.build()),
        headers,
        body: None,
        timeout: s.timeout.as_ref(),
        max_response_bytes: s.max_response_bytes,
        tls: s.tls.as_ref(),
        identity: s.identity.as_ref(),
        project: &[],
    };
    let mut call = http::assemble(request, &mut cx);
    // Whatever the document's text, requests go to the origin checked in `target`.
    if !call.origin.is_empty() && !call.origin.eq_ignore_ascii_case(&sh.trust.origin) {
        local.push(
            format!("{op_at}.url"),
            format!(
                "requests would go to `{}`, not the server's origin `{}`",
                shown(&call.origin),
                shown(&sh.trust.origin)
            ),
        );
    }
    call.args = Some(Box::new(parts));
    call.guarded = sh.guarded;
    if let Some(auth) = applied.auth {
        if s.identity
            .as_ref()
            .is_some_and(|i| i.mode != crate::spec::identity::IdentityMode::Server)
        {
            local.push(
                format!("{op_at}.security"),
                "`identity` sets the Authorization header, which this operation's security scheme sets too",
            );
        }
        for r in auth.secrets() {
            if !call.secrets.contains(&r) {
                call.secrets.push(r);
            }
        }
        call.auth = Some(Box::new(share(sh, auth)));
    }
    call
}

/// The headers of an operation's requests: the source's `headers` (the author's templates),
/// then the credential's, by name; API key cookies join the source's `Cookie` header.
fn headers(
    s: &OpenApiSpec,
    applied: Vec<(String, Template)>,
    cookies: &[Template],
    op_at: &str,
    local: &mut Problems,
) -> Vec<(String, Template)> {
    let mut out: Vec<(String, Template)> = Vec::with_capacity(s.headers.len() + applied.len() + 1);
    for (k, v) in &s.headers {
        match Template::compile(Authored::new(v)) {
            Ok(t) => out.push((k.clone(), t)),
            Err(e) => local.push(format!("{op_at}.headers.{k}"), e),
        }
    }
    for (k, t) in applied {
        match out.iter_mut().find(|(name, _)| *name == k) {
            Some(slot) => slot.1 = t,
            None => out.push((k, t)),
        }
    }
    if !cookies.is_empty() {
        let own = out.iter().position(|(k, _)| k.eq_ignore_ascii_case("cookie"));
        let mut cookie = Template::builder();
        if let Some(i) = own {
            cookie = cookie.append(&out[i].1).lit("; ");
        }
        for (i, c) in cookies.iter().enumerate() {
            if i > 0 {
                cookie = cookie.lit("; ");
            }
            cookie = cookie.append(c);
        }
        match own {
            Some(i) => out[i].1 = cookie.build(),
            None => out.push(("Cookie".to_owned(), cookie.build())),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `auth`, its OAuth2 grant replaced by an equal one of an earlier operation (one token).
fn share(sh: &Shared<'_>, auth: http::auth::Auth) -> http::auth::Auth {
    let http::auth::Auth::OAuth2(grant) = &auth else {
        return auth;
    };
    let mut grants = sh.grants.borrow_mut();
    if let Some(g) = grants.iter().find(|g| g.same_grant(grant)) {
        return http::auth::Auth::OAuth2(g.clone());
    }
    grants.push(grant.clone());
    auth
}

/// The URL of a path: the base and the path's text are literal (whatever they contain);
/// each `{name}` of a path parameter is the argument (percent-encoded when rendered).
fn url_template(
    base: &str,
    path: &str,
    path_params: &[String],
) -> Result<crate::template::TemplateBuilder, String> {
    // The base may end at its host: a path's text right after it would continue the host
    // (`.attacker.example`), add user information (`@attacker.example`) or a port.
    if !path.starts_with('/') {
        return Err(format!("the path `{}` does not start with `/`", shown(path)));
    }
    let mut out = Template::builder().lit(base);
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out = out.lit(&rest[..open]);
        let close = rest[open..].find('}').ok_or("the path has an unclosed `{`")? + open;
        let name = &rest[open + 1..close];
        if !path_params.iter().any(|p| p == name) {
            return Err(format!(
                "the path names `{}`, which is no path parameter",
                shown(name)
            ));
        }
        out = out.var(&[name], &[]).map_err(|_| {
            format!(
                "path parameter `{}`: only names of A-Z a-z 0-9 _ - are supported",
                shown(name)
            )
        })?;
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return Err("the path has an unmatched `}`".to_owned());
    }
    Ok(out.lit(rest))
}

/// The first of a schema's problems (bounded) and how many more: a document can make one
/// per component schema.
fn first_of(errors: &[String]) -> String {
    let first = errors.first().map_or("", String::as_str);
    let mut out: String = first.chars().take(MAX_DESCRIPTION).collect();
    if first.chars().count() > MAX_DESCRIPTION {
        out.push('…');
    }
    if errors.len() > 1 {
        out.push_str(&format!(" (and {} more)", errors.len() - 1));
    }
    out
}

/// The tools of every source, and the Secrets (and ConfigMaps) that the settings of sources
/// still to be fetched name.
pub struct Compiled {
    pub tools: Vec<CompiledTool>,
    pub unfetched_refs: Vec<SecretRef>,
    /// The pinned views of the tools of each source that pins them.
    pub pinned: Vec<PinnedSource>,
}

/// Compiles the operations of every source into tools; `taken` holds the names of the
/// ToolSet's own tools (and receives the names compiled here).
pub fn compile(specs: &[OpenApiSpec], taken: &mut FxHashSet<String>, p: &mut Problems) -> Compiled {
    let mut out = Compiled {
        tools: Vec::new(),
        unfetched_refs: Vec::new(),
        pinned: Vec::new(),
    };
    if specs.len() > MAX_OPENAPI_SOURCES {
        p.push(
            "openapi",
            format!("{} sources; at most {MAX_OPENAPI_SOURCES}", specs.len()),
        );
        return out;
    }
    let mut names = FxHashSet::default();
    for (i, s) in specs.iter().enumerate() {
        let at = format!("openapi[{i}]");
        if !valid_source_name(&s.name) {
            p.push(
                format!("{at}.name"),
                "1-63 of a-z 0-9 -, starting with a letter, not ending with -",
            );
        } else if !names.insert(s.name.as_str()) {
            p.push(
                format!("{at}.name"),
                format!("duplicate source name `{}`", s.name),
            );
        }
        security::check_spec(&s.security, &at, p);
        let before = p.0.len();
        super::check_url(s, &at, p);
        let url_ok = p.0.len() == before;
        super::check_server_choice(s, &at, p);
        super::check_pinning(s, &at, p);
        if let Some(cm) = &s.config_map {
            // Read by quiver-server from its ConfigMap source (`reload::fetch`), which puts
            // it in `document`: the operator sees it unread and grants the pods' Role.
            cm.check(&at, p);
            if s.document.is_none() && s.file.is_none() && s.url.is_none() {
                out.unfetched_refs.push(cm.store_ref());
                out.unfetched_refs.extend(stand_in_refs(s, &at, p));
                continue;
            }
            p.push(
                &at,
                "set exactly one of `document`, `file`, `url` and `configMap`",
            );
            continue;
        }
        let text = match (&s.document, &s.file, &s.url) {
            (Some(d), None, None) => d,
            // Fetched by quiver-server when it loads the config (`reload::fetch`); the
            // operator compiles the source's settings on a stand-in operation, which checks
            // them and names the Secrets and ConfigMaps the pods will read for it.
            (None, None, Some(_)) => {
                if url_ok {
                    out.unfetched_refs.extend(stand_in_refs(s, &at, p));
                    // The pods read the fetch's own credentials too (checked with the url).
                    let fetch = s
                        .fetch
                        .as_ref()
                        .map(|f| f.credentials(&at, &mut Problems::default()));
                    out.unfetched_refs.extend(fetch.into_iter().flat_map(|c| c.refs));
                }
                continue;
            }
            (None, Some(f), None) => {
                p.push(
                    format!("{at}.file"),
                    format!("`{f}` could not be read (a missing file, or over {MAX_OPENAPI_BYTES} bytes)"),
                );
                continue;
            }
            _ => {
                p.push(
                    &at,
                    "set exactly one of `document`, `file`, `url` and `configMap`",
                );
                continue;
            }
        };
        let doc = match document::parse(text) {
            Ok(d) => d,
            Err(e) => {
                p.push(format!("{at}.document"), e);
                continue;
            }
        };
        let (tools, pinned) = compile_source(s, &doc, &at, taken, p);
        out.tools.extend(tools);
        out.pinned.extend(pinned);
    }
    out
}

/// A document of one operation, standing in for a source's own while it is not fetched.
const STAND_IN: &str = r#"{"openapi": "3.0.3", "info": {"title": "stand-in", "version": "1"},
 "paths": {"/": {"get": {"operationId": "standIn", "responses": {"200": {"description": "ok"}}}}}}"#;

/// The Secrets and ConfigMaps that a not yet fetched source's settings name (its `headers`,
/// `tls` and `identity`, compiled on [`STAND_IN`], whose problems are the source's own).
fn stand_in_refs(s: &OpenApiSpec, at: &str, p: &mut Problems) -> Vec<SecretRef> {
    let Ok(doc) = document::parse(STAND_IN) else {
        return Vec::new();
    };
    // Where requests go may be in the document only (a ConfigMap's): the references are
    // still named, and the problems that depend on the server are left to the pods.
    let mut scratch = Problems::default();
    let server = s
        .server
        .clone()
        .or_else(|| s.allowed_origins.first().cloned())
        .or_else(|| s.url.as_deref().and_then(origin));
    let (server, p) = match server {
        Some(server) => (server, p),
        None => ("https://stand-in.invalid".to_owned(), &mut scratch),
    };
    let spec = OpenApiSpec {
        server: Some(server),
        server_index: None,
        server_variables: Default::default(),
        config_map: None,
        // The source's filters, names and projections are for its real operations (whose
        // paths are checked now all the same); its schemes are the real document's (their
        // Secrets are named below).
        tools: Default::default(),
        project: Default::default(),
        security: Default::default(),
        ..s.clone()
    };
    for (key, paths) in &s.project {
        http::project::compile(paths, &format!("{at}.project.{}", shown(key)), p);
    }
    let mut refs: Vec<SecretRef> = compile_source(&spec, &doc, at, &mut FxHashSet::default(), p)
        .0
        .iter()
        .flat_map(|t| t.handler.secrets().iter().cloned())
        .collect();
    refs.extend(security::refs(&s.security));
    refs
}

/// `scheme://authority` of an absolute URL.
fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (!authority.is_empty()).then(|| format!("{scheme}://{authority}"))
}

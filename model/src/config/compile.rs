//! Validation and compilation of a ToolSet: one pass that either reports every problem
//! with its path or yields the compiled form the registry serves from.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;
use serde_json::{Map, Value, json};

use super::compiled::{
    CompiledHandler, CompiledPrompt, CompiledResource, CompiledTool, CompiledToolSet, ResourceKind,
    UriPattern,
};
use super::governance;
use super::model::{
    API_VERSION, Handler, KIND, PromptSpec, ResourceSpec, TaskSupport, ToolSet, ToolSpec, hash,
};
use super::upstream::{CompiledUpstream, compile_upstreams};
use crate::handlers::ask;
use crate::handlers::builtin::Builtin;
use crate::handlers::content::{self, Content};
use crate::handlers::exec;
use crate::handlers::http;
use crate::handlers::template;
use crate::schema::{Schema, expand_shorthand};
use crate::spec::checks::shallow;
use crate::spec::context::{
    ConfigError, Cx, MAX_SECRETS, Names, Problems, SecretRef, check_template, checked_template, template,
    valid_tool_name,
};
use crate::template::{Authored, Template};

const MAX_PAGE_SIZE: u32 = 10_000;
const DEFAULT_PAGE_SIZE: u32 = 100;

/// Validates and compiles a ToolSet.
///
/// # Errors
/// Every problem found, each with its path.
pub fn compile(ts: &ToolSet) -> Result<CompiledToolSet, ConfigError> {
    let mut p = Problems(Vec::new());
    let page_size = check_header(ts, &mut p);
    let index = index_tools(ts, &mut p);
    let mut tools: Vec<CompiledTool> = ts
        .tools
        .iter()
        .enumerate()
        .map(|(i, t)| compile_tool(t, i, &index, &mut p))
        .collect();
    super::pipelines::check(&mut tools, &mut p);
    let mut taken: rustc_hash::FxHashSet<String> = index.keys().map(|k| (*k).to_owned()).collect();
    let mut api = super::openapi::compile(&ts.openapi, &mut taken, &mut p);
    tools.append(&mut api.tools);
    // A core tool may come from an OpenAPI document or an upstream: checked where it is known.
    let search = super::search_build::compile(
        ts.tool_search.as_ref(),
        &index,
        !ts.upstreams.is_empty() || !ts.openapi.is_empty(),
        &mut tools,
        &mut p,
    );

    let mut resources = compile_resources(ts, &mut p);
    let mut prompts = compile_prompts(ts, &mut p);
    let local = index.keys().copied().collect();
    let signing_in = super::upstream::sign_out::signing_in(&ts.upstreams);
    if !signing_in.is_empty() {
        // Listed only where there is something to sign out of (an upstream's tool of the
        // same name is not imported: compiled tools win every name).
        let taken = index.contains_key(super::upstream::sign_out::SIGN_OUT);
        tools.push(super::upstream::sign_out::tool(&signing_in, taken, &mut p));
    }
    let mut upstreams = compile_upstreams(&ts.upstreams, &local, &mut p);
    add_server_limits(ts, &mut tools, &mut upstreams, &mut p);
    add_server_guards(ts, &mut tools, &mut upstreams);
    let webhooks = super::webhooks::compile(&ts.webhooks, &mut p);
    let unfetched: Vec<SecretRef> = api
        .unfetched_refs
        .iter()
        .chain(webhooks.secrets())
        .cloned()
        .collect();
    let secrets = referenced_secrets(&tools, &upstreams, &unfetched, &mut p);
    let policies = compile_policies(ts, &mut resources, &mut prompts, &mut p);

    // Document order: tools[2] before tools[10].
    p.0.sort_by_key(|a| natural_key(&a.path));
    if p.0.is_empty() {
        Ok(CompiledToolSet {
            secrets,
            hash: hash(ts),
            spec: ts.clone(),
            tools,
            resources,
            prompts,
            page_size,
            upstreams,
            upstream_digest: 0,
            policies,
            search,
            webhooks,
            pinned_documents: api.pinned,
        })
    } else {
        Err(ConfigError { problems: p.0 })
    }
}

/// Compiles the ToolSet's `policies` and gives each resource and prompt those that apply to
/// it (the tools get theirs when the registry is built).
fn compile_policies(
    ts: &ToolSet,
    resources: &mut [CompiledResource],
    prompts: &mut [CompiledPrompt],
    p: &mut Problems,
) -> super::policy::PolicySet {
    let tools: Vec<_> = ts
        .tools
        .iter()
        .map(|t| (t.name.as_str(), t.policy.as_deref()))
        .collect();
    let upstreams: Vec<_> = ts.upstreams.iter().map(|u| u.name.as_str()).collect();
    let declared: Vec<&str> = resources.iter().map(CompiledResource::declared_uri).collect();
    let names: Vec<&str> = prompts.iter().map(|pr| pr.name.as_str()).collect();
    let set = super::policy::compile(
        &ts.policies,
        &super::policy::Declared {
            tools: &tools,
            upstreams: &upstreams,
            resources: &declared,
            prompts: &names,
            openapi: !ts.openapi.is_empty(),
            imported_resources: ts.upstreams.iter().any(|u| u.resources.is_some()),
            imported_prompts: ts.upstreams.iter().any(|u| u.prompts.is_some()),
        },
        p,
    );
    if !set.is_empty() {
        for r in resources.iter_mut() {
            r.policies = set.for_resource(r.declared_uri());
        }
        for pr in prompts.iter_mut() {
            pr.policies = set.for_prompt(&pr.name);
        }
    }
    set
}

/// Adds the ToolSet's `limits` to every tool's and upstream's, in the order a call checks
/// them ([`governance::ordered`]).
fn add_server_limits(
    ts: &ToolSet,
    tools: &mut [CompiledTool],
    upstreams: &mut [CompiledUpstream],
    p: &mut Problems,
) {
    let server = governance::compile_limits(&ts.limits, governance::Scope::Server, "", "limits", p);
    for t in tools {
        t.governance.limits = governance::ordered(&[&t.governance.limits, &server]);
    }
    for u in upstreams {
        u.limits = governance::ordered(&[&u.limits, &server]);
    }
}

/// Gives every tool and upstream without a `resultGuards` of its own the ToolSet's, and
/// drops those that search for nothing (a tool without a guard pays one branch per call).
fn add_server_guards(ts: &ToolSet, tools: &mut [CompiledTool], upstreams: &mut [CompiledUpstream]) {
    let server = ts.result_guards.as_ref().map(super::guards::ResultGuard::compile);
    for t in tools {
        // `find_tools` and `sign_out_upstream` answer from the server itself (listed tools,
        // a sign-out): nothing a guard is for, and a hostile description must not make
        // search answer with an error.
        let own = matches!(t.handler, CompiledHandler::FindTools | CompiledHandler::SignOut);
        let outer = if own { None } else { server.as_ref() };
        t.governance.result_guard = super::guards::resolve(t.governance.result_guard.as_ref(), outer);
    }
    for u in upstreams {
        u.result_guard = super::guards::resolve(u.result_guard.as_ref(), server.as_ref());
    }
}

/// Checks `apiVersion`, `kind` and `server`; returns the page size.
fn check_header(ts: &ToolSet, p: &mut Problems) -> usize {
    if ts.api_version != API_VERSION {
        p.push(
            "apiVersion",
            format!("must be `{API_VERSION}`, got `{}`", ts.api_version),
        );
    }
    if ts.kind != KIND {
        p.push("kind", format!("must be `{KIND}`, got `{}`", ts.kind));
    }
    if ts.server.name.trim().is_empty() {
        p.push("server.name", "must not be empty");
    }
    match ts.server.page_size.unwrap_or(DEFAULT_PAGE_SIZE) {
        n @ 1..=MAX_PAGE_SIZE => n as usize,
        _ => {
            p.push(
                "server.pageSize",
                format!("must be between 1 and {MAX_PAGE_SIZE}"),
            );
            DEFAULT_PAGE_SIZE as usize
        }
    }
}

/// The index of every tool by name (the first of duplicates), reporting invalid and
/// duplicate names.
fn index_tools<'a>(ts: &'a ToolSet, p: &mut Problems) -> FxHashMap<&'a str, usize> {
    let mut index: FxHashMap<&str, usize> = FxHashMap::default();
    for (i, t) in ts.tools.iter().enumerate() {
        if !valid_tool_name(&t.name) {
            p.push(
                format!("tools[{i}].name"),
                format!(
                    "`{}` is not a valid tool name (1-128 characters of A-Z a-z 0-9 _ - .)",
                    t.name
                ),
            );
        }
        if let Some(first) = index.insert(&t.name, i) {
            p.push(
                format!("tools[{i}].name"),
                format!("duplicate tool name `{}` (also tools[{first}])", t.name),
            );
            index.insert(&t.name, first);
        }
    }
    index
}

/// Compiles `tools[i]`: its schemas, its handler (by its kind's module), its `tools/list`
/// entry and its access.
fn compile_tool(t: &ToolSpec, i: usize, index: &FxHashMap<&str, usize>, p: &mut Problems) -> CompiledTool {
    let at = format!("tools[{i}]");
    let builtin = match &t.handler {
        Handler::Builtin(name) => {
            let b = Builtin::from_name(name);
            if b.is_none() {
                p.push(
                    format!("{at}.handler.builtin"),
                    format!("unknown builtin `{name}` (one of: {})", Builtin::names()),
                );
            }
            b
        }
        _ => None,
    };
    let (schema_json, input) = input_schema(t, &at, builtin, p);
    let (output_json, output) = output_schema(t, &at, builtin, p);
    // Templates may only name declared properties when the input is closed.
    let names = Names {
        props: (!input.allows_additional()).then(|| input.property_names().collect()),
        steps: None,
    };
    let mut cx = Cx {
        at: format!("{at}.handler"),
        names: &names,
        p: &mut *p,
        index,
    };
    let handler = compile_handler(&t.handler, builtin, &mut cx);
    let access = t
        .access
        .as_ref()
        .and_then(|a| a.compile(&format!("{at}.access"), p))
        .map(std::sync::Arc::new);
    let governance = governance::ToolGovernance {
        limits: governance::compile_limits(
            &t.limits,
            governance::Scope::Tool,
            &t.name,
            &format!("{at}.limits"),
            p,
        )
        .into(),
        audit_arguments: t
            .audit
            .as_ref()
            .filter(|a| a.arguments)
            .map(|_| governance::sensitive_properties(&schema_json)),
        result_guard: t.result_guards.as_ref().map(super::guards::ResultGuard::compile),
    };
    let task = task_support(t.task, &handler, &at, p);
    CompiledTool {
        name: t.name.clone(),
        descriptor: tool_descriptor(t, schema_json, output_json),
        input,
        output,
        handler,
        access,
        governance,
        task,
    }
}

/// Whether a tool's calls may run as tasks: as declared, by default `optional` for the
/// kinds that may run long (a process, an HTTP request) and `forbidden` for the others. A
/// tool that asks the client (`sample`, `elicit`, `ask`) or a pipeline may declare it: its
/// task waits in `input_required` for the answers. The kinds that answer at once may not.
fn task_support(
    declared: Option<TaskSupport>,
    handler: &CompiledHandler,
    at: &str,
    p: &mut Problems,
) -> TaskSupport {
    use CompiledHandler as H;
    let long = matches!(handler, H::Exec(_) | H::Http(_));
    let may = long || matches!(handler, H::Sample(_) | H::Elicit(_) | H::Ask(_) | H::Pipeline(_));
    match declared {
        None if long => TaskSupport::Optional,
        None => TaskSupport::Forbidden,
        Some(TaskSupport::Forbidden) => TaskSupport::Forbidden,
        Some(t) if may => t,
        Some(t) => {
            p.push(
                format!("{at}.task"),
                "this kind answers at once and never runs as a task (only exec, http, sample, elicit, ask and pipeline tools may)",
            );
            t
        }
    }
}

/// A tool's input schema (from `input`, `inputSchema` or its builtin) and its validator.
fn input_schema(t: &ToolSpec, at: &str, builtin: Option<Builtin>, p: &mut Problems) -> (Value, Schema) {
    let input_shallow = t
        .input
        .iter()
        .flatten()
        .all(|(k, v)| shallow(v, &format!("{at}.input.{k}"), p));
    let schema_shallow = t
        .input_schema
        .as_ref()
        .is_none_or(|v| shallow(v, &format!("{at}.inputSchema"), p));
    let schema_json = match (&t.input, &t.input_schema) {
        _ if !(input_shallow && schema_shallow) => json!({"type": "object"}),
        (Some(_), Some(_)) => {
            p.push(at, "set `input` or `inputSchema`, not both");
            json!({"type": "object"})
        }
        (Some(short), None) => expand_shorthand(short).unwrap_or_else(|errs| {
            p.nested(&format!("{at}.input"), errs);
            json!({"type": "object"})
        }),
        (None, Some(s)) => s.clone(),
        (None, None) => builtin.map_or_else(
            || json!({"type": "object", "properties": {}}),
            Builtin::input_schema,
        ),
    };
    if schema_json.get("type").and_then(Value::as_str) != Some("object") {
        p.push(
            format!("{at}.inputSchema.type"),
            "an input schema must have `type: object`",
        );
    }
    let input = Schema::compile(&schema_json).unwrap_or_else(|errs| {
        let base = if t.input.is_some() { "input" } else { "inputSchema" };
        p.nested(&format!("{at}.{base}"), errs);
        Schema::default()
    });
    (schema_json, input)
}

/// A tool's output schema (declared, or its builtin's), if any, and its validator.
fn output_schema(
    t: &ToolSpec,
    at: &str,
    builtin: Option<Builtin>,
    p: &mut Problems,
) -> (Option<Value>, Option<Box<Schema>>) {
    let output_json = t
        .output_schema
        .clone()
        .filter(|o| shallow(o, &format!("{at}.outputSchema"), p))
        .or_else(|| builtin.and_then(Builtin::output_schema));
    let output = output_json.as_ref().and_then(|o| {
        if o.get("type").and_then(Value::as_str) != Some("object") {
            p.push(
                format!("{at}.outputSchema.type"),
                "an output schema must have `type: object`",
            );
        }
        Schema::compile(o)
            .map(Box::new)
            .map_err(|errs| p.nested(&format!("{at}.outputSchema"), errs))
            .ok()
    });
    (output_json, output)
}

/// Compiles a tool's handler: one line per kind, each kind's module compiles its own spec.
fn compile_handler(handler: &Handler, builtin: Option<Builtin>, cx: &mut Cx<'_>) -> CompiledHandler {
    match handler {
        Handler::Builtin(_) => CompiledHandler::Builtin(builtin.unwrap_or(Builtin::Echo)),
        Handler::Template(src) => CompiledHandler::Template(template::compile(src, &mut cx.kind("template"))),
        Handler::Error(src) => CompiledHandler::Error(template::compile(src, &mut cx.kind("error"))),
        Handler::Sample(spec) => {
            CompiledHandler::Sample(Box::new(ask::compile_sample(spec, &mut cx.kind("sample"))))
        }
        Handler::Elicit(spec) => {
            CompiledHandler::Elicit(Box::new(ask::compile_elicit(spec, &mut cx.kind("elicit"))))
        }
        Handler::Ask(questions) => CompiledHandler::Ask(ask::compile(questions, &mut cx.kind("ask"))),
        Handler::Content(blocks) => {
            CompiledHandler::Content(content::compile_blocks(blocks, &mut cx.kind("content")))
        }
        Handler::Http(h) => CompiledHandler::Http(Box::new(http::compile(h, &mut cx.kind("http")))),
        Handler::Exec(e) => CompiledHandler::Exec(Box::new(exec::compile(e, &mut cx.kind("exec")))),
        Handler::Pipeline(steps) => {
            CompiledHandler::Pipeline(super::steps::compile(steps, &mut cx.kind("pipeline")))
        }
    }
}

/// A tool's `tools/list` entry.
fn tool_descriptor(t: &ToolSpec, input_schema: Value, output_schema: Option<Value>) -> Value {
    let mut descriptor = Map::new();
    descriptor.insert("name".into(), Value::String(t.name.clone()));
    if let Some(title) = &t.title {
        descriptor.insert("title".into(), Value::String(title.clone()));
    }
    if let Some(d) = &t.description {
        descriptor.insert("description".into(), Value::String(d.clone()));
    }
    descriptor.insert("inputSchema".into(), input_schema);
    if let Some(o) = output_schema {
        descriptor.insert("outputSchema".into(), o);
    }
    if let Some(a) = &t.annotations {
        descriptor.insert("annotations".into(), serde_json::to_value(a).unwrap_or_default());
    }
    Value::Object(descriptor)
}

/// The names of the Secrets the tools and upstreams reference, at most [`MAX_SECRETS`].
fn referenced_secrets(
    tools: &[CompiledTool],
    upstreams: &[CompiledUpstream],
    unfetched: &[SecretRef],
    p: &mut Problems,
) -> BTreeSet<String> {
    let secrets: BTreeSet<String> = tools
        .iter()
        .flat_map(|t| t.handler.secrets())
        .chain(upstreams.iter().flat_map(|u| &u.secrets))
        .chain(unfetched)
        .map(|r| r.name.clone())
        .collect();
    if secrets.len() > MAX_SECRETS {
        p.push(
            "tools",
            format!(
                "the tools reference {} Secrets; at most {MAX_SECRETS}",
                secrets.len()
            ),
        );
    }
    secrets
}

/// Orders paths with their numbers compared as numbers.
fn natural_key(path: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut n = u64::from(c as u8 - b'0');
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            out.push((std::mem::take(&mut text), n));
        } else {
            text.push(c);
        }
    }
    out.push((text, 0));
    out
}

fn compile_resources(ts: &ToolSet, p: &mut Problems) -> Vec<CompiledResource> {
    let mut seen: FxHashMap<&str, usize> = FxHashMap::default();
    ts.resources
        .iter()
        .enumerate()
        .filter_map(|(i, r)| compile_resource(r, i, &mut seen, p))
        .collect()
}

/// Compiles `resources[i]`; `None` when its contents or URI are not set as they must be.
/// `seen` holds the fixed URIs of the resources before it.
fn compile_resource<'a>(
    r: &'a ResourceSpec,
    i: usize,
    seen: &mut FxHashMap<&'a str, usize>,
    p: &mut Problems,
) -> Option<CompiledResource> {
    let at = format!("resources[{i}]");
    if r.name.trim().is_empty() {
        p.push(format!("{at}.name"), "must not be empty");
    }
    let (body, blob, field) = match (&r.text, &r.blob) {
        (Some(t), None) => (t.as_str(), false, "text"),
        (None, Some(b)) => (b.as_str(), true, "blob"),
        _ => {
            p.push(&at, "set exactly one of `text` and `blob`");
            return None;
        }
    };
    let default_mime = if blob {
        "application/octet-stream"
    } else {
        "text/plain"
    };
    let mime_type = r.mime_type.clone().unwrap_or_else(|| default_mime.to_owned());
    let mut d = Map::new();
    let kind = match (&r.uri, &r.uri_template) {
        (Some(uri), None) => {
            if !uri.contains(':') {
                p.push(format!("{at}.uri"), "must be an absolute URI (scheme:...)");
            }
            if let Some(j) = seen.insert(uri, i) {
                p.push(
                    format!("{at}.uri"),
                    format!("duplicate URI (also resources[{j}])"),
                );
            }
            if Template::compile(Authored::new(body)).is_ok_and(|t| !t.is_literal()) {
                p.push(
                    format!("{at}.{field}"),
                    "a resource with a fixed `uri` has fixed contents; use `uriTemplate` for variables",
                );
            }
            if blob && !content::is_base64(body) {
                p.push(format!("{at}.blob"), content::NOT_BASE64);
            }
            d.insert("uri".into(), Value::String(uri.clone()));
            ResourceKind::Static {
                uri: uri.clone(),
                text: body.to_owned(),
                blob,
            }
        }
        (None, Some(tpl)) => {
            d.insert("uriTemplate".into(), Value::String(tpl.clone()));
            templated_resource(tpl, body, blob, &at, field, p)?
        }
        _ => {
            p.push(&at, "set exactly one of `uri` and `uriTemplate`");
            return None;
        }
    };
    d.insert("name".into(), Value::String(r.name.clone()));
    if let Some(t) = &r.title {
        d.insert("title".into(), Value::String(t.clone()));
    }
    if let Some(t) = &r.description {
        d.insert("description".into(), Value::String(t.clone()));
    }
    d.insert("mimeType".into(), Value::String(mime_type.clone()));
    check_values(r, &kind, &at, p);
    Some(CompiledResource {
        descriptor: Value::Object(d),
        mime_type,
        kind,
        values: r.values.clone(),
        policies: None,
    })
}

/// A resource with a URI template: its contents are a template over the URI's variables.
fn templated_resource(
    tpl: &str,
    body: &str,
    blob: bool,
    at: &str,
    field: &str,
    p: &mut Problems,
) -> Option<ResourceKind> {
    match UriPattern::compile(tpl) {
        Ok(pattern) => {
            let vars: Vec<&str> = pattern.variables().collect();
            let text = template(Authored::new(body), &format!("{at}.{field}"), p);
            if let Some(t) = &text {
                check_template(
                    t,
                    &Names {
                        props: Some(vars),
                        steps: None,
                    },
                    &format!("{at}.{field}"),
                    p,
                );
            }
            Some(ResourceKind::Templated {
                text: text.unwrap_or_else(Template::empty),
                pattern,
                blob,
            })
        }
        Err(e) => {
            p.push(format!("{at}.uriTemplate"), e);
            None
        }
    }
}

/// Completion `values` may be given only for the variables of a resource's URI template.
fn check_values(r: &ResourceSpec, kind: &ResourceKind, at: &str, p: &mut Problems) {
    for var in r.values.keys() {
        let known = match kind {
            ResourceKind::Templated { pattern, .. } => pattern.variables().any(|v| v == var),
            ResourceKind::Static { .. } | ResourceKind::Upstream { .. } => false,
        };
        if !known {
            p.push(
                format!("{at}.values.{var}"),
                "names no variable of the resource's `uriTemplate`",
            );
        }
    }
}

fn compile_prompts(ts: &ToolSet, p: &mut Problems) -> Vec<CompiledPrompt> {
    let mut seen: FxHashMap<&str, usize> = FxHashMap::default();
    let mut out = Vec::new();
    for (i, pr) in ts.prompts.iter().enumerate() {
        let at = format!("prompts[{i}]");
        if pr.name.trim().is_empty() {
            p.push(format!("{at}.name"), "must not be empty");
        }
        if let Some(j) = seen.insert(&pr.name, i) {
            p.push(
                format!("{at}.name"),
                format!("duplicate prompt name `{}` (also prompts[{j}])", pr.name),
            );
        }
        if pr.messages.is_empty() {
            p.push(format!("{at}.messages"), "must have at least one message");
        }
        out.push(compile_prompt(pr, &at, p));
    }
    out
}

/// Compiles one prompt (at `at`): its questions, its messages and its `prompts/list` entry.
fn compile_prompt(pr: &PromptSpec, at: &str, p: &mut Problems) -> CompiledPrompt {
    let args: Vec<&str> = pr.arguments.iter().map(|a| a.name.as_str()).collect();
    let arg_names = Names {
        props: Some(args.clone()),
        steps: None,
    };
    let ask = if pr.ask.is_empty() {
        Vec::new()
    } else {
        if args.contains(&"input") {
            p.push(
                format!("{at}.arguments"),
                "an argument named `input` would hide the answers of `ask`",
            );
        }
        ask::questions(&pr.ask, &format!("{at}.ask"), &arg_names, p)
    };
    let mut visible = args.clone();
    if !ask.is_empty() {
        visible.push("input");
    }
    let names = Names {
        props: Some(visible),
        steps: None,
    };
    let mut messages = Vec::new();
    for (j, m) in pr.messages.iter().enumerate() {
        let mp = format!("{at}.messages[{j}]");
        let block = match (&m.text, &m.content) {
            (Some(text), None) => {
                checked_template(Authored::new(text), &format!("{mp}.text"), &names, p).map(Content::Text)
            }
            (None, Some(c)) => content::compile(c, &format!("{mp}.content"), &names, p),
            _ => {
                p.push(&mp, "set exactly one of `text` and `content`");
                None
            }
        };
        messages.extend(block.map(|b| (m.role, b)));
    }
    CompiledPrompt {
        name: pr.name.clone(),
        descriptor: prompt_descriptor(pr),
        required: pr
            .arguments
            .iter()
            .filter(|a| a.required)
            .map(|a| a.name.clone())
            .collect(),
        arguments: args.iter().map(|s| (*s).to_owned()).collect(),
        messages,
        description: pr.description.clone(),
        values: pr
            .arguments
            .iter()
            .filter(|a| !a.values.is_empty())
            .map(|a| (a.name.clone(), a.values.clone()))
            .collect(),
        ask,
        policies: None,
        upstream: None,
    }
}

/// A prompt's `prompts/list` entry: the spec without its messages, questions and
/// completion values (those are served by completion/complete, not listed).
fn prompt_descriptor(pr: &PromptSpec) -> Value {
    let mut d = serde_json::to_value(pr).unwrap_or_default();
    if let Some(o) = d.as_object_mut() {
        o.remove("messages");
        o.remove("ask");
        if let Some(Value::Array(a)) = o.get_mut("arguments") {
            for arg in a.iter_mut().filter_map(Value::as_object_mut) {
                arg.remove("values");
            }
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MAX_PIPELINE_NESTING;
    use crate::config::parse;

    fn problems(yaml: &str) -> Vec<String> {
        match compile(&parse("t", yaml).unwrap()) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn task_support_defaults_by_kind_and_is_refused_where_a_task_cannot_run() {
        let yaml = "tools:\n  - {name: e, handler: {exec: {command: [/bin/true]}}}\n  - {name: h, handler: {http: {url: 'https://h/x'}}}\n  - {name: t, handler: {template: x}}\n  - {name: f, task: forbidden, handler: {exec: {command: [/bin/true]}}}\n  - {name: r, task: required, handler: {http: {url: 'https://h/y'}}}\n";
        let c = compile(&parse("t", yaml).unwrap()).unwrap();
        let got: Vec<(&str, TaskSupport)> = c.tools.iter().map(|t| (t.name.as_str(), t.task)).collect();
        assert_eq!(
            got,
            [
                ("e", TaskSupport::Optional),
                ("h", TaskSupport::Optional),
                ("t", TaskSupport::Forbidden),
                ("f", TaskSupport::Forbidden),
                ("r", TaskSupport::Required),
            ]
        );
        for handler in [
            "{template: x}",
            "{content: [{text: x}]}",
            "{builtin: add}",
            "{error: x}",
        ] {
            let yaml = format!(
                "tools:\n  - {{name: e, handler: {{exec: {{command: [/bin/true]}}}}}}\n  - {{name: x, task: optional, handler: {handler}}}\n"
            );
            let p = problems(&yaml);
            assert!(
                p.iter()
                    .any(|m| m.starts_with("tools[1].task") && m.contains("never runs as a task")),
                "{handler}: {p:?}"
            );
        }
        // The kinds that ask the client, and pipelines, may run as tasks when they say so.
        let yaml = "tools:\n  - {name: e, handler: {exec: {command: [/bin/true]}}}\n  - {name: s, task: optional, handler: {sample: {prompt: p, maxTokens: 5}}}\n  - {name: q, task: required, handler: {elicit: {message: m, schema: {type: object, properties: {ok: {type: boolean}}}}}}\n  - {name: a, task: required, handler: {ask: {r: {roots: {}}}}}\n  - {name: p, task: optional, handler: {pipeline: [{tool: q}, {tool: e}]}}\n  - {name: d, handler: {pipeline: [{tool: e}]}}\n";
        let c = compile(&parse("t", yaml).unwrap()).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<TaskSupport> = c.tools.iter().skip(1).map(|t| t.task).collect();
        use TaskSupport::{Forbidden, Optional, Required};
        assert_eq!(got, [Optional, Required, Required, Optional, Forbidden]);
        let e = parse("t", "tools: [{name: x, task: sometimes, handler: {template: x}}]").unwrap_err();
        assert!(e.to_string().contains("unknown variant `sometimes`"), "{e}");
    }

    /// The listing shows the schemas as written (composition, conditionals, anchors,
    /// extension keywords, annotations); the validator enforces its compiled form of them.
    #[test]
    fn schemas_are_listed_as_authored_and_enforced() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                "properties": {"city": {"type": "string", "description": "City", "x-vendor": {"k": [1]}}}}},
            "properties": {
                "address": {"$ref": "#addressDef"},
                "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                "phone": {"type": "string", "x-mcp-header": "Phone"},
                "email": {"type": "string", "format": "email", "examples": ["a@b.c"]},
            },
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": false,
        });
        let output = json!({"type": "object", "properties": {"n": {"type": "integer"}},
            "not": {"required": ["secret"]}, "$comment": "kept"});
        let tool = json!({"tools": [{"name": "t", "inputSchema": schema, "outputSchema": output,
            "handler": {"template": "hi"}}]});
        let c = compile(&parse("t", &tool.to_string()).unwrap()).unwrap();
        let t = &c.tools[0];
        assert_eq!(t.descriptor["inputSchema"], schema);
        assert_eq!(t.descriptor["outputSchema"], output);
        assert!(t.input.is_valid(&json!({"email": "a@b.c"})));
        assert!(
            !t.input
                .is_valid(&json!({"contactMethod": "phone", "email": "a@b.c"}))
        );
        assert!(!t.input.is_valid(&json!({"email": "e", "address": {"city": 1}})));
        let headers: Vec<_> = t
            .input
            .param_headers()
            .iter()
            .map(|(p, h)| (&**p, &**h))
            .collect();
        assert_eq!(headers, vec![("phone", "mcp-param-phone")]);
        assert!(!t.output.as_ref().unwrap().is_valid(&json!({"secret": 1})));
        // A declaration the server could not check is a load error, not a silent annotation.
        let bad = json!({"tools": [{"name": "t", "handler": {"template": "hi"},
            "inputSchema": {"type": "object", "properties": {"p": {"type": "object", "x-mcp-header": "P"}}}}]});
        let p = problems(&bad.to_string());
        assert!(
            p.iter()
                .any(|m| m.contains("inputSchema.properties.p.x-mcp-header: only a property of type")),
            "{p:?}"
        );
    }

    #[test]
    fn a_good_toolset_compiles_every_handler_kind() {
        let c = compile(
            &parse(
                "t",
                r#"
tools:
  - {name: add, handler: {builtin: add}}
  - name: greet
    input: {name: string}
    handler: {template: "Hello {{name}}!"}
  - name: weather
    input: {city: string}
    handler: {http: {url: "http://127.0.0.1:1/w?c={{city}}", timeout: 2s}}
  - name: wc
    input: {path: string}
    handler: {exec: {command: [/usr/bin/wc, -l, --, "{{path}}"], timeout: 1s}}
  - name: add-then-greet
    input: {a: number, b: number}
    handler: {pipeline: [{tool: add}, {tool: greet, input: {name: "{{steps.0.text}}"}}]}
resources:
  - {uri: "doc://readme", name: readme, text: hi}
  - {uriTemplate: "greeting://{name}", name: greeting, text: "Hello {{name}}"}
prompts:
  - {name: p, arguments: [{name: topic, required: true}], messages: [{role: user, text: "About {{topic}}"}]}
"#,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(c.tools.len(), 5);
        assert_eq!(
            c.tools[0].descriptor["inputSchema"]["required"],
            json!(["a", "b"])
        );
        assert!(matches!(&c.tools[4].handler, CompiledHandler::Pipeline(s) if s[1].tool() == Some(1)));
        assert_eq!(c.resources.len(), 2);
    }

    #[test]
    fn secrets_are_read_where_they_reach_only_the_upstream_and_listed() {
        let c = compile(
            &parse(
                "t",
                r#"
tools:
  - name: api
    input: {q: string}
    handler:
      http:
        method: POST
        url: "https://api.example/v1?key={{secret.api-keys.query}}&q={{q}}"
        headers: {Authorization: "Bearer {{secret.api-keys.token}}"}
        body: {auth: "{{secret.other.k}}", q: "{{q}}"}
  - name: run
    handler: {exec: {command: [/bin/true], env: {TOKEN: "{{secret.api-keys.token}}", MODE: fast}}}
"#,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            c.secrets,
            std::collections::BTreeSet::from(["api-keys".to_owned(), "other".to_owned()])
        );
        let names: Vec<String> = c.tools[0]
            .handler
            .secrets()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            names,
            [
                "secret `api-keys` key `query`",
                "secret `api-keys` key `token`",
                "secret `other` key `k`"
            ]
        );
        assert_eq!(c.tools[1].handler.secrets().len(), 1);
    }

    #[test]
    fn secrets_anywhere_the_model_could_read_them_are_refused() {
        let only = "may be used only in an http tool's url, headers and body, and an exec tool's env";
        for (handler, at) in [
            (r#"{template: "{{secret.a.b}}"}"#, "handler.template"),
            (r#"{error: "{{secret.a.b}}"}"#, "handler.error"),
            (
                r#"{exec: {command: [/bin/echo, "{{secret.a.b}}"]}}"#,
                "handler.exec.command[1]",
            ),
            (
                r#"{exec: {command: [/bin/cat], stdin: "{{secret.a.b}}"}}"#,
                "handler.exec.stdin",
            ),
            (r#"{content: [{text: "{{secret.a.b}}"}]}"#, "handler.content[0]"),
            (
                r#"{sample: {prompt: "{{secret.a.b}}", maxTokens: 5}}"#,
                "handler.sample.prompt",
            ),
        ] {
            let p = problems(&format!("tools:\n  - {{name: t, handler: {handler}}}\n"));
            assert!(
                p.iter().any(|x| x.contains(at) && x.contains(only)),
                "{handler}: {p:?}"
            );
        }
        // An open input does not make `secret` an argument either.
        let p = problems(
            "tools:\n  - {name: t, input: {type: object}, handler: {template: \"{{secret.a.b}}\"}}\n",
        );
        assert!(p.iter().any(|x| x.contains(only)), "{p:?}");
        // A declared `secret` property is an ordinary argument outside secret places.
        assert!(
            problems("tools:\n  - {name: t, input: {secret: string}, handler: {template: \"{{secret}}\"}}\n")
                .is_empty()
        );
        assert!(
            problems("prompts:\n  - {name: p, messages: [{role: user, text: \"{{secret.a.b}}\"}]}\n")
                .iter()
                .any(|x| x.contains(only))
        );
    }

    #[test]
    fn malformed_secret_references_and_env_arguments_are_refused() {
        for (value, wanted) in [
            ("{{secret.a}}", "is not a secret reference"),
            ("{{secret.a.b.c}}", "is not a secret reference"),
            ("{{secret}}", "is not a secret reference"),
            (
                "{{q}}",
                "env values are literal text and `{{secret.NAME.KEY}}` references only",
            ),
        ] {
            let p = problems(&format!(
                "tools:\n  - {{name: t, input: {{q: string}}, handler: {{exec: {{command: [/bin/true], env: {{X: \"{value}\"}}}}}}}}\n"
            ));
            assert!(
                p.iter()
                    .any(|x| x.contains("handler.exec.env.X") && x.contains(wanted)),
                "{value}: {p:?}"
            );
        }
        let p =
            problems("tools:\n  - {name: t, handler: {exec: {command: [/bin/true], env: {\"A=B\": x}}}}\n");
        assert!(
            p.iter()
                .any(|x| x.contains("not a valid environment variable name")),
            "{p:?}"
        );
        // The authority stays literal: a secret cannot pick the host.
        let p = problems("tools:\n  - {name: t, handler: {http: {url: \"https://{{secret.a.host}}/x\"}}}\n");
        assert!(!p.is_empty());
    }

    #[test]
    fn tls_settings_name_secrets_the_pods_may_read_and_need_https() {
        let c = compile(
            &parse(
                "t",
                "tools:\n  - {name: t, handler: {http: {url: \"https://api.internal/x\", tls: {caSecret: corp-ca, clientCertSecret: client-tls}}}}\n",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            c.secrets,
            std::collections::BTreeSet::from(["client-tls".to_owned(), "corp-ca".to_owned()])
        );
        let CompiledHandler::Http(h) = &c.tools[0].handler else {
            panic!()
        };
        let tls = h.tls.as_ref().unwrap();
        assert_eq!(tls.ca.as_ref().unwrap().key, "ca.crt");
        let (cert, key) = tls.client.as_ref().unwrap();
        assert_eq!((cert.key.as_str(), key.key.as_str()), ("tls.crt", "tls.key"));
        for (tls, wanted) in [
            ("{caSecret: a}", "needs an https url"),
            ("{}", "set caSecret or caConfigMap, clientCertSecret, or both"),
            ("{caSecret: a, caConfigMap: b}", "set one"),
            ("{caConfigMap: UPPER}", "not a ConfigMap name"),
        ] {
            let p = problems(&format!(
                "tools:\n  - {{name: t, handler: {{http: {{url: \"http://x/\", tls: {tls}}}}}}}\n"
            ));
            assert!(
                p.iter()
                    .any(|x| x.contains("handler.http.tls") && x.contains(wanted)),
                "{tls}: {p:?}"
            );
        }
        let p = problems(
            "tools:\n  - {name: t, handler: {http: {url: \"https://x/\", tls: {caSecret: \"a.b\"}}}}\n",
        );
        assert!(
            p.iter()
                .any(|x| x.contains("tls.caSecret") && x.contains("not a Secret name")),
            "{p:?}"
        );
    }

    #[test]
    fn a_toolset_may_reference_a_bounded_number_of_secrets() {
        let tools: String = (0..=MAX_SECRETS)
            .map(|i| {
                format!(
                    "  - {{name: t{i}, handler: {{http: {{url: \"http://h/?k={{{{secret.s{i}.k}}}}\"}}}}}}\n"
                )
            })
            .collect();
        let p = problems(&format!("tools:\n{tools}"));
        assert!(
            p.iter().any(|x| x.contains("reference 65 Secrets; at most 64")),
            "{p:?}"
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let p = problems(
            r#"
tools:
  - {name: "bad name", handler: {builtin: nope}}
  - {name: t, input: {x: strnig}, handler: {template: "{{y}}"}}
  - {name: t, handler: {http: {url: "ftp://x", timeout: 9d, headers: {Content-Length: "0", Content-Type: text/plain}}}}
  - {name: e, handler: {exec: {command: [wc]}}}
  - {name: p, handler: {pipeline: [{tool: missing}]}}
"#,
        );
        let expect = [
            "tools[0].name: `bad name` is not a valid tool name",
            "tools[0].handler.builtin: unknown builtin `nope`",
            "tools[1].input.x: unknown type `strnig`",
            "tools[2].name: duplicate tool name `t` (also tools[1])",
            "tools[2].handler.http.url: must start with http:// or https://",
            "tools[2].handler.http.timeout: `9d`: unknown unit",
            "tools[2].handler.http.headers.Content-Length: `Content-Length` is set by quiver-server",
            "tools[3].handler.exec.command[0]: must be an absolute path",
            "tools[4].handler.pipeline[0].tool: no tool named `missing`",
        ];
        for e in expect {
            assert!(p.iter().any(|x| x.starts_with(e)), "missing {e:?} in {p:#?}");
        }
        // An http tool may set its body's type.
        assert!(!p.iter().any(|x| x.contains("Content-Type")), "{p:#?}");
    }

    #[test]
    fn templates_must_name_declared_inputs_and_earlier_steps() {
        let p = problems(
            r#"
tools:
  - {name: g, input: {name: string}, handler: {template: "Hi {{nmae}}"}}
  - name: pipe
    input: {name: string}
    handler: {pipeline: [{tool: g, input: {name: "{{steps.0.text}}"}}]}
"#,
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("tools[0].handler.template: template uses `nmae`")),
            "{p:#?}"
        );
        assert!(
            p.iter()
                .any(|x| x.contains("pipeline[0].input: `steps.0` refers to a step that has not run yet")),
            "{p:#?}"
        );
    }

    #[test]
    fn pipeline_cycles_are_rejected() {
        let p = problems(
            "tools:\n  - {name: a, handler: {pipeline: [{tool: b}]}}\n  - {name: b, handler: {pipeline: [{tool: a}]}}\n",
        );
        assert!(
            p.iter().any(|x| x.contains("pipeline cycle: a -> b -> a")),
            "{p:#?}"
        );
    }

    #[test]
    fn the_whole_url_authority_must_be_literal() {
        let tool = |url: &str| {
            problems(&format!(
                "tools:\n  - {{name: a, input: {{p: string}}, handler: {{http: {{url: \"{url}\"}}}}}}\n"
            ))
        };
        // Every way a value could pick the server: host, a host suffix, userinfo, port,
        // an authority that is never closed by a literal `/`, `?` or `#`.
        for url in [
            "http://{{p}}/x",
            "http://api.example{{p}}/",
            "http://x@{{p}}/",
            "http://127.0.0.1:{{p}}/",
            "https://api.example.com{{p}}",
            "http://{{p}}",
        ] {
            let p = tool(url);
            assert!(
                p.iter().any(|x| x.contains("must be literal and followed by")),
                "{url}: {p:#?}"
            );
        }
        for url in [
            "ftp://h/{{p}}",
            "h/{{p}}",
            "http:///{{p}}",
            "http://:80/{{p}}",
            "http://h:99999/{{p}}",
            "http://h:+80/{{p}}",
            "http://a b/{{p}}",
            "http://h\\\\@evil/{{p}}",
            "http://[::1/{{p}}",
        ] {
            assert!(!tool(url).is_empty(), "{url} was accepted");
        }
        assert!(
            tool("http://h/a/../{{p}}")
                .iter()
                .any(|x| x.contains("`..` segment"))
        );
        // The value may shape the path, query and fragment.
        for url in [
            "http://api.example.com/{{p}}",
            "https://u:pw@api.example.com:8443/v1?q={{p}}",
            "http://h#{{p}}",
            "http://[::1]:8080/x/{{p}}",
            "http://h",
        ] {
            assert_eq!(tool(url), Vec::<String>::new(), "{url}");
        }
    }

    #[test]
    fn pipeline_walks_are_iterative_and_bounded() {
        // A chain of 8,000 pipelines: the old recursive check overflowed its stack here.
        let mut yaml = String::from("tools:\n  - {name: leaf, handler: {builtin: now}}\n");
        for i in 0..8_000 {
            let next = if i == 7_999 {
                "leaf".to_owned()
            } else {
                format!("p{}", i + 1)
            };
            yaml.push_str(&format!(
                "  - {{name: p{i}, handler: {{pipeline: [{{tool: {next}}}]}}}}\n"
            ));
        }
        let p = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || problems(&yaml))
            .unwrap()
            .join()
            .expect("compiling a long chain must not overflow a small stack");
        assert!(
            p.iter().any(|x| x.contains("nest 8000 deep from `p0`")),
            "{:#?}",
            &p[..3]
        );
        assert!(p.len() <= 11, "problems are summarised, got {}", p.len());
        assert!(p.last().unwrap().contains("more pipelines"), "{p:#?}");

        // Exactly MAX_PIPELINE_NESTING levels run; one more is refused.
        let chain = |n: usize| {
            let mut y = String::from("tools:\n  - {name: leaf, handler: {builtin: now}}\n");
            for i in 0..n {
                let next = if i + 1 == n {
                    "leaf".to_owned()
                } else {
                    format!("p{}", i + 1)
                };
                y.push_str(&format!(
                    "  - {{name: p{i}, handler: {{pipeline: [{{tool: {next}}}]}}}}\n"
                ));
            }
            problems(&y)
        };
        assert_eq!(chain(MAX_PIPELINE_NESTING), Vec::<String>::new());
        assert!(chain(MAX_PIPELINE_NESTING + 1)[0].contains("at most 16"));

        // Fan-out: 10 steps at each of 8 levels is 10^8 steps for one call.
        let mut y = String::from("tools:\n  - {name: l0, handler: {builtin: now}}\n");
        for level in 1..=8 {
            let steps = vec![format!("{{tool: l{}}}", level - 1); 10].join(", ");
            y.push_str(&format!(
                "  - {{name: l{level}, handler: {{pipeline: [{steps}]}}}}\n"
            ));
        }
        let p = problems(&y);
        assert!(
            p.iter().any(|x| x.contains("`l4` would run 11110 steps")),
            "{p:#?}"
        );
        assert!(
            p.iter().any(|x| x.contains("`l8` would run 111111110 steps")),
            "{p:#?}"
        );
        assert!(!p.iter().any(|x| x.contains("`l3`")), "{p:#?}");
        // ...while 10 x 3 levels (1,110 steps) is fine.
        y.truncate(y.find("  - {name: l4").unwrap());
        assert_eq!(problems(&y), Vec::<String>::new());
    }

    #[test]
    fn deep_json_values_are_refused_before_any_walk() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        for (field, yaml) in [
            (
                "inputSchema",
                format!(
                    "inputSchema: {{type: object, properties: {{a: {{default: {}}}}}}}",
                    deep(40)
                ),
            ),
            (
                "outputSchema",
                format!("outputSchema: {{type: object, x: {}}}", deep(40)),
            ),
            (
                "input.a",
                format!("input: {{a: {{type: array, default: {}}}}}", deep(40)),
            ),
        ] {
            let p = problems(&format!(
                "tools:\n  - {{name: t, handler: {{builtin: json}}, {yaml}}}\n"
            ));
            assert!(
                p.iter()
                    .any(|x| x.starts_with(&format!("tools[0].{field}: nests")) && x.contains("at most 32")),
                "{field}: {p:#?}"
            );
        }
        let p = problems(&format!(
            "tools:\n  - {{name: t, handler: {{http: {{method: POST, url: \"http://h/\", body: {}}}}}}}\n",
            deep(40)
        ));
        assert!(p.iter().any(|x| x.contains("handler.http.body: nests")), "{p:#?}");
        let p = problems(&format!(
            "tools:\n  - {{name: j, handler: {{builtin: json}}}}\n  - {{name: t, handler: {{pipeline: [{{tool: j, input: {{a: {}}}}}]}}}}\n",
            deep(40)
        ));
        assert!(p.iter().any(|x| x.contains("pipeline[0].input: nests")), "{p:#?}");
        // 31 levels is within bounds.
        assert_eq!(
            problems(&format!(
                "tools:\n  - {{name: t, handler: {{builtin: json}}, outputSchema: {{type: object, properties: {{a: {{default: {}}}}}}}}}\n",
                deep(27)
            )),
            Vec::<String>::new()
        );
    }

    #[test]
    fn content_blocks_are_checked_as_a_class() {
        let p = problems(
            r#"
tools:
  - name: c
    input: {who: string}
    handler:
      content:
        - {image: {data: "not base64!", mimeType: image/png}}
        - {audio: {data: "AAAA", mimeType: ""}}
        - {resource: {uri: "x://a", text: t, blob: "AAAA"}}
        - {resource: {uri: "x://b"}}
        - {resourceLink: {uri: "x://{{nobody}}", name: ""}}
        - {text: "{{who}}"}
resources:
  - {uri: "x://r", name: r, text: a, blob: "AAAA"}
  - {uri: "x://s", name: s, blob: "%%%%"}
  - {uri: "x://t", name: t}
prompts:
  - name: p
    messages:
      - {role: user, text: a, content: {text: b}}
      - {role: user}
      - {role: user, content: {image: {data: "{{missing}}", mimeType: image/png}}}
"#,
        );
        for needle in [
            "content[0].image.data: must be base64",
            "content[1].audio.mimeType: must not be empty",
            "content[2].resource: set exactly one of `text` and `blob`",
            "content[3].resource: set exactly one of `text` and `blob`",
            "content[4].resourceLink.name: must not be empty",
            "content[4].resourceLink.uri",
            "resources[0]",
            "resources[1].blob: must be base64",
            "resources[2]",
            "messages[0]",
            "messages[1]",
            "messages[2].content.image.data",
        ] {
            assert!(
                p.iter().any(|x| x.contains(needle)),
                "no problem with {needle:?} in {p:#?}"
            );
        }
        assert!(!p.iter().any(|x| x.contains("content[5]")), "{p:#?}");
    }

    #[test]
    fn uri_patterns_match_and_decode() {
        let u = UriPattern::compile("file:///{dir}/x/{name}.txt").unwrap();
        assert_eq!(
            u.matches("file:///a%20b/x/readme.txt"),
            Some(json!({"dir": "a b", "name": "readme"}))
        );
        assert_eq!(u.matches("file:///a/y/readme.txt"), None);
        assert!(UriPattern::compile("x://{a}{b}").is_err());
    }
}

//! The completion and logging family: `completion/complete` and (handshake era)
//! `logging/setLevel`.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::envelope::parse_params;
use super::error::RpcError;
use super::request::{Done, Request, Waiting};
use super::server::Server;
use crate::config::{LogLevel, ResourceKind};
use crate::protocol::{self, RESOURCE_NOT_FOUND};

/// Most values one `completion/complete` answer lists (the protocol's limit).
const MAX_COMPLETIONS: usize = 100;

#[derive(Deserialize)]
struct CompleteParams<'a> {
    #[serde(borrow, rename = "ref")]
    reference: CompleteRef<'a>,
    #[serde(borrow)]
    argument: CompleteArgument<'a>,
    /// Arguments already chosen (`context.arguments`), passed to an upstream.
    #[serde(default)]
    context: Option<Value>,
}

#[derive(Deserialize)]
struct CompleteRef<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct CompleteArgument<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    value: Cow<'a, str>,
}

#[derive(Deserialize)]
struct LevelParams<'a> {
    #[serde(borrow)]
    level: Cow<'a, str>,
}

/// `completion/complete`: the configured values of a prompt's or resource template's
/// argument that start with what the user typed (without case); for an upstream's prompt or
/// template, what the upstream completes (the caller permitted as for getting the prompt or
/// reading the resource, the upstream's limits counting it).
pub(super) fn complete<'a>(s: &'a Arc<Server>, req: &'a Request<'a>, out: &'a mut Vec<u8>) -> Waiting<'a> {
    Box::pin(async move {
        let p: CompleteParams<'_> = parse_params(req.params)?;
        let snap = s.registry.load_full();
        if let Some(result) = upstream_completion(s, req, &snap, &p).await? {
            protocol::write_result(out, req.id, &serde_json::to_vec(&result).unwrap_or_default());
            return Ok(Done::Written);
        }
        complete_local(&snap, &p, req, out)
    })
}

/// What the upstream serving `p.reference` completes; `None` for a prompt or resource of
/// this ToolSet. The caller must be permitted to get the prompt (read the resource) with
/// the value typed so far, and each value the upstream offers is kept only if the caller
/// would be permitted with it: a completion reveals nothing a get or read would refuse.
async fn upstream_completion(
    s: &Server,
    req: &Request<'_>,
    snap: &crate::registry::Snapshot,
    p: &CompleteParams<'_>,
) -> Result<Option<Value>, RpcError> {
    let Some(target) = Completed::of(snap, p) else {
        return Ok(None);
    };
    // What the client says it chose: only the prompt's arguments or the template's
    // variables, only strings (what a get or read would have).
    let mut chosen = serde_json::Map::new();
    if let Some(Value::Object(a)) = p.context.as_ref().and_then(|c| c.get("arguments")) {
        for (k, v) in a {
            if v.is_string() && target.names.iter().any(|n| n == k) {
                chosen.insert(k.clone(), v.clone());
            }
        }
    }
    let name = &*p.argument.name;
    if !target.names.iter().any(|n| n == name) {
        return Err(RpcError::invalid_params(format!(
            "Invalid params: `{}` is not an argument of this prompt or resource template",
            name.chars().take(64).collect::<String>()
        )));
    }
    let permits = |value: &str| {
        let mut args = chosen.clone();
        args.insert(name.to_owned(), Value::String(value.to_owned()));
        target.permitted(s, req, Value::Object(args))
    };
    permits(&p.argument.value)?;
    let _places = match snap.config.upstreams.get(target.upstream) {
        Some(u) => super::govern::admit(s, &u.limits, "completion/complete", req).await?,
        None => None,
    };
    let argument = json!({"name": name, "value": p.argument.value});
    let context = p.context.as_ref().map(|_| json!({"arguments": chosen}));
    let mut result = target
        .link
        .complete(target.reference.clone(), argument, context)
        .await
        .map_err(|e| super::resources::upstream_error(target.link, &e, p.reference.uri.as_deref()))?;
    if let Some(c) = result.get_mut("completion").and_then(Value::as_object_mut) {
        let before = c.get("values").and_then(Value::as_array).map_or(0, Vec::len);
        if let Some(Value::Array(values)) = c.get_mut("values") {
            values.retain(|v| v.as_str().is_some_and(|v| permits(v).is_ok()));
            if values.len() < before {
                // What was left out is not counted for the caller.
                c.remove("total");
            }
        }
    }
    Ok(Some(result))
}

/// An upstream's prompt or resource template a completion is for.
struct Completed<'s> {
    upstream: usize,
    link: &'s std::sync::Arc<crate::upstream::Link>,
    /// The reference in the upstream's own names.
    reference: Value,
    /// Its arguments (a prompt) or variables (a template).
    names: Vec<String>,
    kind: CompletedKind<'s>,
}

enum CompletedKind<'s> {
    Prompt(&'s crate::config::CompiledPrompt),
    Resource(&'s crate::config::CompiledResource),
}

impl<'s> Completed<'s> {
    fn of(snap: &'s crate::registry::Snapshot, p: &CompleteParams<'_>) -> Option<Self> {
        match (&*p.reference.kind, &p.reference.name, &p.reference.uri) {
            ("ref/prompt", Some(name), _) => {
                let prompt = &snap.config.prompts[snap.prompt_index(name)?];
                let from = prompt.upstream.as_ref()?;
                Some(Self {
                    upstream: from.upstream,
                    link: snap.upstreams.get(from.upstream)?,
                    reference: json!({"type": "ref/prompt", "name": from.remote}),
                    names: prompt.arguments.clone(),
                    kind: CompletedKind::Prompt(prompt),
                })
            }
            ("ref/resource", _, Some(uri)) => {
                let r = snap
                    .config
                    .resources
                    .iter()
                    .find(|r| r.declared_uri() == uri.as_ref())?;
                let ResourceKind::Upstream {
                    upstream, pattern, ..
                } = &r.kind
                else {
                    return None;
                };
                let (link, remote) = super::resources::upstream_of(snap, r, uri)?;
                Some(Self {
                    upstream: *upstream,
                    link,
                    reference: json!({"type": "ref/resource", "uri": remote}),
                    names: pattern
                        .iter()
                        .flat_map(|p| p.variables())
                        .map(str::to_owned)
                        .collect(),
                    kind: CompletedKind::Resource(r),
                })
            }
            _ => None,
        }
    }

    /// Whether the caller may get the prompt, or read the resource, with `args`; a
    /// template's policies see the URI its variables fill in.
    fn permitted(&self, s: &Server, req: &Request<'_>, args: Value) -> Result<(), RpcError> {
        match self.kind {
            CompletedKind::Prompt(prompt) => super::govern::permitted(
                s,
                prompt.policies.as_deref(),
                req,
                crate::config::policy::Target::Prompt(&prompt.name),
                &args,
            ),
            CompletedKind::Resource(r) => {
                let mut uri = r.declared_uri().to_owned();
                for (k, v) in args.as_object().into_iter().flatten() {
                    if let Some(v) = v.as_str() {
                        uri = uri.replace(&format!("{{{k}}}"), v);
                    }
                }
                super::resources::permitted(s, req, r, Some(args), &uri).map(|_| ())
            }
        }
    }
}

/// [`complete`] for a prompt or resource template of this ToolSet.
fn complete_local(
    snap: &crate::registry::Snapshot,
    p: &CompleteParams<'_>,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<Done, RpcError> {
    let values = match (&*p.reference.kind, &p.reference.name, &p.reference.uri) {
        ("ref/prompt", Some(name), _) => {
            let Some(i) = snap.prompt_index(name) else {
                return Err(RpcError::invalid_params(format!("Unknown prompt: {name}")));
            };
            snap.config.prompts[i].values.get(&*p.argument.name)
        }
        ("ref/resource", _, Some(uri)) => {
            let Some(r) = snap
                .config
                .resources
                .iter()
                .find(|r| r.declared_uri() == uri.as_ref())
            else {
                return Err(RpcError::new(
                    RESOURCE_NOT_FOUND,
                    format!("Resource not found: {uri}"),
                ));
            };
            r.values.get(&*p.argument.name)
        }
        _ => {
            return Err(RpcError::invalid_params(
                "Invalid params: `ref` must be {type: ref/prompt, name} or {type: ref/resource, uri}",
            ));
        }
    };
    let prefix = p.argument.value.to_lowercase();
    let matching: Vec<&String> = values
        .into_iter()
        .flatten()
        .filter(|v| v.to_lowercase().starts_with(&prefix))
        .collect();
    let shown = &matching[..matching.len().min(MAX_COMPLETIONS)];
    let result = json!({"completion": {
        "values": shown,
        "total": matching.len(),
        "hasMore": matching.len() > shown.len(),
    }});
    protocol::write_result(out, req.id, &serde_json::to_vec(&result).unwrap_or_default());
    Ok(Done::Written)
}

/// `logging/setLevel` (handshake era): the session's level for log messages. Without a
/// session there is nowhere to keep it: such a client gets `info`.
pub(super) fn set_level(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: LevelParams<'_> = parse_params(req.params)?;
    let Some(level) = LogLevel::parse(&p.level) else {
        return Err(RpcError::invalid_params(format!(
            "Invalid params: unknown level `{}` (one of debug, info, notice, warning, error, critical, alert, emergency)",
            p.level.chars().take(64).collect::<String>()
        )));
    };
    s.sessions.set_level(req.ctx.session, level);
    protocol::write_result(out, req.id, b"{}");
    Ok(Done::Written)
}

//! The completion and logging family: `completion/complete` and (handshake era)
//! `logging/setLevel`.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::json;

use super::envelope::parse_params;
use super::error::RpcError;
use super::request::{Done, Request};
use super::server::Server;
use crate::config::LogLevel;
use crate::protocol::{self, RESOURCE_NOT_FOUND};

/// Most values one `completion/complete` answer lists (the protocol's limit).
const MAX_COMPLETIONS: usize = 100;

#[derive(Deserialize)]
struct CompleteParams<'a> {
    #[serde(borrow, rename = "ref")]
    reference: CompleteRef<'a>,
    #[serde(borrow)]
    argument: CompleteArgument<'a>,
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
/// argument that start with what the user typed (without case).
pub(super) fn complete(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let p: CompleteParams<'_> = parse_params(req.params)?;
    let snap = s.registry.load();
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

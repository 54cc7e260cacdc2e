//! The prompts family: `prompts/list` and `prompts/get` (whose questions to the client are
//! asked as a 2026-07-28 input round).

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::envelope::parse_params;
use super::error::RpcError;
use super::request::{Done, Request, Waiting};
use super::rounds::stateless_args;
use super::server::Server;
use super::tools::page;
use crate::config::Role;
use crate::peer::CallCtx;
use crate::protocol::{self, INTERNAL_ERROR};
use crate::registry::ListKind;
use crate::template::Budget;

#[derive(Deserialize)]
struct PromptParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
}

/// `prompts/list`.
pub(super) fn list(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    page(s, ListKind::Prompts, req, out)
}

/// `prompts/get`: a prompt of this ToolSet at once, an upstream's from its upstream. Stamps
/// its own 2026-07-28 results.
pub(super) fn get<'a>(s: &'a Arc<Server>, req: &'a Request<'a>, out: &'a mut Vec<u8>) -> Waiting<'a> {
    Box::pin(async move {
        let p: PromptParams<'_> = parse_params(req.params)?;
        let snap = s.registry.load_full();
        let Some(i) = snap.prompt_index(&p.name) else {
            return Err(RpcError::invalid_params(format!("Unknown prompt: {}", p.name)));
        };
        let prompt = &snap.config.prompts[i];
        let Some(from) = &prompt.upstream else {
            return get_local(s, req, out);
        };
        let stateless = stateless_args(req)?;
        let stamped = stateless.is_some();
        let args = Value::Object(p.arguments.unwrap_or_default());
        super::govern::permitted(
            s,
            prompt.policies.as_deref(),
            req,
            crate::config::policy::Target::Prompt(&prompt.name),
            &args,
        )?;
        check_arguments(prompt, &args)?;
        // The upstream's limits count its prompts as they count its calls.
        let _permits = match snap.config.upstreams.get(from.upstream) {
            Some(u) => super::govern::admit(s, &u.limits, "prompts/get", req).await?,
            None => None,
        };
        let Some(link) = snap.upstreams.get(from.upstream) else {
            return Err(RpcError::invalid_params(format!("Unknown prompt: {}", p.name)));
        };
        // A 2026-07-28 client answers the upstream's questions in its input rounds.
        let m = stateless
            .map(|m| s.stateless_call("prompts/get", &p.name, &args, m))
            .transpose()?;
        let r = link
            .get_prompt(&from.remote, &args, super::rounds::round_cx(m.as_ref()).as_ref())
            .await;
        if let Some(m) = m
            && s.interrupted(m.inputs.finish(), &m.call, &snap, req.id, out)?
        {
            return Ok(Done::Written);
        }
        let result = r.map_err(|e| super::resources::upstream_error(link, &e, None))?;
        protocol::write_result(out, req.id, &serde_json::to_vec(&result).unwrap_or_default());
        if stamped {
            crate::dispatch::stateless::stamp(out, &snap.result_stamp);
        }
        Ok(Done::Written)
    })
}

/// Refuses a `prompts/get` without one of the prompt's required arguments.
fn check_required(prompt: &crate::config::CompiledPrompt, args: &Value) -> Result<(), RpcError> {
    let missing: Vec<&str> = prompt
        .required
        .iter()
        .filter(|r| args.get(r.as_str()).is_none_or(Value::is_null))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(RpcError::invalid_params(format!(
        "Missing required argument(s) for prompt {}: {}",
        prompt.name,
        missing.join(", ")
    )))
}

/// The arguments of an upstream's prompt: its required ones present, each a string (what
/// `prompts/get` sends), none it does not list.
fn check_arguments(prompt: &crate::config::CompiledPrompt, args: &Value) -> Result<(), RpcError> {
    check_required(prompt, args)?;
    for (k, v) in args.as_object().into_iter().flatten() {
        if !prompt.arguments.contains(k) {
            return Err(RpcError::invalid_params(format!(
                "Prompt {} has no argument `{}`",
                prompt.name,
                k.chars().take(64).collect::<String>()
            )));
        }
        if !v.is_string() {
            return Err(RpcError::invalid_params(format!(
                "Prompt {}: argument `{k}` must be a string",
                prompt.name
            )));
        }
    }
    Ok(())
}

/// `prompts/get` of a prompt of this ToolSet. A prompt that asks the client questions is
/// served under 2026-07-28 only: until every answer is in, the answer is an
/// `InputRequiredResult`.
fn get_local(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    let stateless = stateless_args(req)?;
    let p: PromptParams<'_> = parse_params(req.params)?;
    let snap = s.registry.load();
    let Some(i) = snap.prompt_index(&p.name) else {
        return Err(RpcError::invalid_params(format!("Unknown prompt: {}", p.name)));
    };
    let prompt = &snap.config.prompts[i];
    let stamped = stateless.is_some();
    let mut args = Value::Object(p.arguments.unwrap_or_default());
    // Before the arguments are checked: a refused caller learns nothing of them.
    super::govern::permitted(
        s,
        prompt.policies.as_deref(),
        req,
        crate::config::policy::Target::Prompt(&prompt.name),
        &args,
    )?;
    check_required(prompt, &args)?;
    if !prompt.ask.is_empty() {
        let Some(m) = stateless else {
            return Err(RpcError::invalid_params(format!(
                "Prompt {} asks the client for input, which needs protocol 2026-07-28 (input-required results)",
                p.name
            )));
        };
        let m = s.stateless_call("prompts/get", &p.name, &args, m)?;
        let cx = CallCtx {
            level: None,
            caps: Some(m.inputs.caps),
            inputs: Some(&m.inputs),
            ..CallCtx::DETACHED
        };
        // Under 2026-07-28 asking never waits: answers are in the request or the question
        // is recorded.
        let o = futures_util::FutureExt::now_or_never(crate::exec::ask_questions(&prompt.ask, &args, &cx));
        let call = m.call;
        let round = m.inputs.finish();
        if s.interrupted(round, &call, &snap, req.id, out)? {
            return Ok(Done::Written);
        }
        match o {
            Some(o) if !o.is_error => {
                if let Some(obj) = args.as_object_mut() {
                    obj.insert("input".into(), o.structured.unwrap_or(Value::Null));
                }
            }
            Some(o) => return Err(RpcError::invalid_params(format!("Prompt {}: {}", p.name, o.text))),
            None => {
                return Err(RpcError::new(
                    INTERNAL_ERROR,
                    "the prompt's questions did not complete",
                ));
            }
        }
    }
    let mut budget = Budget::new();
    let mut messages = Vec::with_capacity(prompt.messages.len());
    for (role, t) in &prompt.messages {
        let role = match role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        let content = t
            .render(&args, &mut budget)
            .map_err(|e| RpcError::invalid_params(format!("Prompt {}: {e}", p.name)))?;
        messages.push(json!({"role": role, "content": content}));
    }
    let mut result = json!({"messages": messages});
    if let Some(d) = &prompt.description {
        result["description"] = Value::String(d.clone());
    }
    protocol::write_result(out, req.id, &serde_json::to_vec(&result).unwrap_or_default());
    if stamped {
        crate::dispatch::stateless::stamp(out, &snap.result_stamp);
    }
    Ok(Done::Written)
}

//! The `io.modelcontextprotocol/tasks` extension, in any revision: who may use it (a client
//! that declares it), which calls it answers with a task, how its answers and errors read,
//! and its own method, `tasks/update` (a task's questions answered). `tasks/get` and
//! `tasks/cancel`, which both wires have, are answered in [`super::wire`]; the tasks live in
//! the server's [`Tasks`](super::store::Tasks), and `tools/call` creates them.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::task::UpdateError;
use super::{Waiting, owner, paced};
use crate::dispatch::envelope::parse_params;
use crate::dispatch::error::RpcError;
use crate::dispatch::request::{Done, Request};
use crate::dispatch::server::Server;
use crate::protocol;

const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Whether the request's client declared the tasks extension: in its session's
/// `initialize`, or in the request's own `_meta` client capabilities.
pub(in crate::dispatch) fn negotiated(s: &Server, req: &Request<'_>) -> bool {
    if let Some(m) = &req.meta {
        return m.caps.tasks;
    }
    if s.sessions.caps(req.ctx.session).is_some_and(|c| c.tasks) {
        return true;
    }
    #[derive(Deserialize)]
    struct Env<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<MetaCaps<'a>>,
    }
    #[derive(Deserialize)]
    struct MetaCaps<'a> {
        #[serde(borrow, rename = "io.modelcontextprotocol/clientCapabilities")]
        caps: Option<&'a RawValue>,
    }
    req.params
        .and_then(|p| serde_json::from_str::<Env<'_>>(p.get()).ok())
        .and_then(|e| e.meta?.caps)
        .is_some_and(|c| crate::dispatch::stateless::client_caps(Some(c)).tasks)
}

/// The `-32021` of a client that did not declare the tasks extension.
pub(super) fn missing_extension(what: &str) -> RpcError {
    RpcError::new(
        protocol::MISSING_CAPABILITY,
        format!("{what} needs the client capability extensions[\"{EXTENSION}\"]"),
    )
    .with_data(json!({"requiredCapabilities": {"extensions": {EXTENSION: {}}}}))
}

/// The error for a task id the caller has no task of (unknown, expired or another's).
pub(super) fn unknown() -> RpcError {
    RpcError::invalid_params("Invalid params: unknown taskId (it may have expired)")
}

/// Writes a tasks/* result object, with `resultType` in the handshake era (the 2026-07-28
/// stamp adds it there).
pub(super) fn write(req: &Request<'_>, mut v: Value, out: &mut Vec<u8>) -> Done {
    if req.meta.is_none()
        && let Value::Object(m) = &mut v
    {
        m.insert("resultType".into(), json!("complete"));
    }
    protocol::write_result(out, req.id, &serde_json::to_vec(&v).unwrap_or_default());
    Done::Written
}

/// `tasks/update`: the client's answers to a task's questions (`inputResponses`, by the keys
/// of its `inputRequests`), taken before the acknowledgement, so the next `tasks/get` shows
/// them. Answers to keys the task does not wait for are ignored; a malformed answer to one
/// it waits for is refused (-32602) and changes nothing. Paced as the other task requests.
pub(in crate::dispatch) fn update<'a>(
    s: &'a Arc<Server>,
    req: &'a Request<'a>,
    out: &'a mut Vec<u8>,
) -> Waiting<'a> {
    Box::pin(update_now(s, req, out))
}

async fn update_now(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    #[derive(Deserialize)]
    struct UpdateParams<'a> {
        #[serde(borrow, rename = "taskId")]
        task_id: Cow<'a, str>,
        #[serde(rename = "inputResponses")]
        input_responses: Value,
    }
    paced(s, req)?;
    if !negotiated(s, req) {
        return Err(missing_extension("tasks/update"));
    }
    let p = parse_params::<UpdateParams<'_>>(req.params)?;
    let Value::Object(responses) = p.input_responses else {
        return Err(RpcError::invalid_params(
            "Invalid params: `inputResponses` must be an object mapping each input request's key to the client's result",
        ));
    };
    match s.tasks.update(owner(req), &p.task_id, responses).await {
        Ok(()) => Ok(write(req, json!({}), out)),
        Err(UpdateError::Unknown) => Err(unknown()),
        Err(UpdateError::Invalid(why)) => Err(RpcError::invalid_params(why)),
        Err(UpdateError::Full(why)) => Err(RpcError::new(protocol::RATE_LIMITED, why)),
        Err(UpdateError::Store(why)) => Err(RpcError::new(protocol::INTERNAL_ERROR, why)),
    }
}

/// Whether calls of `tool` are answered with a task when the client negotiated tasks: its
/// `task` setting (by default the kinds that may run long: a process, an HTTP request, an
/// upstream call; a tool that asks the client, or a pipeline, when it declares `task`).
pub(in crate::dispatch) fn wanted(tool: &crate::registry::Tool) -> bool {
    tool.def.task != crate::config::TaskSupport::Forbidden
}

/// Refuses a call of a tool that runs only as a task from a client that did not declare the
/// tasks extension (-32021, naming the extension).
pub(super) fn required(s: &Server, tool: &crate::registry::Tool, req: &Request<'_>) -> Result<(), RpcError> {
    if tool.def.task == crate::config::TaskSupport::Required && !negotiated(s, req) {
        return Err(missing_extension("tools/call"));
    }
    Ok(())
}

#[cfg(test)]
#[path = "extension_tests.rs"]
mod tests;

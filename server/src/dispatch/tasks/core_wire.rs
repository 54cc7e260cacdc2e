//! The tasks of protocol 2025-11-25, where they are part of the core protocol: a client
//! asks for a task with `params.task` on `tools/call` and gets a `CreateTaskResult`, then
//! polls `tasks/get`, waits with `tasks/result`, pages `tasks/list` and stops one with
//! `tasks/cancel`. The tasks are those of the extension (one [`Tasks`] store), owned the same way
//! ([`super::owner`]); only the wire differs.
//!
//! This wire is in force for a request read in the handshake era at revision 2025-11-25
//! from a client that did not declare the `io.modelcontextprotocol/tasks` extension (one
//! that did gets the extension's tasks, in any revision).
//!
//! [`Tasks`]: super::store::Tasks

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::task::{Status, TaskView};
use super::{TaskParams, Waiting, owner, paced, quota};
use crate::config::TaskSupport;
use crate::dispatch::envelope::parse_params;
use crate::dispatch::error::RpcError;
use crate::dispatch::request::{Done, Request};
use crate::dispatch::server::Server;
use crate::peer::CallCtx;
use crate::protocol;
use crate::registry::Snapshot;

/// The revision whose core has tasks.
pub(super) const REVISION: &str = "2025-11-25";

/// Tasks in one `tasks/list` page.
pub(super) const LIST_PAGE: usize = 50;

/// The `_meta` key tying a message to its task.
const RELATED: &str = "io.modelcontextprotocol/related-task";

/// Whether the request is read with this wire (see the module's documentation): by what
/// its session negotiated when this server saw its `initialize` (over stdio the transport
/// names no revision per message), else by the revision the request names.
pub(in crate::dispatch) fn in_force(s: &Server, req: &Request<'_>) -> bool {
    if req.meta.is_some() || req.ctx.version != REVISION {
        return false;
    }
    match s.sessions.caps(req.ctx.session) {
        Some(c) => c.core_tasks && !c.tasks,
        None => !super::extension::negotiated(s, req),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskMetadata {
    #[serde(default)]
    ttl: Option<u64>,
}

/// What a `tools/call` asks of tasks, checked against the tool's `task` setting: `Some(ttl)`
/// to answer it with a task kept `ttl` (the store shortens it to its own), `None` to answer
/// it as usual. In this wire a task for a tool that runs none, and a call without one of a
/// tool that runs only as a task, are `-32601`; elsewhere the extension's rule applies.
pub(in crate::dispatch) fn asked(
    s: &Server,
    tool: &crate::registry::Tool,
    req: &Request<'_>,
    task: Option<&RawValue>,
) -> Result<Option<Duration>, RpcError> {
    // The common call (no task asked, a tool that does not insist) decides nothing here:
    // whether the client declared the extension is only looked up when it matters.
    let plain = task.is_none() && tool.def.task != TaskSupport::Required;
    if plain || !in_force(s, req) {
        super::extension::required(s, tool, req)?;
        return Ok(None);
    }
    let Some(task) = task else {
        return Err(RpcError::new(
            protocol::METHOD_NOT_FOUND,
            format!(
                "Task augmentation required for tools/call requests: tool {} runs only as a task (send params.task)",
                tool.def.name
            ),
        ));
    };
    if tool.def.task == TaskSupport::Forbidden {
        return Err(RpcError::new(
            protocol::METHOD_NOT_FOUND,
            format!(
                "Tool {} does not support task-augmented execution (call it without params.task)",
                tool.def.name
            ),
        ));
    }
    let meta: TaskMetadata = serde_json::from_str(task.get()).map_err(|e| {
        RpcError::invalid_params(format!(
            "Invalid params: `task` must be {{\"ttl\"?: milliseconds}}: {e}"
        ))
    })?;
    Ok(Some(meta.ttl.map_or(Duration::MAX, Duration::from_millis)))
}

/// Answers a task-augmented `tools/call`: creates the task (kept `ttl`, at most the store's
/// TTL), runs the call detached from the request (`tasks/cancel` or the task's TTL stops
/// it), and writes the `CreateTaskResult`.
pub(in crate::dispatch) async fn start(
    server: &Arc<Server>,
    req: &Request<'_>,
    call: crate::dispatch::request::Called,
    permits: Option<crate::limits::Permits>,
    ttl: Duration,
    out: &mut Vec<u8>,
) -> Result<(), RpcError> {
    let crate::dispatch::request::Called {
        snap, index, args, ..
    } = call;
    let token = CancellationToken::new();
    let task = server
        .tasks
        .create(owner(req), &quota(req), token.clone(), ttl)
        .await?;
    let id = task.id.clone();
    let s = server.clone();
    let ttl = task.ttl;
    // As the same call without a task: the caller's token (identity to an upstream or API),
    // and the caller, kept for a pipeline whose steps have policies and for webhooks.
    let credential = req.ctx.caller.and_then(|p| p.credential.clone());
    let caller = crate::dispatch::govern::kept_caller(&snap, index, req).map(|p| *p);
    let (session, who): (Box<str>, Box<str>) = (req.ctx.session.into(), owner(req).into());
    let running = server.tasks.running();
    server.running.spawn(async move {
        let _running = running;
        let start = Instant::now();
        let cx = CallCtx {
            credential: credential.as_deref(),
            caller: caller.as_ref(),
            ..CallCtx::DETACHED
        };
        let o = tokio::select! {
            o = s.exec.run(&snap, index, args, 0, &cx) => o,
            () = token.cancelled() => {
                s.tasks.stopped();
                return;
            }
            () = tokio::time::sleep(ttl) => {
                // Forgotten now: this wakes whoever waits on its end (to find it gone).
                let why = "the task's TTL ended before its call did";
                s.tasks.finish(&id, Status::Failed(i64::from(protocol::INTERNAL_ERROR), why.into())).await;
                return;
            }
        };
        drop(permits);
        let status = concluded(&snap, index, o, start, &s, caller.as_ref());
        s.tasks.finish(&id, status).await;
        told(&s, &session, &who, &id).await;
    });
    write(req, &json!({"task": task.core()}), out);
    Ok(())
}

/// Sends `notifications/tasks/status` (the task as `tasks/get` answers it) to the streams
/// of the session that created the task, if it has one. Clients may not rely on it.
async fn told(s: &Server, session: &str, owner: &str, id: &str) {
    if session.is_empty() {
        return;
    }
    let Ok(Some(t)) = s.tasks.get(owner, id).await else {
        return;
    };
    let message = json!({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": t.core()});
    let _ = s.events.send(Arc::new(crate::dispatch::server::Event {
        session: Some(session.into()),
        message: message.to_string().into(),
        kind: crate::dispatch::server::EventKind::Other,
    }));
}

/// Turns the answer in `out` (a `tools/call` response refusing the arguments, a tool error)
/// into the `CreateTaskResult` of a task that has already ended with it: a client that
/// asked for a task finds the call's outcome where it looks for it, with `tasks/result`.
pub(in crate::dispatch) async fn ended(
    server: &Server,
    req: &Request<'_>,
    ttl: Duration,
    out: &mut Vec<u8>,
) -> Result<(), RpcError> {
    let answer = std::mem::take(out);
    let result = serde_json::from_slice::<Value>(&answer)
        .ok()
        .and_then(|mut v| v.get_mut("result").map(Value::take))
        .ok_or_else(|| RpcError::new(protocol::INTERNAL_ERROR, "the call's answer could not be read"))?;
    let task = server
        .tasks
        .create(owner(req), &quota(req), CancellationToken::new(), ttl)
        .await?;
    server.tasks.finish(&task.id, Status::Completed(result)).await;
    write(req, &json!({"task": task.core()}), out);
    Ok(())
}

/// The end of a task's call: its result checked against the tool's output schema (and its
/// budget), its duration recorded by outcome and its metered tokens by caller (as a call
/// without a task).
fn concluded(
    snap: &Snapshot,
    index: usize,
    o: crate::protocol::output::ToolOutput,
    start: Instant,
    server: &Server,
    caller: Option<&crate::spec::access::Principal>,
) -> Status {
    let (o, checked) = crate::exec::check_output(snap, index, o);
    if let Some(n) = checked.tokens {
        server.metrics.tokens.to_caller(caller, n);
    }
    let tool = &snap.tools[index];
    let h = if o.is_error {
        tool.metrics.tool_error(&tool.def.name)
    } else {
        tool.metrics.ok(&tool.def.name)
    };
    h.observe(start.elapsed());
    let mut buf = Vec::with_capacity(256);
    o.write_json(&mut buf);
    match serde_json::from_slice::<Value>(&buf) {
        Ok(r) => Status::Completed(r),
        Err(_) => Status::Failed(
            i64::from(protocol::INTERNAL_ERROR),
            "the tool's result could not be read".into(),
        ),
    }
}

#[derive(Deserialize)]
struct ListParams<'a> {
    #[serde(borrow, default)]
    cursor: Option<Cow<'a, str>>,
}

/// The error for a task id the caller has no task of (unknown, expired or another's).
pub(super) fn not_found() -> RpcError {
    RpcError::invalid_params("Failed to retrieve task: Task not found (it may have expired)")
}

/// Writes the result `v` as it is.
pub(super) fn write(req: &Request<'_>, v: &Value, out: &mut Vec<u8>) {
    protocol::write_result(out, req.id, &serde_json::to_vec(v).unwrap_or_default());
}

/// Cancels the working task `id` of `owner` (`tasks/cancel` in this wire): the task, now
/// cancelled; `-32602` for a task that has ended, before the cancel or just as it came.
pub(super) async fn cancelled(s: &Server, owner: &str, id: &str) -> Result<TaskView, RpcError> {
    let t = s.tasks.get(owner, id).await?.ok_or_else(not_found)?;
    if t.ended() {
        return Err(terminal(&t));
    }
    s.tasks.cancel(owner, &t.id).await?;
    // Read again: the task may have ended on its own just before the cancel.
    let t = s.tasks.get(owner, &t.id).await?.ok_or_else(not_found)?;
    if t.status != Status::Cancelled {
        return Err(terminal(&t));
    }
    Ok(t)
}

fn terminal(t: &TaskView) -> RpcError {
    RpcError::invalid_params(format!(
        "Cannot cancel task: already in terminal status '{}'",
        t.core()["status"].as_str().unwrap_or("")
    ))
}

/// `tasks/list`: a page of the caller's tasks (only in this wire).
pub(in crate::dispatch) fn list<'a>(
    s: &'a Arc<Server>,
    req: &'a Request<'a>,
    out: &'a mut Vec<u8>,
) -> Waiting<'a> {
    Box::pin(list_now(s, req, out))
}

async fn list_now(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    if !in_force(s, req) {
        return Err(absent("tasks/list"));
    }
    paced(s, req)?;
    if owner(req).is_empty() {
        // Tasks of callers with neither a session nor credentials are not told apart.
        return Err(RpcError::new(
            protocol::INVALID_REQUEST,
            "tasks/list needs a session (initialize first) or an authenticated caller",
        ));
    }
    let cursor = match req.params {
        Some(_) => parse_params::<ListParams<'_>>(req.params)?.cursor,
        None => None,
    };
    let bad =
        || RpcError::invalid_params("Invalid cursor: not issued by tasks/list (list again without a cursor)");
    let after = match cursor.as_deref() {
        None => None,
        Some(c) => Some(
            c.strip_prefix("tasks-")
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(bad)?,
        ),
    };
    let (tasks, next) = s
        .tasks
        .list(owner(req), after, LIST_PAGE)
        .await?
        .ok_or_else(bad)?;
    let mut r = json!({"tasks": tasks.iter().map(TaskView::core).collect::<Vec<_>>()});
    if let Some(n) = next {
        r["nextCursor"] = json!(format!("tasks-{n}"));
    }
    write(req, &r, out);
    Ok(Done::Written)
}

fn absent(method: &str) -> RpcError {
    RpcError::new(
        protocol::METHOD_NOT_FOUND,
        format!("Method not found: {method} (tasks of protocol {REVISION} only)"),
    )
}

/// `tasks/result` (only in this wire): waits until the task ends, within the request's
/// deadline, then answers exactly what the call answered (its result, with the task in
/// `_meta`, or its error).
pub(in crate::dispatch) fn result<'a>(
    s: &'a Arc<Server>,
    req: &'a Request<'a>,
    out: &'a mut Vec<u8>,
) -> Waiting<'a> {
    Box::pin(async move {
        if !in_force(s, req) {
            return Err(absent("tasks/result"));
        }
        paced(s, req)?;
        let p: TaskParams<'_> = parse_params(req.params)?;
        let who = owner(req);
        let limit = s.limits.request_timeout;
        let deadline = req.deadline.unwrap_or_else(|| Instant::now() + limit);
        // `notifications/cancelled` naming this request ends the wait (the task runs on).
        let token = (!req.ctx.session.is_empty()).then(CancellationToken::new);
        let _entry = token
            .as_ref()
            .map(|t| s.cancels.register(req.ctx.session, req.id, t));
        let cancelled = async {
            match &token {
                Some(t) => t.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            known = s.tasks.wait_end(who, &p.task_id) => {
                if !known? {
                    return Err(not_found());
                }
            }
            () = cancelled => return Err(RpcError::new(protocol::REQUEST_CANCELLED, "Request cancelled")),
            () = tokio::time::sleep_until(deadline.into()) => {}
        }
        let t = s.tasks.get(who, &p.task_id).await?.ok_or_else(not_found)?;
        payload(&t, req, out)
    })
}

/// The answer of `tasks/result` for a task as it stands.
fn payload(t: &TaskView, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    match &t.status {
        Status::Completed(r) => {
            let mut r = r.clone();
            if let Value::Object(m) = &mut r {
                let meta = m.entry("_meta").or_insert_with(|| json!({}));
                if let Value::Object(meta) = meta {
                    meta.insert(RELATED.into(), json!({"taskId": t.id}));
                }
            }
            write(req, &r, out);
            Ok(Done::Written)
        }
        Status::Failed(code, message) => Err(RpcError::new(
            i32::try_from(*code).unwrap_or(protocol::INTERNAL_ERROR),
            message.clone(),
        )),
        Status::Cancelled => Err(RpcError::invalid_params(format!(
            "Task {} was cancelled: it has no result",
            t.id
        ))),
        _ => Err(RpcError::new(
            protocol::INTERNAL_ERROR,
            format!(
                "Task {} is still {} after the server's request timeout; call tasks/result again, or poll tasks/get",
                t.id,
                t.core()["status"].as_str().unwrap_or("working")
            ),
        )),
    }
}

#[cfg(test)]
#[path = "core_wire_tests.rs"]
mod tests;

//! The tools family: `tools/list` and `tools/call`, including the slow call handed back to
//! the transport ([`Deferred`]) and the call that runs here, cancellable and timed out.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::answer::Answering;
use super::envelope::parse_params;
use super::error::RpcError;
use super::govern::{self, Pending, Trail};
use super::reply::Reply;
use super::request::{Done, Request};
use super::revision::{HANDSHAKE, STATELESS, Stamp};
use super::rounds::{ModernCall, modern_args};
use super::server::{InflightGuard, Server};
use crate::config::access::Principal;
use crate::config::caller::Credential;
use crate::handlers::{ToolOutput, check_output};
use crate::metrics::{Refusal, outcome_index};
use crate::peer::{CallCtx, Peer};
use crate::protocol;
use crate::registry::{ListKind, Snapshot};
use crate::session::LogLevel;

/// The `tools/call` slot in [`crate::metrics::METHODS`].
const TOOLS_CALL: usize = crate::metrics::method_index("tools/call");

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<CallMeta<'a>>,
    /// 2025-11-25: the call asks to run as a task (`{ttl?}`).
    #[serde(borrow, default)]
    task: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallMeta<'a> {
    #[serde(borrow, default)]
    progress_token: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CursorParams<'a> {
    #[serde(borrow, default)]
    cursor: Option<Cow<'a, str>>,
}

/// `tools/list`.
pub(super) fn list(s: &Server, req: &Request<'_>, out: &mut Vec<u8>) -> Result<Done, RpcError> {
    // 2025-11-25 lists each tool's `execution.taskSupport`.
    let core = super::tasks_core::in_force(s, req);
    if let Some(page) = super::visible::page(&s.registry.load(), req, &s.metrics.gov, core) {
        protocol::write_result(out, req.id, &page?);
        return Ok(Done::Written);
    }
    if !core {
        return page(s, ListKind::Tools, req, out);
    }
    let cursor = match req.params {
        Some(_) => parse_params::<CursorParams<'_>>(req.params)?.cursor,
        None => None,
    };
    let mut result = Vec::new();
    s.registry
        .load()
        .write_core_tools_page(cursor.as_deref(), &mut result)
        .ok_or_else(|| {
            RpcError::invalid_params(
                "Invalid cursor: not issued by the current list (it may have changed; list again without a cursor)",
            )
        })?;
    protocol::write_result(out, req.id, &result);
    Ok(Done::Written)
}

/// A page of a list (tools, resources, resource templates, prompts).
pub(super) fn page(
    s: &Server,
    kind: ListKind,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<Done, RpcError> {
    let cursor = match req.params {
        Some(_) => parse_params::<CursorParams<'_>>(req.params)?.cursor,
        None => None,
    };
    let snap = s.registry.load();
    match snap.page(kind, cursor.as_deref()) {
        Some(page) => {
            protocol::write_result(out, req.id, page);
            Ok(Done::Written)
        }
        None => Err(RpcError::invalid_params(
            "Invalid cursor: not issued by the current list (it may have changed; list again without a cursor)",
        )),
    }
}

/// `tools/call`: answered here (a fast handler, or a slow one where the transport cannot
/// stream), or handed back as a [`Deferred`] for the transport to run.
pub(super) async fn call(
    server: &Arc<Server>,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    mut trail: Option<&mut Trail>,
) -> Result<Option<Deferred>, RpcError> {
    let modern = modern_args(req)?;
    let p: CallParams<'_> = parse_params(req.params)?;
    if let Some(t) = trail.as_deref_mut() {
        t.asked(&p.name);
    }
    let guard = server.registry.load();
    let Some(index) = guard.tool_index(&p.name) else {
        return Err(RpcError::invalid_params(format!("Unknown tool: {}", p.name)));
    };
    let args = arguments(p.arguments)?;
    let tool = &guard.tools[index];
    if let Some(t) = trail.as_deref_mut() {
        t.resolve(&guard, index, &args);
    }
    // Before the arguments are looked at: a caller that may not call the tool learns
    // nothing from it.
    allowed(server, tool, req)?;
    super::visible::permitted(server, tool, req, &args)?;
    let core_task = super::tasks_core::asked(server, tool, req, p.task)?;
    // No limits: one branch (in `admit`).
    let permits = govern::admit(server, &tool.def.governance.limits, &tool.def.name, req).await?;
    let start = Instant::now();
    let mut problems = Vec::new();
    tool.def.input.validate(&args, &mut problems);
    if !problems.is_empty() {
        invalid(tool, &problems, req.id, start, out);
        if let Some(ttl) = core_task {
            super::tasks_core::ended(server, req, ttl, out)?;
        }
        if let Some(t) = trail {
            t.outcome = Some("invalid_arguments");
        }
        if modern.is_some() {
            crate::modern::stamp(out, &guard.result_stamp);
        }
        return Ok(None);
    }
    let modern = match modern {
        None => None,
        Some(m) => Some(Box::new(server.modern_call("tools/call", &p.name, &args, m)?)),
    };
    let progress = match &modern {
        Some(m) => m.progress.clone(),
        None => p.meta.and_then(|m| m.progress_token).map(ToOwned::to_owned),
    };
    let now = super::find::run(&guard, index, &args, req, &server.metrics.gov);
    if let Some(output) = now.or_else(|| server.exec.run_now(&guard, index, &args)) {
        let failed = conclude(&guard, index, req.id, output, start, out);
        noted(trail, failed);
        if modern.is_some() {
            crate::modern::stamp(out, &guard.result_stamp);
        }
        return Ok(None);
    }
    // A slow handler: hold the snapshot by Arc (a reload may swap meanwhile) and make the
    // call cancellable by `notifications/cancelled`.
    let snap: Arc<Snapshot> = arc_swap::Guard::into_inner(guard);
    if let Some(ttl) = core_task {
        return super::tasks_core::start(server, req, snap, index, args, permits, ttl, out).map(|()| None);
    }
    if super::tasks::wanted(&snap.tools[index]) && super::tasks::negotiated(server, req) {
        return start_task(server, req, snap, index, args, permits, out).map(|()| None);
    }
    if req.ctx.stream {
        return Ok(Some(deferred(
            server, req, snap, index, args, progress, modern, permits,
        )));
    }
    let cx = CallCtx {
        session: req.ctx.session,
        credential: credential(req).map(|c| &**c),
        caller: req.ctx.caller,
        level: modern.as_ref().map_or(Some(LogLevel::Info), |m| m.level),
        caps: modern.as_ref().map(|m| m.inputs.caps),
        inputs: modern.as_ref().map(|m| &m.inputs),
        ..CallCtx::DETACHED
    };
    let result = server
        .run_cancellable(&snap, index, args, req.ctx.session, req.id, req.deadline, &cx)
        .await;
    drop(permits);
    match (result, modern) {
        (Some(o), Some(m)) => server.conclude_modern(&snap, index, req.id, o, *m, start, out),
        (Some(o), None) => Ok(conclude(&snap, index, req.id, o, start, out)),
        (None, _) => Err(RpcError::new(protocol::REQUEST_CANCELLED, "Request cancelled")),
    }
    .map(|failed| {
        noted(trail, failed);
        None
    })
}

/// The [`Deferred`] of a slow call the transport streams.
#[allow(clippy::too_many_arguments)]
fn deferred(
    server: &Arc<Server>,
    req: &Request<'_>,
    snap: Arc<Snapshot>,
    index: usize,
    args: Value,
    progress: Option<Box<RawValue>>,
    modern: Option<Box<ModernCall>>,
    permits: Option<crate::limits::Permits>,
) -> Deferred {
    Deferred {
        server: server.clone(),
        session: req.ctx.session.into(),
        caller: kept_caller(&snap, index, req),
        snap,
        index,
        args,
        id: req.id.to_owned(),
        progress,
        start: req.start,
        modern,
        permits,
        audit: None,
        credential: credential(req).cloned(),
        trace: None,
    }
}

/// A call's `arguments`: an object, or none (an empty one).
fn arguments(given: Option<Value>) -> Result<Value, RpcError> {
    match given {
        None => Ok(Value::Object(Map::new())),
        Some(v @ Value::Object(_)) => Ok(v),
        Some(_) => Err(RpcError::invalid_params(
            "Invalid params: `arguments` must be an object",
        )),
    }
}

/// Answers a call whose arguments the input schema refuses: a tool error naming the problems.
fn invalid(
    tool: &crate::registry::Tool,
    problems: &[String],
    id: &RawValue,
    start: Instant,
    out: &mut Vec<u8>,
) {
    let text = format!(
        "Invalid arguments for tool {}: {}",
        tool.def.name,
        problems.join("; ")
    );
    write_tool_result(out, id, &ToolOutput::error(text));
    tool.metrics
        .invalid_arguments(&tool.def.name)
        .observe(start.elapsed());
}

/// Notes how a call that got a result ended, for its audit record.
fn noted(trail: Option<&mut Trail>, failed: bool) {
    if let Some(t) = trail {
        t.outcome = Some(if failed { "tool_error" } else { "ok" });
    }
}

/// Refuses a call the caller's credentials do not allow (the tool's `access`).
fn allowed(server: &Server, tool: &crate::registry::Tool, req: &Request<'_>) -> Result<(), RpcError> {
    let Some(need) = &tool.def.access else {
        return Ok(());
    };
    need.check(req.ctx.caller).map_err(|denied| {
        server.metrics.refused(Refusal::Forbidden);
        RpcError::new(protocol::FORBIDDEN, denied.message(&tool.def.name)).with_data(json!({
            "tool": tool.def.name,
            "missingScopes": denied.missing_scopes,
            "requiredScopes": denied.required_scopes,
            "allowedGroups": denied.not_in_groups,
        }))
    })
}

/// A slow tool call handed back to the transport (see [`super::Ctx::stream`]): everything it
/// needs, owned, so the transport can run it where it streams the answer.
#[derive(Debug)]
pub struct Deferred {
    server: Arc<Server>,
    session: Box<str>,
    snap: Arc<Snapshot>,
    index: usize,
    args: Value,
    id: Box<RawValue>,
    progress: Option<Box<RawValue>>,
    start: Instant,
    modern: Option<Box<ModernCall>>,
    /// In-flight places under concurrency limits, held until the call ends.
    permits: Option<crate::limits::Permits>,
    /// The call's audit record, until it ends.
    audit: Option<Box<Pending>>,
    credential: Option<Arc<Credential>>,
    /// The caller, kept only for a pipeline whose steps have policies.
    caller: Option<Box<Principal>>,
    /// The call's server span, when tracing is on (ended when the call ends).
    pub(super) trace: Option<opentelemetry::Context>,
}

/// The caller, kept for the deferred run of a pipeline some of whose steps have policies
/// (to check each step's call); `None` for any other tool, which needs no caller.
fn kept_caller(snap: &Snapshot, index: usize, req: &Request<'_>) -> Option<Box<Principal>> {
    let guarded = snap.tools[index]
        .policies
        .as_ref()
        .is_some_and(|p| !p.steps.is_empty());
    guarded.then(|| req.ctx.caller.cloned().map(Box::new)).flatten()
}

/// The caller's validated access token, when it presented one.
fn credential<'a>(req: &Request<'a>) -> Option<&'a Arc<Credential>> {
    req.ctx.caller.and_then(|p| p.credential.as_ref())
}

impl Deferred {
    /// Records the call in the audit trail when it ends.
    pub(super) fn audited(&mut self, p: Pending) {
        self.audit = Some(Box::new(p));
    }

    /// Runs the call, reaching the client through `peer`. Returns the answer, or `None` when
    /// the client cancelled the call (a cancelled request gets no response).
    pub async fn run(mut self, peer: Option<&Peer>) -> Option<Reply> {
        match self.trace.take() {
            None => self.run_here(peer).await,
            Some(cx) => {
                use crate::otel::FutureExt as _;
                let r = self.run_here(peer).with_context(cx.clone()).await;
                opentelemetry::trace::TraceContextExt::span(&cx).end();
                r
            }
        }
    }

    async fn run_here(self, peer: Option<&Peer>) -> Option<Reply> {
        let d = self;
        let server = &*d.server;
        let session = &*d.session;
        let inflight = InflightGuard::enter(&server.metrics.inflight);
        let cx = CallCtx {
            session,
            peer,
            progress_token: d.progress.as_deref(),
            level: match &d.modern {
                Some(m) => m.level,
                None => Some(server.sessions.level(session)),
            },
            caps: match &d.modern {
                Some(m) => Some(m.inputs.caps),
                None => server.sessions.caps(session),
            },
            inputs: d.modern.as_ref().map(|m| &m.inputs),
            pending: Some(&server.pending),
            dropped: Some(&server.metrics.peer_dropped),
            credential: d.credential.as_deref(),
            caller: d.caller.as_deref(),
        };
        let result = server
            .run_cancellable(&d.snap, d.index, d.args, session, &d.id, None, &cx)
            .await;
        drop(inflight);
        drop(d.permits);
        let mut audit = d.audit;
        let metric = TOOLS_CALL;
        let Some(o) = result else {
            server.metrics.record(
                metric,
                outcome_index(protocol::REQUEST_CANCELLED),
                d.start.elapsed(),
            );
            if let Some(p) = audit {
                server.audit_end(*p, None, true, 0);
            }
            return None;
        };
        let mut out = Vec::with_capacity(256);
        let (rev, r) = match d.modern {
            None => (
                &HANDSHAKE,
                Ok(conclude(&d.snap, d.index, &d.id, o, d.start, &mut out)),
            ),
            Some(m) => (
                &STATELESS,
                server.conclude_modern(&d.snap, d.index, &d.id, o, *m, d.start, &mut out),
            ),
        };
        if let (Some(p), Ok(failed)) = (audit.as_deref_mut(), &r) {
            noted(Some(&mut p.trail), *failed);
        }
        let error = audit.as_ref().and_then(|_| r.as_ref().err().cloned());
        let r = r.map(|_| ());
        let a = Answering {
            rev,
            metric,
            stamp: Stamp::Own,
            id: &d.id,
            start: d.start,
        };
        let reply = server.reply(&a, r, out);
        if let Some(p) = audit {
            server.audit_end(*p, error.as_ref(), false, reply.body.len());
        }
        Some(reply)
    }
}

impl Server {
    /// Ends a 2026-07-28 call: its result, or what its round gathered instead (an
    /// `InputRequiredResult`, a refused answer, a missing capability).
    #[allow(clippy::too_many_arguments)] // the call's parts, borrowed from its two callers
    fn conclude_modern(
        &self,
        snap: &Snapshot,
        index: usize,
        id: &RawValue,
        o: ToolOutput,
        m: ModernCall,
        start: Instant,
        out: &mut Vec<u8>,
    ) -> Result<bool, RpcError> {
        let round = m.inputs.finish();
        if self.interrupted(round, &m.call, snap, id, out)? {
            let tool = &snap.tools[index];
            tool.metrics.ok(&tool.def.name).observe(start.elapsed());
            return Ok(false);
        }
        let failed = conclude(snap, index, id, o, start, out);
        crate::modern::stamp(out, &snap.result_stamp);
        Ok(failed)
    }

    #[allow(clippy::too_many_arguments)] // the call's parts, borrowed from its two callers
    async fn run_cancellable(
        &self,
        snap: &Snapshot,
        index: usize,
        args: Value,
        session: &str,
        id: &RawValue,
        deadline: Option<Instant>,
        cx: &CallCtx<'_>,
    ) -> Option<ToolOutput> {
        // Only a call in a session can be cancelled (`notifications/cancelled` names a
        // request of its own session); a sessionless one needs no token.
        let token = (!session.is_empty()).then(CancellationToken::new);
        // Unregistered on drop, also when the request future is dropped (client gone).
        let _entry = token.as_ref().map(|t| self.cancels.register(session, id, t));
        let cancelled = async {
            match &token {
                Some(t) => t.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let limit = self.limits.request_timeout;
        let deadline = deadline.unwrap_or_else(|| Instant::now() + limit);
        tokio::select! {
            o = self.exec.run(snap, index, args, 0, cx) => Some(o),
            () = cancelled => None,
            () = tokio::time::sleep_until(deadline.into()) => {
                self.metrics.refused(Refusal::RequestTimeout);
                Some(ToolOutput::error(format!(
                    "the call did not finish within the server's request timeout ({})",
                    DisplayDuration(limit)
                )))
            }
        }
    }
}

/// `300s`, `1.5s`, `250ms`.
struct DisplayDuration(Duration);

impl fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.subsec_millis() == 0 {
            write!(f, "{}s", self.0.as_secs())
        } else if self.0 < Duration::from_secs(1) {
            write!(f, "{}ms", self.0.as_millis())
        } else {
            write!(f, "{}s", self.0.as_secs_f64())
        }
    }
}

fn write_tool_result(out: &mut Vec<u8>, id: &RawValue, o: &ToolOutput) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"result\":");
    o.write_json(out);
    out.push(b'}');
}

/// Checks a call's result against the tool's output schema, writes the response and records
/// the call's duration by outcome. Returns whether the result is a tool error.
#[inline]
pub(super) fn conclude(
    snap: &Snapshot,
    index: usize,
    id: &RawValue,
    o: ToolOutput,
    start: Instant,
    out: &mut Vec<u8>,
) -> bool {
    let o = check_output(snap, index, o);
    write_tool_result(out, id, &o);
    observe(&snap.tools[index], &o, start);
    o.is_error
}

#[inline]
fn observe(tool: &crate::registry::Tool, o: &ToolOutput, start: Instant) {
    let h = if o.is_error {
        crate::otel::tool_error();
        tool.metrics.tool_error(&tool.def.name)
    } else {
        tool.metrics.ok(&tool.def.name)
    };
    h.observe(start.elapsed());
}

/// Answers a `tools/call` with a task: creates it, runs the call detached from the request
/// (its result outlives the client's connection; `tasks/cancel` or the task's TTL stops it),
/// and writes the `CreateTaskResult`.
fn start_task(
    server: &Arc<Server>,
    req: &Request<'_>,
    snap: Arc<Snapshot>,
    index: usize,
    args: Value,
    permits: Option<crate::limits::Permits>,
    out: &mut Vec<u8>,
) -> Result<(), RpcError> {
    let token = CancellationToken::new();
    let task = server
        .tasks
        .create(super::tasks::owner(req), token.clone())
        .map_err(|e| RpcError::new(protocol::RATE_LIMITED, e.to_string()))?;
    let id = task.id.clone();
    let s = server.clone();
    let ttl = task.ttl;
    // The caller's token goes with the call as it would without a task (identity to an
    // upstream or API, `{{caller.CLAIM}}`), and so does the caller for step policies.
    let credential = credential(req).cloned();
    let caller = kept_caller(&snap, index, req);
    tokio::spawn(async move {
        let start = Instant::now();
        let cx = CallCtx {
            credential: credential.as_deref(),
            caller: caller.as_deref(),
            ..CallCtx::DETACHED
        };
        let run = s.exec.run(&snap, index, args, 0, &cx);
        let o = tokio::select! {
            o = run => o,
            () = token.cancelled() => return,
            () = tokio::time::sleep(ttl) => return,
        };
        drop(permits);
        let mut buf = Vec::new();
        let zero = RawValue::from_string("0".to_owned()).ok();
        if let Some(zero) = zero {
            conclude(&snap, index, &zero, o, start, &mut buf);
        }
        let status = match serde_json::from_slice::<Value>(&buf)
            .ok()
            .and_then(|mut v| v.get_mut("result").map(Value::take))
        {
            Some(r) => super::task_store::Status::Completed(r),
            None => super::task_store::Status::Failed(
                i64::from(protocol::INTERNAL_ERROR),
                "the tool's result could not be read".into(),
            ),
        };
        s.tasks.finish(&id, status);
    });
    protocol::write_result(
        out,
        req.id,
        &serde_json::to_vec(&task.created()).unwrap_or_default(),
    );
    Ok(())
}

//! The tools family: `tools/list` and `tools/call`, including the slow call handed back to
//! the transport ([`Deferred`]) and the call that runs here, cancellable and timed out.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::TOOLS_CALL;
use super::admit::{Admission, Admitted};
use super::answer::Answering;
use super::envelope::parse_params;
use super::error::RpcError;
use super::govern::{self, Pending, Trail};
use super::reply::Reply;
use super::request::{Called, Done, Request};
use super::revision::{HANDSHAKE, STATELESS, Stamp};
use super::rounds::{StatelessCall, stateless_args};
use super::server::{InflightGuard, Server};
use crate::audit::Text;
use crate::config::governance::Limit;
use crate::limits::Who;
use crate::metrics::{Refusal, outcome_index};
use crate::peer::{AccountSlot, CallCtx, Peer, UrlSlot};
use crate::protocol;
use crate::registry::{ListKind, Snapshot};
use crate::session::LogLevel;
use crate::spec::access::Principal;
use crate::spec::caller::Credential;
use crate::{exec::check_output, protocol::output::ToolOutput};

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
    let core = super::tasks::core_wire::in_force(s, req);
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

/// The error of a call of a tool this generation does not serve: one whose definition at a
/// pinned upstream or OpenAPI source awaits approval says so.
fn unknown_tool(server: &Server, name: &str) -> RpcError {
    match server.exec.upstreams.pins.awaiting(name) {
        Some(source) => RpcError::invalid_params(format!(
            "Tool {name} awaits approval: its definition at {} is new or changed since approved (kubectl quiver approve)",
            crate::config::upstream::pin::describe_source(&source)
        )),
        None => RpcError::invalid_params(format!("Unknown tool: {name}")),
    }
}

/// `tools/call`: answered here (a fast handler, or a slow one where the transport cannot
/// stream), or handed back as a [`Deferred`] for the transport to run.
pub(super) async fn call(
    server: &Arc<Server>,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    mut trail: Option<&mut Trail>,
) -> Result<Option<Box<Deferred>>, RpcError> {
    let stateless = stateless_args(req)?;
    let p: CallParams<'_> = parse_params(req.params)?;
    if let Some(t) = trail.as_deref_mut() {
        t.asked(&p.name);
    }
    let guard = server.registry.load();
    let Some(index) = guard.tool_index(&p.name) else {
        return Err(unknown_tool(server, &p.name));
    };
    let args = arguments(p.arguments)?;
    let tool = &guard.tools[index];
    if let Some(t) = trail.as_deref_mut() {
        t.resolve(&guard, index, &args);
    }
    let admitted = match super::admit::admit(server, req, tool, &args, p.task).await? {
        Admission::Run(a) => a,
        Admission::InvalidArguments(a, problems) => {
            let stamp = stateless.is_some().then_some(&*guard.result_stamp);
            refused_arguments(server, req, tool, &problems, &a, stamp, out).await?;
            if let Some(t) = trail {
                t.outcome = Some("invalid_arguments");
            }
            return Ok(None);
        }
    };
    let (start, permits) = (admitted.start, admitted.permits);
    let round = stateless
        .map(|m| server.call_round(&p.name, &args, m))
        .transpose()?;
    let now = super::find::run(&guard, index, &args, req, &server.metrics.gov);
    if let Some(output) = now.or_else(|| server.exec.run_now(&guard, index, &args)) {
        let ended = conclude(&guard, index, req.id, output, start, out);
        noted(server, req.ctx.caller, trail, ended, None);
        if round.is_some() {
            crate::dispatch::stateless::stamp(out, &guard.result_stamp);
        }
        return Ok(None);
    }
    let stateless = round.map(|r| r.open(server, &p.name, &args)).transpose()?;
    let progress = match &stateless {
        Some(m) => m.progress.clone(),
        None => p.meta.and_then(|m| m.progress_token).map(ToOwned::to_owned),
    };
    // A slow handler: hold the snapshot by Arc (a reload may swap meanwhile) and make the
    // call cancellable by `notifications/cancelled`.
    let snap: Arc<Snapshot> = arc_swap::Guard::into_inner(guard);
    if let Some(ttl) = admitted.task {
        let call = Called::new(snap, index, args, start);
        return super::tasks::core_wire::start(server, req, call, permits, ttl, out)
            .await
            .map(|()| None);
    }
    if super::tasks::extension::wanted(&snap.tools[index]) && super::tasks::extension::negotiated(server, req)
    {
        let call = Called::new(snap, index, args, start);
        return as_task(server, req, call, stateless, permits, out)
            .await
            .map(|()| None);
    }
    if req.ctx.stream {
        let call = Called::new(snap, index, args, start);
        return Ok(Some(Box::new(deferred(
            server, req, call, progress, stateless, permits,
        ))));
    }
    let caps = stateless.as_ref().map(|m| m.inputs.caps);
    let (url, account) = (UrlSlot::new(), AccountSlot::new());
    let cx = CallCtx {
        session: req.ctx.session,
        credential: credential(req).map(|c| &**c),
        caller: req.ctx.caller,
        level: stateless.as_ref().map_or(Some(LogLevel::Info), |m| m.level),
        caps,
        inputs: stateless.as_ref().map(|m| &m.inputs),
        url_needed: caps.is_some_and(|c| c.elicitation_url).then_some(&url),
        upstream_account: trail.is_some().then_some(&account),
        ..CallCtx::DETACHED
    };
    let result = server
        .run_cancellable(&snap, index, args, req.ctx.session, req.id, req.deadline, &cx)
        .await;
    drop(permits);
    if let Some(needed) = url.get() {
        return Err(RpcError::url_required(needed));
    }
    let ended = match (result, stateless) {
        (Some(o), Some(m)) => server.conclude_stateless(&snap, index, req.id, o, *m, start, out),
        (Some(o), None) => Ok(conclude(&snap, index, req.id, o, start, out)),
        (None, _) => Err(RpcError::new(protocol::REQUEST_CANCELLED, "Request cancelled")),
    }?;
    noted(server, req.ctx.caller, trail, ended, account.get());
    Ok(None)
}

/// Answers a call whose arguments the tool's schema refuses: the tool error, as the ended
/// task a 2025-11-25 client asked for, stamped for 2026-07-28 (`stamp`).
async fn refused_arguments(
    server: &Server,
    req: &Request<'_>,
    tool: &crate::registry::Tool,
    problems: &[String],
    admitted: &Admitted,
    stamp: Option<&[u8]>,
    out: &mut Vec<u8>,
) -> Result<(), RpcError> {
    invalid(tool, problems, req.id, admitted.start, out);
    if let Some(ttl) = admitted.task {
        super::tasks::core_wire::ended(server, req, ttl, out).await?;
    }
    if let Some(stamp) = stamp {
        crate::dispatch::stateless::stamp(out, stamp);
    }
    Ok(())
}

/// The [`Deferred`] of a slow call the transport streams (timed from the request's start).
fn deferred(
    server: &Arc<Server>,
    req: &Request<'_>,
    call: Called,
    progress: Option<Box<RawValue>>,
    stateless: Option<Box<StatelessCall>>,
    permits: Option<crate::limits::Permits>,
) -> Deferred {
    let Called {
        snap, index, args, ..
    } = call;
    Deferred {
        server: server.clone(),
        session: req.ctx.session.into(),
        caller: govern::kept_caller(&snap, index, req),
        snap,
        index,
        args,
        id: req.id.to_owned(),
        progress,
        start: req.start,
        stateless,
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

/// Notes how a call that got a result ended (and what its result guard found), and the
/// upstream account it acted as, for its audit record; counts the tokens of a metered result
/// for its caller.
fn noted(
    server: &Server,
    caller: Option<&Principal>,
    trail: Option<&mut Trail>,
    ended: Ended,
    account: Option<&Arc<str>>,
) {
    if let Some(n) = ended.tokens {
        server.metrics.tokens.to_caller(caller, n);
    }
    if let Some(t) = trail {
        t.outcome = Some(if ended.failed { "tool_error" } else { "ok" });
        t.guard = ended.guard;
        t.tokens = ended.tokens;
        t.upstream_account = account.map(|a| Text::new(a));
    }
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
    stateless: Option<Box<StatelessCall>>,
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
        let caps = match &d.stateless {
            Some(m) => Some(m.inputs.caps),
            None => server.sessions.caps(session),
        };
        let url = UrlSlot::new();
        let account = AccountSlot::new();
        let cx = CallCtx {
            session,
            peer,
            progress_token: d.progress.as_deref(),
            level: match &d.stateless {
                Some(m) => m.level,
                None => Some(server.sessions.level(session)),
            },
            caps,
            inputs: d.stateless.as_ref().map(|m| &m.inputs),
            pending: Some(&server.pending),
            dropped: Some(&server.metrics.peer_dropped),
            credential: d.credential.as_deref(),
            caller: d.caller.as_deref(),
            until_step: None,
            url_needed: caps.is_some_and(|c| c.elicitation_url).then_some(&url),
            upstream_account: d.audit.is_some().then_some(&account),
        };
        let result = server
            .run_cancellable(&d.snap, d.index, d.args, session, &d.id, None, &cx)
            .await;
        drop(inflight);
        drop(d.permits);
        let mut audit = d.audit;
        let metric = TOOLS_CALL;
        let Some(o) = result else {
            server.by_method.record(
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
        let (rev, r) = match (d.stateless, url.get()) {
            (m, Some(needed)) => (
                if m.is_some() { &STATELESS } else { &HANDSHAKE },
                Err(RpcError::url_required(needed)),
            ),
            (None, None) => (
                &HANDSHAKE,
                Ok(conclude(&d.snap, d.index, &d.id, o, d.start, &mut out)),
            ),
            (Some(m), None) => (
                &STATELESS,
                server.conclude_stateless(&d.snap, d.index, &d.id, o, *m, d.start, &mut out),
            ),
        };
        if let Ok(ended) = &r {
            let trail = audit.as_deref_mut().map(|p| &mut p.trail);
            noted(server, d.caller.as_deref(), trail, *ended, account.get());
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
    fn conclude_stateless(
        &self,
        snap: &Snapshot,
        index: usize,
        id: &RawValue,
        o: ToolOutput,
        m: StatelessCall,
        start: Instant,
        out: &mut Vec<u8>,
    ) -> Result<Ended, RpcError> {
        let round = m.inputs.finish();
        if self.interrupted(round, &m.call, snap, id, out)? {
            let tool = &snap.tools[index];
            tool.metrics.ok(&tool.def.name).observe(start.elapsed());
            return Ok(Ended::default());
        }
        let ended = conclude(snap, index, id, o, start, out);
        crate::dispatch::stateless::stamp(out, &snap.result_stamp);
        Ok(ended)
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

/// How a call that got a result ended, for its audit record.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ended {
    /// The result is a tool error.
    pub failed: bool,
    /// What the tool's result guard found in it.
    pub guard: Option<crate::config::guards::Verdict>,
    /// Its tokens, when its tool meters them.
    pub tokens: Option<u64>,
}

/// Checks a call's result against the tool's output schema and its result guard, writes the
/// response and records the call's duration by outcome.
#[inline]
pub(super) fn conclude(
    snap: &Snapshot,
    index: usize,
    id: &RawValue,
    o: ToolOutput,
    start: Instant,
    out: &mut Vec<u8>,
) -> Ended {
    let (o, checked) = check_output(snap, index, o);
    write_tool_result(out, id, &o);
    observe(&snap.tools[index], &o, start);
    Ended {
        failed: o.is_error,
        guard: checked.guard,
        tokens: checked.tokens,
    }
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

/// Answers a `tools/call` of a tool that runs as a task. A 2026-07-28 call of a pipeline
/// first runs, in the request, its steps before the first one that may run long: their
/// questions are ordinary input rounds (`InputRequiredResult` and `requestState`), and the
/// call becomes a task, with the answers gathered, once they need nothing more. Any other
/// call is a task at once, whose questions wait in `input_required` for `tasks/update`.
async fn as_task(
    server: &Arc<Server>,
    req: &Request<'_>,
    c: Called,
    stateless: Option<Box<StatelessCall>>,
    permits: Option<crate::limits::Permits>,
    out: &mut Vec<u8>,
) -> Result<(), RpcError> {
    let caps = match &stateless {
        Some(m) => m.inputs.caps,
        None => server.sessions.caps(req.ctx.session).unwrap_or_default(),
    };
    let prefix = match (&stateless, &c.snap.tools[c.index].def.handler) {
        (Some(_), crate::config::CompiledHandler::Pipeline(steps)) => {
            crate::exec::pipeline::first_long_step(&c.snap, steps).filter(|&b| b > 0)
        }
        _ => None,
    };
    let (Some(until), Some(m)) = (prefix, stateless) else {
        return start_task(server, req, c, permits, Map::new(), caps, out).await;
    };
    let m = *m;
    let result = {
        let cx = CallCtx {
            session: req.ctx.session,
            credential: credential(req).map(|c| &**c),
            caller: req.ctx.caller,
            level: m.level,
            caps: Some(caps),
            inputs: Some(&m.inputs),
            until_step: Some(until),
            ..CallCtx::DETACHED
        };
        let args = c.args.clone();
        server
            .run_cancellable(&c.snap, c.index, args, req.ctx.session, req.id, req.deadline, &cx)
            .await
    };
    let Some(o) = result else {
        return Err(RpcError::new(protocol::REQUEST_CANCELLED, "Request cancelled"));
    };
    let round = m.inputs.finish();
    let used = round.used.clone();
    if server.interrupted(round, &m.call, &c.snap, req.id, out)? {
        let tool = &c.snap.tools[c.index];
        tool.metrics.ok(&tool.def.name).observe(c.start.elapsed());
        return Ok(());
    }
    if o.is_error {
        // The steps before the task ended the call (a declined form): its result, at once.
        conclude(&c.snap, c.index, req.id, o, c.start, out);
        crate::dispatch::stateless::stamp(out, &c.snap.result_stamp);
        return Ok(());
    }
    start_task(server, req, c, permits, used, caps, out).await
}

/// The most times one task may stop for the client's input.
const MAX_INPUT_ROUNDS: usize = 32;

/// A task's run, detached from the request that created it.
struct Detached {
    server: Arc<Server>,
    call: Called,
    id: String,
    token: CancellationToken,
    deadline: Instant,
    credential: Option<Arc<Credential>>,
    caller: Option<Box<Principal>>,
    caps: crate::session::ClientCaps,
    /// The tool's concurrency limits (without their rates), taken again when the task runs
    /// on after a wait for input; `None`: it has none.
    places: Option<Arc<[Arc<Limit>]>>,
    /// Who the places are counted against.
    holder: Holder,
}

/// Who a task's concurrency places are counted against (a [`Who`], owned).
enum Holder {
    Subject(Box<str>),
    Address(crate::limits::ClientAddr),
    Session(Box<str>),
    Anonymous,
}

impl Holder {
    fn of(who: Who<'_>) -> Self {
        match who {
            Who::Subject(s) => Holder::Subject(s.into()),
            Who::Address(a) => Holder::Address(a),
            Who::Session(s) => Holder::Session(s.into()),
            Who::Anonymous => Holder::Anonymous,
        }
    }

    fn who(&self) -> Who<'_> {
        match self {
            Holder::Subject(s) => Who::Subject(s),
            Holder::Address(a) => Who::Address(*a),
            Holder::Session(s) => Who::Session(s),
            Holder::Anonymous => Who::Anonymous,
        }
    }
}

/// The concurrency caps of `limits`, without their rates (a call counts once against a rate,
/// however often it waits for input); `None` when none has one.
fn concurrency_only(limits: &[Arc<Limit>]) -> Option<Arc<[Arc<Limit>]>> {
    let caps: Vec<Arc<Limit>> = limits
        .iter()
        .filter(|l| l.concurrency.is_some())
        .map(|l| {
            Arc::new(Limit {
                scope: l.scope,
                name: l.name.clone(),
                at: l.at.clone(),
                rate: None,
                concurrency: l.concurrency,
                per_caller: l.per_caller,
                shared: l.shared,
            })
        })
        .collect();
    (!caps.is_empty()).then(|| caps.into())
}

impl Detached {
    /// Runs the call with the answers known so far; a run that asks the client parks the task
    /// in `input_required` (freeing its concurrency places while a person answers) and runs
    /// again with the answers `tasks/update` brings. Ends on its result, its error, its
    /// cancellation or its TTL.
    async fn run(self, mut answers: Map<String, Value>, mut permits: Option<crate::limits::Permits>) {
        use super::tasks::Status;
        let c = &self.call;
        for n in 0..=MAX_INPUT_ROUNDS {
            // The tool's duration is that of its last run, without the waits for input.
            let start = Instant::now();
            let inputs = crate::peer::Inputs::new(self.caps, answers);
            let o = {
                let cx = CallCtx {
                    credential: self.credential.as_deref(),
                    caller: self.caller.as_deref(),
                    caps: Some(self.caps),
                    inputs: Some(&inputs),
                    ..CallCtx::DETACHED
                };
                tokio::select! {
                    o = self.server.exec.run(&c.snap, c.index, c.args.clone(), 0, &cx) => o,
                    () = self.token.cancelled() => return,
                    () = tokio::time::sleep_until(self.deadline.into()) => return,
                }
            };
            let round = inputs.finish();
            if let Some(why) = round.invalid {
                return self
                    .end(Status::Failed(i64::from(protocol::INVALID_PARAMS), why))
                    .await;
            }
            if !round.missing.is_empty() {
                let names: Vec<&str> = round.missing.iter().map(|n| n.capability()).collect();
                let why = format!(
                    "Missing required client capability: {} (the task asks the client; declare it in the client's capabilities)",
                    names.join(", ")
                );
                return self
                    .end(Status::Failed(i64::from(protocol::MISSING_CAPABILITY), why))
                    .await;
            }
            if round.asked.is_empty() {
                drop(permits);
                return self.end(completed(c, o, start)).await;
            }
            if n == MAX_INPUT_ROUNDS {
                let why = format!("the tool asked for input more than {MAX_INPUT_ROUNDS} times");
                return self
                    .end(Status::Failed(i64::from(protocol::INTERNAL_ERROR), why))
                    .await;
            }
            drop(permits.take());
            let Some(rx) = self.server.tasks.park(&self.id, round.asked, round.used).await else {
                return;
            };
            answers = tokio::select! {
                a = rx => match a {
                    Ok(a) => a,
                    Err(_) => return,
                },
                () = self.token.cancelled() => return,
                () = tokio::time::sleep_until(self.deadline.into()) => return,
            };
            let Some(p) = self.retake().await else {
                return;
            };
            permits = p;
        }
    }

    /// Takes the tool's concurrency places again, waiting (backing off up to a second) while
    /// they are full; `None` when the task is cancelled or expires meanwhile.
    async fn retake(&self) -> Option<Option<crate::limits::Permits>> {
        let Some(limits) = &self.places else {
            return Some(None);
        };
        let mut wait = Duration::from_millis(25);
        loop {
            if let Ok(p) = self.server.limiter.admit(limits, self.holder.who()).await {
                return Some(Some(p));
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.token.cancelled() => return None,
                () = tokio::time::sleep_until(self.deadline.into()) => return None,
            }
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    async fn end(&self, status: super::tasks::Status) {
        self.server.tasks.finish(&self.id, status).await;
    }
}

/// The status of a task whose run (begun at `start`) gave `o`: its result (checked against
/// the output schema, recorded in the tool's metrics).
fn completed(c: &Called, o: ToolOutput, start: Instant) -> super::tasks::Status {
    let mut buf = Vec::new();
    let zero = RawValue::from_string("0".to_owned()).ok();
    if let Some(zero) = zero {
        conclude(&c.snap, c.index, &zero, o, start, &mut buf);
    }
    match serde_json::from_slice::<Value>(&buf)
        .ok()
        .and_then(|mut v| v.get_mut("result").map(Value::take))
    {
        Some(r) => super::tasks::Status::Completed(r),
        None => super::tasks::Status::Failed(
            i64::from(protocol::INTERNAL_ERROR),
            "the tool's result could not be read".into(),
        ),
    }
}

/// Answers a `tools/call` with a task: creates it, runs the call detached from the request
/// (its result outlives the client's connection; `tasks/cancel` or the task's TTL stops it),
/// and writes the `CreateTaskResult`. `answers` are those the call gathered in the request;
/// `caps` what the client declared (its questions need them).
async fn start_task(
    server: &Arc<Server>,
    req: &Request<'_>,
    call: Called,
    permits: Option<crate::limits::Permits>,
    answers: Map<String, Value>,
    caps: crate::session::ClientCaps,
    out: &mut Vec<u8>,
) -> Result<(), RpcError> {
    let token = CancellationToken::new();
    let task = server
        .tasks
        .create(
            super::tasks::owner(req),
            &super::tasks::quota(req),
            token.clone(),
            Duration::MAX,
        )
        .await?;
    // The caller's token goes with the call as it would without a task (identity to an
    // upstream or API, `{{caller.CLAIM}}`), and so does the caller for step policies.
    let run = Detached {
        server: server.clone(),
        id: task.id.clone(),
        token,
        deadline: Instant::now() + task.ttl,
        credential: credential(req).cloned(),
        caller: govern::kept_caller(&call.snap, call.index, req),
        caps,
        places: concurrency_only(&call.snap.tools[call.index].def.governance.limits),
        holder: Holder::of(govern::who(&req.ctx)),
        call,
    };
    let running = server.tasks.running();
    let stopped = run.token.clone();
    let s = server.clone();
    server.running.spawn(async move {
        let _running = running;
        run.run(answers, permits).await;
        if stopped.is_cancelled() {
            s.tasks.stopped();
        }
    });
    protocol::write_result(
        out,
        req.id,
        &serde_json::to_vec(&task.created()).unwrap_or_default(),
    );
    Ok(())
}

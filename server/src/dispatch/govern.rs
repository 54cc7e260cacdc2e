//! Where dispatch meets the limits, the policies and the audit trail: admitting a tool call
//! under the limits that apply to it, a resource read or a prompt get under its policies,
//! and recording how an audited request ended.

use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::error::{Limiter, RpcError};
use super::request::Request;
use super::server::{Ctx, Server};
use super::{PROMPTS_GET, RESOURCES_READ, TOOLS_CALL};
use crate::audit::{Actor, Record, Text};
use crate::config::CompiledHandler;
use crate::limits::{Permits, Who};
use crate::metrics::{OUTCOMES, outcome_index};
use crate::registry::Snapshot;
use crate::spec::access::Principal;

/// Who a call is counted against: the authenticated subject; for a caller without
/// credentials its network address (whatever sessions it opens), or where no address is
/// known (stdio) its session, or else every such caller together.
pub(super) fn who<'a>(ctx: &Ctx<'a>) -> Who<'a> {
    match ctx.caller {
        Some(p) if !p.subject.is_empty() => Who::Subject(&p.subject),
        _ => match ctx.client {
            Some(a) => Who::Address(a),
            None if !ctx.session.is_empty() => Who::Session(ctx.session),
            None => Who::Anonymous,
        },
    }
}

/// Admits a call of `snap.tools[index]` under its limits: `Ok(None)` when it has none (one
/// branch), the in-flight places it holds, or the refusal as a JSON-RPC error (`-32004`,
/// HTTP 429 with `Retry-After`).
pub(super) async fn admit(
    server: &Server,
    limits: &Arc<[Arc<crate::config::governance::Limit>]>,
    tool: &str,
    req: &Request<'_>,
) -> Result<Option<Permits>, RpcError> {
    if limits.is_empty() {
        return Ok(None);
    }
    // Tracing: a span of the decision when the request is sampled (one branch when not).
    let span = crate::otel::internal("quiver.limit");
    let admitted = server.limiter.admit(limits, who(&req.ctx)).await;
    if let Some(cx) = span {
        limit_span_end(&cx, limits.len(), admitted.as_ref().err());
    }
    match admitted {
        Ok(p) => Ok(Some(p)),
        Err(r) => {
            server.metrics.gov.limited(tool, r.limit.scope.label(), r.kind);
            Err(refused(tool, &r))
        }
    }
}

/// Refuses a `resources/read` or `prompts/get` (`target`) that a policy of its resource or
/// prompt does not allow, as a tool call is refused: `-32003` naming the policy, with the
/// resource's `uri` or the prompt's name and the policy in `data`. `policies` `None`: none
/// applies, and the request pays one branch.
pub(super) fn permitted(
    server: &Server,
    policies: Option<&[Arc<crate::config::policy::Policy>]>,
    req: &Request<'_>,
    target: crate::config::policy::Target<'_>,
    args: &Value,
) -> Result<(), RpcError> {
    use crate::config::policy::Target;
    let Some(list) = policies else {
        return Ok(());
    };
    let span = crate::otel::internal("quiver.policy");
    let checked = crate::config::policy::check_all(list, req.ctx.caller, target, Some(args));
    if let Some(cx) = span {
        policy_span_end(&cx, list.len(), checked.as_ref().err());
    }
    checked.map_err(|denied| {
        server.metrics.refused(crate::metrics::Refusal::Forbidden);
        let (kind, key, name) = match target {
            Target::Resource(uri) => ("resource", "uri", uri),
            Target::Prompt(name) => ("prompt", "prompt", name),
            Target::Tool(t) => ("tool", "tool", t.name),
        };
        RpcError::new(crate::protocol::FORBIDDEN, denied.request_message(kind, name))
            .with_data(json!({key: name, "policy": &*denied.policy}))
    })
}

/// Ends the span of a limit decision: `quiver.limit.outcome` (`admitted` or
/// `rate_limited`), how many limits applied and, for a refusal, which one and why.
fn limit_span_end(cx: &opentelemetry::Context, limits: usize, refusal: Option<&crate::limits::Refusal>) {
    use opentelemetry::KeyValue;
    use opentelemetry::trace::TraceContextExt;
    let span = cx.span();
    span.set_attribute(KeyValue::new(
        "quiver.limit.count",
        i64::try_from(limits).unwrap_or(i64::MAX),
    ));
    match refusal {
        None => span.set_attribute(KeyValue::new("quiver.limit.outcome", "admitted")),
        Some(r) => {
            span.set_attribute(KeyValue::new("quiver.limit.outcome", "rate_limited"));
            span.set_attribute(KeyValue::new("quiver.limit.kind", r.kind));
            span.set_attribute(KeyValue::new("quiver.limit.scope", r.limit.scope.label()));
            span.set_attribute(KeyValue::new("quiver.limit.name", r.limit.name.to_string()));
            let ms = i64::try_from(r.retry_after.as_millis()).unwrap_or(i64::MAX);
            span.set_attribute(KeyValue::new("quiver.limit.retry_after_ms", ms));
        }
    }
    crate::otel::finish(cx, None);
}

/// Ends the span of a policy decision: `quiver.policy.decision` (`allow` or `deny`), how
/// many policies applied and, for a denial, the policy (`quiver.policy.name`; for a tool's
/// inline one, the tool's name) and what it came to (`quiver.policy.result`: `false`,
/// `error`, `too_costly`).
pub(super) fn policy_span_end(
    cx: &opentelemetry::Context,
    policies: usize,
    denial: Option<&crate::config::policy::PolicyDenial>,
) {
    use crate::config::policy::Verdict;
    use opentelemetry::KeyValue;
    use opentelemetry::trace::TraceContextExt;
    let span = cx.span();
    span.set_attribute(KeyValue::new(
        "quiver.policy.count",
        i64::try_from(policies).unwrap_or(i64::MAX),
    ));
    match denial {
        None => span.set_attribute(KeyValue::new("quiver.policy.decision", "allow")),
        Some(d) => {
            span.set_attribute(KeyValue::new("quiver.policy.decision", "deny"));
            span.set_attribute(KeyValue::new("quiver.policy.name", d.policy.to_string()));
            span.set_attribute(KeyValue::new("quiver.policy.inline", d.inline));
            let result = match d.verdict {
                Verdict::Error => "error",
                Verdict::TooCostly => "too_costly",
                _ => "false",
            };
            span.set_attribute(KeyValue::new("quiver.policy.result", result));
        }
    }
    crate::otel::finish(cx, None);
}

/// The error of a refused call: what refused it and when to retry (`retryAfterMs`, and
/// `retryAfter` in whole seconds as HTTP's `Retry-After` has it).
fn refused(tool: &str, r: &crate::limits::Refusal) -> RpcError {
    let ms = u64::try_from(r.retry_after.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let place = match r.limit.scope {
        crate::config::governance::Scope::Server => "the server's".to_owned(),
        crate::config::governance::Scope::Upstream => format!("upstream {}'s", r.limit.name),
        crate::config::governance::Scope::Tool => format!("tool {}'s", r.limit.name),
    };
    let what = match r.kind {
        "concurrency" => "concurrency limit (calls in flight)",
        "unavailable" => "shared rate limit (its store is unavailable)",
        _ => "rate limit",
    };
    let message = format!("Rate limited: {place} {what} refused this call of {tool}; retry after {ms} ms");
    let by = Limiter::Limit {
        limit: r.limit.clone(),
        kind: r.kind,
    };
    RpcError::rate_limited(message, ms, by)
}

/// How long a call refused for a full audit queue is told to wait: the writer drains the
/// queue every 10 ms, but a refusal also means a sink that does not take records.
const AUDIT_RETRY_SECS: u64 = 1;

/// The error of a call refused because its audit record could not be queued
/// (`--audit-on-full refuse`): `-32004` (HTTP 429 with `Retry-After`), `data.audit:
/// "queue_full"`.
pub(super) fn audit_full() -> RpcError {
    let ms = AUDIT_RETRY_SECS * 1000;
    RpcError::rate_limited(
        format!(
            "Audit trail full: this server records every call before running it, and its audit queue has no room; retry after {ms} ms"
        ),
        ms,
        Limiter::AuditQueue,
    )
}

/// What a `tools/call` learned for its audit record while it ran.
#[derive(Debug, Default)]
pub(super) struct Trail {
    /// The tool: as the client named it, until it resolves to one of the registry's.
    pub tool: Option<Text>,
    /// Whether `tool` is the name of the tool the call resolved to.
    pub resolved: bool,
    /// The upstream it resolved to.
    pub upstream: Option<Text>,
    /// The upstream account it acted as (a user's own sign-in), when known.
    pub upstream_account: Option<Text>,
    /// `ok`, `tool_error` or `invalid_arguments` for a call that got a result.
    pub outcome: Option<&'static str>,
    /// The arguments, when the tool opts in (sensitive properties already replaced).
    pub arguments: Option<Value>,
    /// What the result guard found, when it found anything.
    pub guard: Option<crate::config::guards::Verdict>,
    /// The result's tokens, when its tool meters them.
    pub tokens: Option<u64>,
}

impl Trail {
    /// Notes the tool a call asked for (its `name`, not yet resolved).
    pub fn asked(&mut self, name: &str) {
        self.tool = Some(Text::new(name));
    }

    /// Notes the tool a call resolved to and, if it opts in, its arguments.
    pub fn resolve(&mut self, snap: &Snapshot, index: usize, args: &Value) {
        let t = &snap.tools[index].def;
        self.tool = Some(Text::new(&t.name));
        self.resolved = true;
        if let CompiledHandler::Upstream(u) = &t.handler {
            self.upstream = snap.config.upstreams.get(u.upstream).map(|u| Text::new(&u.name));
        }
        if let Some(sensitive) = &t.governance.audit_arguments {
            self.arguments = Some(crate::audit::redact_arguments(args, sensitive));
        }
    }
}

/// An audited request on its way: what its record needs from the start, until it ends. One
/// dropped before it ended (the client went away and its request future with it) records
/// itself as `disconnected`: every audited request leaves exactly one record.
#[derive(Debug)]
pub(super) struct Pending {
    log: Arc<crate::audit::AuditLog>,
    /// The record's place in the queue, taken before the request ran (`--audit-on-full
    /// refuse`); `None` otherwise.
    place: Option<crate::audit::Place>,
    /// The record so far; taken when it is written.
    record: Option<Box<Record>>,
    start: Instant,
    /// What the tool call learned.
    pub trail: Trail,
}

impl Pending {
    /// Notes the tool a `tools/call` refused before it ran asked for: such a call never
    /// reads its parameters, so they are read here, on that refusal's path only.
    pub(super) fn asked_before_refusal(&mut self, params: Option<&RawValue>) {
        if self.trail.tool.is_some() {
            return;
        }
        let name = params
            .and_then(|p| serde_json::from_str::<Target<'_>>(p.get()).ok())
            .and_then(|t| t.name);
        if let Some(name) = name {
            self.trail.asked(&name);
        }
    }

    /// Writes the record, ending with `outcome` (and `reason`).
    fn finish(&mut self, outcome: &'static str, reason: Option<String>, bytes_out: usize) {
        let Some(mut r) = self.record.take() else { return };
        let t = std::mem::take(&mut self.trail);
        // The one clock read of the record: its end, and so its duration.
        r.end = Instant::now();
        if t.tool.is_some() {
            r.target_resolved = t.resolved;
            r.target = t.tool;
        }
        r.upstream = t.upstream;
        r.upstream_account = t.upstream_account;
        r.arguments = t.arguments;
        r.guard = t.guard;
        r.result_tokens = t.tokens;
        r.outcome = outcome;
        r.reason = reason;
        r.duration = r.end.saturating_duration_since(self.start);
        r.bytes_out = bytes_out;
        match self.place.take() {
            Some(place) => self.log.record_in(place, *r),
            None => self.log.record(*r),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.finish("disconnected", None, 0);
    }
}

#[derive(Deserialize)]
struct Target<'a> {
    #[serde(borrow, default)]
    uri: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
}

impl Server {
    /// The start of an audit record for a request of the method at `metric`, if the trail
    /// is on and records it.
    ///
    /// # Errors
    /// With `--audit-on-full refuse`, the queue has no place for the record: the request
    /// must not run ([`audit_full`]).
    pub(super) fn audit_start(
        &self,
        metric: usize,
        req: &Request<'_>,
        bytes_in: usize,
    ) -> Result<Option<Pending>, RpcError> {
        let Some(log) = self.audit.as_ref() else {
            return Ok(None);
        };
        let event = match metric {
            TOOLS_CALL => "tools/call",
            RESOURCES_READ => "resources/read",
            PROMPTS_GET => "prompts/get",
            _ => return Ok(None),
        };
        let place = log.place().map_err(|_| audit_full())?;
        // What was asked for, as the client named it. A tool call notes its tool itself
        // (`Trail`), from the parameters it reads anyway: they are not read twice.
        let target = match metric {
            TOOLS_CALL => None,
            _ => req.params.and_then(|p| {
                let t: Target<'_> = serde_json::from_str(p.get()).ok()?;
                t.uri.or(t.name).map(|s| Text::new(&s))
            }),
        };
        let mut r = Record::new(event, "ok");
        r.request_id = Some(req.id.get().into());
        r.session = req.ctx.session.into();
        r.caller = Actor::of(req.ctx.caller);
        r.target = target;
        r.bytes_in = bytes_in;
        // The request's span is current here when tracing sampled it.
        r.trace = crate::otel::logs::current_ids().map(Box::new);
        Ok(Some(Pending {
            log: log.clone(),
            place,
            record: Some(Box::new(r)),
            start: req.start,
            trail: Trail::default(),
        }))
    }

    /// Ends an audited request: `error` is its JSON-RPC error, if it ended with one (`None`
    /// for a result or a cancelled call, `cancelled`); `bytes_out` the answer's size.
    pub(super) fn audit_end(
        &self,
        mut p: Pending,
        error: Option<&RpcError>,
        cancelled: bool,
        bytes_out: usize,
    ) {
        let (outcome, reason) = match (error, cancelled) {
            (_, true) => ("cancelled", None),
            (Some(e), _) => (OUTCOMES[outcome_index(e.code)], Some(e.message.clone())),
            (None, _) => (p.trail.outcome.unwrap_or("ok"), None),
        };
        p.finish(outcome, reason, bytes_out);
    }

    /// Records a refused credential (HTTP 401) with the refusal's reason. It names no
    /// session: whatever `Mcp-Session-Id` an unauthenticated request sent is the client's
    /// claim, not a session it was shown to hold.
    pub fn audit_unauthenticated(&self, reason: &str) {
        let Some(log) = &self.audit else { return };
        let mut r = Record::new("authentication", "unauthenticated");
        r.reason = Some(reason.to_owned());
        log.record(r);
    }

    /// Records any other audited event, e.g. a denial decided outside dispatch: `outcome`
    /// names how it ended (`forbidden`, `rate_limited`, ...) and `reason` why.
    pub fn audit_event(
        &self,
        event: &'static str,
        ctx: &Ctx<'_>,
        id: Option<&RawValue>,
        outcome: &'static str,
        reason: Option<String>,
    ) {
        let Some(log) = &self.audit else { return };
        let mut r = Record::new(event, outcome);
        r.request_id = id.map(|i| i.get().into());
        r.session = ctx.session.into();
        r.caller = Actor::of(ctx.caller);
        r.reason = reason;
        log.record(r);
    }
}

/// The caller, kept for the deferred run of a pipeline some of whose steps have policies
/// (to check each step's call), of a tool guardrail webhooks are asked about, and of a
/// pipeline when some webhook exists (its steps' webhooks are told who calls); `None` for
/// any other tool, which needs no caller.
pub(super) fn kept_caller(snap: &Snapshot, index: usize, req: &Request<'_>) -> Option<Box<Principal>> {
    let t = &snap.tools[index];
    let steps_policed = t.policies.as_ref().is_some_and(|p| !p.steps.is_empty());
    let hooked = t.hooks.is_some()
        || (matches!(t.def.handler, crate::config::CompiledHandler::Pipeline(_))
            && !snap.config.webhooks.hooks.is_empty());
    let metered = t
        .def
        .governance
        .result_guard
        .as_ref()
        .is_some_and(|g| g.tokens.is_some_and(|b| b.meter));
    (steps_policed || hooked || metered)
        .then(|| req.ctx.caller.cloned().map(Box::new))
        .flatten()
}

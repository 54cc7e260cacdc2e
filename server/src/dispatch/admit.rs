//! The admission chain of a `tools/call`: the guards a call passes, in this order, before
//! its tool runs. Each lets the call on or refuses it:
//!
//! 1. access: the tool's `access` against the caller's credentials (`-32003`), before the
//!    arguments are looked at, so that a caller who may not call a tool learns nothing of it;
//! 2. policy: the tool's CEL policies over the caller and the arguments (`-32003`);
//! 3. task: what the call asks of 2025-11-25 tasks, against the tool's `task` setting;
//! 4. limits: the tool's rate and concurrency limits (`-32004`, HTTP 429 with
//!    `Retry-After`); the in-flight places are held until the call ends;
//! 5. schema: the arguments against the tool's input schema; a call that fails it is
//!    answered with a tool error naming the problems (it has passed the limits, so it
//!    counts against them).
//!
//! The audit trail records how the chain and the call ended (`govern.rs`). A tool without
//! access rules, policies, a task setting or limits costs one branch per guard.

use std::time::{Duration, Instant};

use serde_json::Value;
use serde_json::value::RawValue;

use super::error::RpcError;
use super::request::Request;
use super::server::Server;
use crate::metrics::Refusal;
use crate::registry::Tool;

/// What a call that passed the guards holds while it runs.
pub(super) struct Admitted {
    /// A 2025-11-25 task was asked for: it is kept this long.
    pub(super) task: Option<Duration>,
    /// The in-flight places of the tool's concurrency limits.
    pub(super) permits: Option<crate::limits::Permits>,
    /// When the call was admitted (the tool's histogram measures from here).
    pub(super) start: Instant,
}

/// How the chain ended for a call it did not refuse.
pub(super) enum Admission {
    /// Run the tool.
    Run(Admitted),
    /// The arguments do not fit the input schema: these problems, answered as a tool error.
    InvalidArguments(Admitted, Vec<String>),
}

/// Passes a call of `tool` with `args` through the chain; `task` is its 2025-11-25
/// `params.task`.
pub(super) async fn admit(
    server: &Server,
    req: &Request<'_>,
    tool: &Tool,
    args: &Value,
    task: Option<&RawValue>,
) -> Result<Admission, RpcError> {
    access(server, tool, req)?;
    super::visible::permitted(server, tool, req, args)?;
    let task = super::tasks::core_wire::asked(server, tool, req, task)?;
    let permits = super::govern::admit(server, &tool.def.governance.limits, &tool.def.name, req).await?;
    let admitted = Admitted {
        task,
        permits,
        start: Instant::now(),
    };
    let mut problems = Vec::new();
    tool.def.input.validate(args, &mut problems);
    Ok(if problems.is_empty() {
        Admission::Run(admitted)
    } else {
        Admission::InvalidArguments(admitted, problems)
    })
}

/// Refuses a call the caller's credentials do not allow (the tool's `access`).
fn access(server: &Server, tool: &Tool, req: &Request<'_>) -> Result<(), RpcError> {
    let Some(need) = &tool.def.access else {
        return Ok(());
    };
    need.check(req.ctx.caller).map_err(|denied| {
        server.metrics.refused(Refusal::Forbidden);
        RpcError::forbidden(denied.message(&tool.def.name), &tool.def.name, denied)
    })
}

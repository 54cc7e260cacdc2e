//! The methods both wires have, `tasks/get` and `tasks/cancel`, one function each: the wire
//! a request is read in ([`Wire`]) decides how the answer and its errors read, and what a
//! cancel of an ended task is, not which handler runs.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Value, json};

use super::task::TaskView;
use super::{TaskParams, Waiting, core_wire, extension, owner, paced};
use crate::dispatch::envelope::parse_params;
use crate::dispatch::error::RpcError;
use crate::dispatch::request::{Done, Request};
use crate::dispatch::server::Server;

/// The wire a `tasks/*` request is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// The `io.modelcontextprotocol/tasks` extension.
    Extension,
    /// The core tasks of protocol 2025-11-25 (when [`core_wire::in_force`]).
    Core,
}

impl Wire {
    fn of(s: &Server, req: &Request<'_>) -> Self {
        if core_wire::in_force(s, req) {
            Wire::Core
        } else {
            Wire::Extension
        }
    }

    /// The request's `taskId`; in the extension, only from a client that declared it.
    fn task_id<'a>(self, s: &Server, req: &Request<'a>, method: &str) -> Result<Cow<'a, str>, RpcError> {
        if self == Wire::Extension && !extension::negotiated(s, req) {
            return Err(extension::missing_extension(method));
        }
        Ok(parse_params::<TaskParams<'a>>(req.params)?.task_id)
    }

    /// The error for a task id the caller has no task of.
    fn unknown(self) -> RpcError {
        match self {
            Wire::Extension => extension::unknown(),
            Wire::Core => core_wire::not_found(),
        }
    }

    /// The task as `tasks/get` shows it: with its result, error or questions in the
    /// extension; flat in 2025-11-25 (`tasks/result` has the result there).
    fn task(self, t: &TaskView) -> Value {
        match self {
            Wire::Extension => t.detailed(),
            Wire::Core => t.core(),
        }
    }

    /// Writes the result `v`.
    fn write(self, req: &Request<'_>, v: Value, out: &mut Vec<u8>) -> Done {
        match self {
            Wire::Extension => extension::write(req, v, out),
            Wire::Core => {
                core_wire::write(req, &v, out);
                Done::Written
            }
        }
    }
}

/// `tasks/get`: the caller's task.
pub(in crate::dispatch) fn get<'a>(
    s: &'a Arc<Server>,
    req: &'a Request<'a>,
    out: &'a mut Vec<u8>,
) -> Waiting<'a> {
    Box::pin(async move {
        paced(s, req)?;
        let wire = Wire::of(s, req);
        let id = wire.task_id(s, req, "tasks/get")?;
        let t = s
            .tasks
            .get(owner(req), &id)
            .await?
            .ok_or_else(|| wire.unknown())?;
        Ok(wire.write(req, wire.task(&t), out))
    })
}

/// `tasks/cancel`: in the extension an empty acknowledgement (the next `tasks/get` shows
/// `cancelled`; an ended task stays as it is); in 2025-11-25 the cancelled task, and
/// `-32602` for one that has ended.
pub(in crate::dispatch) fn cancel<'a>(
    s: &'a Arc<Server>,
    req: &'a Request<'a>,
    out: &'a mut Vec<u8>,
) -> Waiting<'a> {
    Box::pin(async move {
        paced(s, req)?;
        let wire = Wire::of(s, req);
        let id = wire.task_id(s, req, "tasks/cancel")?;
        let answer = match wire {
            Wire::Extension => {
                if !s.tasks.cancel(owner(req), &id).await? {
                    return Err(wire.unknown());
                }
                json!({})
            }
            Wire::Core => core_wire::cancelled(s, owner(req), &id).await?.core(),
        };
        Ok(wire.write(req, answer, out))
    })
}

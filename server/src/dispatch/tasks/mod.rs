//! Tasks: a `tools/call` answered at once with a task that the client polls, while the call
//! runs on, detached from its request.
//!
//! Two wires serve the same tasks, owned the same way ([`owner`]): the
//! `io.modelcontextprotocol/tasks` extension ([`extension`], in any revision, for a client
//! that declares it) and the core tasks of protocol 2025-11-25 ([`core_wire`]); the methods
//! both have (`tasks/get`, `tasks/cancel`) are in [`wire`]. What a task is, in [`task`]. A
//! server's tasks live in one store, [`store::Tasks`]: in this process's memory ([`memory`])
//! or in Redis shared by every replica ([`shared`]). [`polls`] paces how often one caller
//! asks about its tasks; [`metrics`] counts them.
//!
//! The method table routes each `tasks/*` method to the function here that answers it:
//! [`get`], [`cancel`], [`update`], [`result`], [`list`].

use std::borrow::Cow;

use serde::Deserialize;

use self::task::Quota;
use super::error::RpcError;
use super::request::Request;
use super::server::Server;

pub(super) mod core_wire;
pub(super) mod extension;
mod memory;
pub(super) mod polls;
mod shared;
pub(super) mod store;
mod task;
mod wire;

pub(super) use self::core_wire::{list, result};
pub(super) use self::extension::update;
pub use self::shared::{ACL_COMMANDS as REDIS_ACL_COMMANDS, SharedOptions};
pub(super) use self::task::Status;
pub use self::task::TaskBounds;
pub(super) use self::wire::{cancel, get};

/// The future of a `tasks/*` method: it may wait (for a task's end, for a shared store).
use super::request::Waiting;

/// The params of a request about one task.
#[derive(Deserialize)]
struct TaskParams<'a> {
    #[serde(borrow, rename = "taskId")]
    task_id: Cow<'a, str>,
}

/// The caller a task belongs to (who may see and act on it): its authenticated subject, or
/// else its session. Empty for a caller with neither (2026-07-28 without credentials): its
/// task is reachable by its id alone, 128 random bits that only the creating request is shown.
pub(super) fn owner<'a>(req: &Request<'a>) -> &'a str {
    match req.ctx.caller {
        Some(p) if !p.subject.is_empty() => &p.subject,
        _ => req.ctx.session,
    }
}

/// Whose bounds the request's tasks (and its task requests' pace) count against: the
/// authenticated subject; a caller without credentials by its network address, whatever
/// sessions it opens (a session is free to mint, an address is not), or without a known
/// address (stdio) by its session.
pub(super) fn quota<'a>(req: &Request<'a>) -> Quota<'a> {
    match req.ctx.caller {
        Some(p) if !p.subject.is_empty() => Quota::caller(&p.subject),
        _ => Quota {
            key: match req.ctx.client {
                // `@` keeps addresses apart from sessions.
                Some(a) => Cow::Owned(format!("@{a}")),
                None => Cow::Borrowed(req.ctx.session),
            },
            anonymous: true,
        },
    }
}

/// Refuses a task request over the caller's budget (`-32004`, with when to retry). A caller
/// without credentials is paced by its address ([`quota`]); one with neither an address nor
/// a session (no transport tells it apart) is not paced here (the server's rate limits still
/// apply to it).
fn paced(s: &Server, req: &Request<'_>) -> Result<(), RpcError> {
    let who = quota(req).key;
    if who.is_empty() {
        return Ok(());
    }
    s.polls.take(&who).map_err(|wait| {
        let ms = polls::retry_ms(wait);
        RpcError::rate_limited(
            format!(
                "Rate limited: more than {} task requests a second from this caller; retry after {ms} ms (poll at the task's pollInterval)",
                polls::RATE
            ),
            ms,
            crate::dispatch::error::Limiter::TaskRequests,
        )
    })
}

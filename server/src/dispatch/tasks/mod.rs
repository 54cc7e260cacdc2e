//! Tasks: a `tools/call` answered at once with a task that the client polls, while the call
//! runs on, detached from its request.
//!
//! Two wires serve the same tasks, owned the same way ([`owner`]): the
//! `io.modelcontextprotocol/tasks` extension ([`extension`], in any revision, for a client
//! that declares it) and the core tasks of protocol 2025-11-25 ([`core_wire`]). A server's
//! tasks live in one store ([`store::Tasks`]): in this process's memory ([`memory`]) or in
//! Redis shared by every replica ([`shared`]). [`polls`] paces how often one caller asks
//! about its tasks; [`metrics`] counts them.

use std::borrow::Cow;

use self::task::Quota;
use super::request::Request;

pub(super) mod core_wire;
pub(super) mod extension;
mod memory;
pub mod metrics;
pub(super) mod polls;
mod shared;
pub(super) mod store;
mod task;

pub use self::shared::SharedOptions;
pub(super) use self::task::Status;
pub use self::task::TaskBounds;

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

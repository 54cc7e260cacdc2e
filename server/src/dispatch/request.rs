//! What a method handler is given ([`Request`]) and what it hands back ([`Done`]).

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use serde_json::value::RawValue;

use super::error::RpcError;
use super::listen::Listen;
use super::server::{Ctx, Server};
use crate::dispatch::stateless::Meta;
use crate::registry::Snapshot;
use crate::session::ClientCaps;

/// One request, read and checked, as its handler sees it.
#[derive(Clone, Copy)]
pub(super) struct Request<'a> {
    /// The request's id (a string or a number).
    pub id: &'a RawValue,
    /// Its params, raw.
    pub params: Option<&'a RawValue>,
    /// What the transport knows of it.
    pub ctx: Ctx<'a>,
    /// The checked `_meta` of a 2026-07-28 request; `None` in the handshake era.
    pub meta: Option<Meta<'a>>,
    /// The batch's deadline, or `None` to start the request timeout when a slow call starts.
    pub deadline: Option<Instant>,
    /// When the message arrived.
    pub start: Instant,
}

/// What a handler did, besides writing into the answer buffer.
pub(super) enum Done {
    /// The result is in the buffer.
    Written,
    /// The answer in the buffer is stamped as it must be (an `InputRequiredResult` of a
    /// method whose results are otherwise stamped for it): it is not stamped again.
    Stamped,
    /// A successful `initialize` (its result is in the buffer): the session to open.
    Initialized(ClientCaps),
    /// A `subscriptions/listen` to serve as a stream (nothing is written).
    Listen(Listen),
}

/// A method that answers at once: writes its result into the buffer.
pub(super) type Answer = fn(&Server, &Request<'_>, &mut Vec<u8>) -> Result<Done, RpcError>;

/// A method that may wait before it answers: its future writes the result into the buffer.
pub(super) type Later = for<'a> fn(
    &'a std::sync::Arc<Server>,
    &'a Request<'a>,
    &'a mut Vec<u8>,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Done, RpcError>> + Send + 'a>,
>;

/// The future of a [`Later`] method.
pub(super) type Waiting<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Done, RpcError>> + Send + 'a>>;

/// A `tools/call` admitted to run (`admit.rs`): the snapshot it runs against, its tool, its
/// validated arguments and when it was admitted.
pub(super) struct Called {
    pub(super) snap: Arc<Snapshot>,
    pub(super) index: usize,
    pub(super) args: Value,
    pub(super) start: Instant,
}

impl Called {
    pub(super) fn new(snap: Arc<Snapshot>, index: usize, args: Value, start: Instant) -> Self {
        Called {
            snap,
            index,
            args,
            start,
        }
    }
}

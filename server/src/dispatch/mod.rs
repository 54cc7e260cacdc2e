//! Message dispatch: JSON-RPC bytes in, an [`Outcome`] out. Shared by the HTTP and stdio
//! transports. The tools/call path parses the envelope with borrowed slices, loads the
//! registry snapshot without a lock, and writes the response straight into one buffer.
//!
//! One router serves both protocol eras: the method [`table`] names each method's handler,
//! the eras that have it and how its 2026-07-28 result is stamped; what else differs
//! between the eras is data in [`revision`]. Handlers live with their family ([`tools`],
//! [`resources`], [`prompts`], [`completion`], [`sessions`], [`tasks`]).

mod admit;
mod answer;
mod cancel;
mod completion;
mod envelope;
pub(crate) mod error;
mod find;
mod govern;
mod listen;
mod outcome;
mod prompts;
mod reply;
mod request;
mod resources;
mod revision;
mod rounds;
mod server;
mod sessions;
pub mod stateless;
mod table;
pub(crate) mod tasks;
mod tools;
mod traced;
mod visible;

use std::sync::Arc;
use std::time::Instant;

use serde_json::value::RawValue;

use self::answer::Answering;
use self::envelope::{Batch, Malformed, Message};
pub use self::error::{ErrorData, Forbidden, Limiter, RateLimited, RpcError};
pub use self::listen::{Listen, ListenFilter, ListenRegistration, MAX_LISTEN_URIS};
pub use self::outcome::Outcome;
pub use self::reply::Reply;
use self::request::{Done, Request};
use self::revision::{HANDSHAKE, Revision, STATELESS, Stamp};
use self::server::InflightGuard;
pub use self::server::{Ctx, Era, Event, EventKind, Limits, Opens, Server, ServerBuilder};
use self::table::{Handler, LABELS, Method, slot};
pub use self::tasks::{REDIS_ACL_COMMANDS as TASKS_REDIS_ACL_COMMANDS, SharedOptions, TaskBounds};
pub use self::tools::Deferred;
use crate::metrics::{Refusal, outcome_index};
use crate::protocol::{self, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};

// The metric slots (places in `LABELS`) dispatch names, here for every module of dispatch
// (the methods' own modules cannot reach into the table, which refers to them).
/// Messages that are not requests.
const NOTIFICATION: usize = slot("notification");
const RESPONSE: usize = slot("response");
const INVALID: usize = slot("invalid");
const BATCH: usize = slot("batch");
/// A request of a method the table does not have.
const OTHER: usize = slot("other");
/// Methods whose requests are recorded or answered apart from the rest.
const TOOLS_CALL: usize = slot("tools/call");
const TOOLS_LIST: usize = slot("tools/list");
const RESOURCES_READ: usize = slot("resources/read");
const PROMPTS_GET: usize = slot("prompts/get");

impl Server {
    /// Handles one transport message: a single JSON-RPC message, or a batch when `batches` is
    /// allowed (protocol 2025-03-26 only). A successful `initialize` opens its session here
    /// (see [`Ctx::opens`]).
    pub async fn handle(self: &Arc<Self>, body: &[u8], ctx: Ctx<'_>, batches: bool) -> Outcome {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'[') {
            return self.handle_one(body, ctx).await;
        }
        let o = self.batch(body, ctx, batches).await;
        self.open_session(o, ctx)
    }

    /// Handles one JSON-RPC message.
    pub async fn handle_one(self: &Arc<Self>, body: &[u8], ctx: Ctx<'_>) -> Outcome {
        let o = self.message(body, ctx, None).await;
        self.open_session(o, ctx)
    }

    /// Opens the session of a successful `initialize` the answer holds.
    fn open_session(&self, o: Outcome, ctx: Ctx<'_>) -> Outcome {
        let Outcome::Reply(mut reply) = o else {
            return o;
        };
        if let Some(caps) = reply.opened.take() {
            match ctx.opens {
                Opens::Given => self.sessions.open(ctx.session, caps),
                Opens::Minted => {
                    let id = crate::session::mint(ctx.caller.map_or("", |c| &c.subject));
                    self.sessions.open(&id, caps);
                    reply.session = Some(id);
                }
            }
        }
        Outcome::Reply(reply)
    }

    /// A batch: its messages one after another (a batch answer is one JSON array), under one
    /// deadline. Its answer carries the client of its last successful `initialize`.
    async fn batch(self: &Arc<Self>, body: &[u8], ctx: Ctx<'_>, batches: bool) -> Outcome {
        let start = Instant::now();
        let max = self.limits.max_batch;
        let items = match envelope::read_batch(body, max) {
            Batch::Items(v) => v,
            Batch::TooLong => {
                self.metrics.refused(Refusal::Batch);
                let msg = format!("Invalid request: a batch may hold at most {max} messages");
                return self.rejected(start, BATCH, INVALID_REQUEST, &msg);
            }
            Batch::Unreadable(e) => {
                return self.rejected(start, BATCH, PARSE_ERROR, &format!("Parse error: {e}"));
            }
        };
        if !batches {
            let msg = format!(
                "JSON-RPC batches are not supported in protocol version {}",
                ctx.version
            );
            return self.rejected(start, BATCH, INVALID_REQUEST, &msg);
        }
        if items.is_empty() {
            return self.rejected(start, BATCH, INVALID_REQUEST, "empty batch");
        }
        let deadline = start + self.limits.request_timeout;
        let mut out = Vec::from(&b"["[..]);
        let mut any = false;
        let mut opened = None;
        // Calls in a batch run here, one after another: a batch answer is one JSON array.
        let ctx = Ctx { stream: false, ..ctx };
        for item in items {
            // Without streaming nothing is deferred; a listen in a batch has no stream to serve.
            let Outcome::Reply(r) = Box::pin(self.message(item.get().as_bytes(), ctx, Some(deadline))).await
            else {
                continue;
            };
            opened = r.opened.or(opened);
            if any {
                out.push(b',');
            }
            out.extend_from_slice(&r.body);
            any = true;
            if out.len() > self.limits.max_response_bytes {
                self.metrics.refused(Refusal::ResponseBytes);
                let msg = format!(
                    "the batch's responses exceed {} bytes; send fewer messages per batch",
                    self.limits.max_response_bytes
                );
                let mut reply = Reply::new(protocol::error_response(None, INTERNAL_ERROR, &msg), 200);
                reply.opened = opened;
                return Outcome::Reply(reply);
            }
        }
        if !any {
            // Only notifications and answers.
            return Outcome::Accepted;
        }
        out.push(b']');
        let mut reply = Reply::new(out, 200);
        reply.opened = opened;
        Outcome::Reply(reply)
    }

    /// A message refused before dispatch, answered without an id (HTTP 400).
    fn rejected(&self, start: Instant, metric: usize, code: i32, msg: &str) -> Outcome {
        self.by_method
            .record(metric, outcome_index(code), start.elapsed());
        Outcome::Reply(Reply::new(protocol::error_response(None, code, msg), 400))
    }

    /// An invalid message answered with an error; with the message's id when it could be
    /// read (then the client can match the error to its request: HTTP 200), else 400.
    fn malformed(&self, start: Instant, m: Malformed<'_>) -> Outcome {
        self.by_method
            .record(INVALID, outcome_index(m.error.code), start.elapsed());
        let mut body = Vec::with_capacity(96 + m.error.message.len());
        m.error.write(&mut body, m.id);
        Outcome::Reply(Reply::new(body, if m.id.is_none() { 400 } else { 200 }))
    }

    /// One message; `deadline` is the batch's, or `None` to start the request timeout when a
    /// slow call starts (a single message needs no clock reading on the fast path).
    async fn message(self: &Arc<Self>, body: &[u8], ctx: Ctx<'_>, deadline: Option<Instant>) -> Outcome {
        let start = Instant::now();
        let (id, method, params) = match envelope::read(body) {
            Err(m) => return self.malformed(start, m),
            Ok(Message::Answer { id, result, error }) => {
                // The answer to a request this server sent (sampling, elicitation). Answers
                // match only requests of the same session; anything else is dropped.
                self.pending.answer(ctx.session, id, result, error);
                self.by_method.record(RESPONSE, 0, start.elapsed());
                return Outcome::Accepted;
            }
            Ok(Message::Notification { method, params }) => {
                sessions::notification(self, &method, params, ctx);
                self.by_method.record(NOTIFICATION, 0, start.elapsed());
                return Outcome::Accepted;
            }
            Ok(Message::Request { id, method, params }) => (id, method, params),
        };
        // Tracing off: this one branch is all the hot path pays for it.
        if crate::otel::enabled() {
            return self
                .traced(id, &method, params, ctx, deadline, start, body.len())
                .await;
        }
        self.request(id, &method, params, ctx, deadline, start, body.len())
            .await
    }

    /// One request, read (`bytes` long): dispatched by its method.
    #[allow(clippy::too_many_arguments)] // the parts of the message `message` read
    async fn request(
        self: &Arc<Self>,
        id: &RawValue,
        method: &str,
        params: Option<&RawValue>,
        ctx: Ctx<'_>,
        deadline: Option<Instant>,
        start: Instant,
        bytes: usize,
    ) -> Outcome {
        let (stateless, rev) = revision_of(ctx.era, method, params);
        let entry = table::lookup(method);
        let metric = entry.map_or(OTHER, |e| e.metric);
        // Decremented on drop: a request future dropped mid-call (client gone) still counts down.
        let inflight = InflightGuard::enter(&self.metrics.inflight);
        let mut out = Vec::with_capacity(256);
        let meta = match stateless {
            None => Ok(None),
            Some(header) => crate::dispatch::stateless::meta(params, header).map(Some),
        };
        let req = Request {
            id,
            params,
            ctx,
            meta: meta.as_ref().ok().copied().flatten(),
            deadline,
            start,
        };
        // Set for a request the audit trail records; before the `_meta` check, so that a
        // 2026-07-28 call refused for its `_meta` is recorded too. With `--audit-on-full
        // refuse`, a request whose record has no place is refused here, before it runs.
        let (mut pending, full) = match self.audit_start(metric, &req, bytes) {
            Ok(p) => (p, None),
            Err(e) => (None, Some(e)),
        };
        let done = match full.map_or(meta, Err) {
            Err(e) => {
                if let Some(p) = pending.as_mut().filter(|_| metric == TOOLS_CALL) {
                    p.asked_before_refusal(params);
                }
                Err(e)
            }
            Ok(meta) => match entry.filter(|e| e.eras.has(rev.stateless)) {
                None => Err(not_found(method, entry, meta)),
                Some(Method {
                    handler: Handler::Now(answer),
                    ..
                }) => answer(self, &req, &mut out),
                Some(Method {
                    handler: Handler::Later(answer),
                    ..
                }) => answer(self, &req, &mut out).await,
                Some(Method {
                    handler: Handler::ToolCall,
                    ..
                }) => match tools::call(self, &req, &mut out, pending.as_mut().map(|p| &mut p.trail)).await {
                    Ok(Some(mut d)) => {
                        if let Some(p) = pending.take() {
                            d.audited(p);
                        }
                        return Outcome::Deferred(d);
                    }
                    Ok(None) => Ok(Done::Written),
                    Err(e) => Err(e),
                },
            },
        };
        drop(inflight);
        // An answer the handler stamped itself is not stamped again.
        let stamp = match done {
            Ok(Done::Stamped) => Stamp::Own,
            _ => entry.map_or(Stamp::Own, |e| e.stamp),
        };
        let (result, opened) = match done {
            Ok(Done::Listen(l)) => {
                self.by_method.record(metric, 0, start.elapsed());
                return Outcome::Listen(l);
            }
            Ok(Done::Initialized(caps)) => (Ok(()), Some(caps)),
            Ok(Done::Written | Done::Stamped) => (Ok(()), None),
            Err(e) => {
                crate::otel::rpc_error(e.code);
                (Err(e), None)
            }
        };
        let a = Answering {
            rev,
            metric,
            stamp,
            id,
            start,
        };
        let error = pending.as_ref().and_then(|_| result.as_ref().err().cloned());
        let mut reply = self.reply(&a, result, out);
        if let Some(p) = pending {
            self.audit_end(p, error.as_ref(), false, reply.body.len());
        }
        reply.opened = opened;
        Outcome::Reply(reply)
    }
}

/// The revision a request is read in: `Some(header)` for the stateless one (whose `_meta`
/// must repeat the header; `Some(None)` over stdio), and its data.
fn revision_of<'a>(
    era: Era<'a>,
    method: &str,
    params: Option<&serde_json::value::RawValue>,
) -> (Option<Option<&'a str>>, &'static Revision) {
    let stateless = match era {
        Era::Handshake => None,
        Era::Stateless(h) => Some(Some(h)),
        Era::Detect => {
            (method != "initialize" && crate::dispatch::stateless::names_version(params)).then_some(None)
        }
    };
    let rev: &'static Revision = if stateless.is_some() {
        &STATELESS
    } else {
        &HANDSHAKE
    };
    (stateless, rev)
}

/// `Method not found`, naming the revision that removed a handshake-era method.
fn not_found(
    method: &str,
    entry: Option<&Method>,
    meta: Option<crate::dispatch::stateless::Meta<'_>>,
) -> RpcError {
    match (entry, meta) {
        (Some(_), Some(meta)) => RpcError::new(
            METHOD_NOT_FOUND,
            format!(
                "Method not found: {method} is not part of protocol {}",
                meta.version
            ),
        ),
        _ => RpcError::new(METHOD_NOT_FOUND, format!("Method not found: {method}")),
    }
}

#[cfg(test)]
mod anonymous_tests;
#[cfg(test)]
mod audit_tests;
#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod composite_tests;
#[cfg(test)]
mod govern_tests;
#[cfg(test)]
mod guard_tests;
#[cfg(test)]
mod tests;

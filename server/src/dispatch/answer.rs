//! Ends a request: stamps its result for its era, bounds the answer's size, writes an error
//! as its era reports it, and records the message's metrics.

use std::time::Instant;

use serde_json::value::RawValue;

use super::error::RpcError;
use super::reply::Reply;
use super::revision::{Revision, Stamp};
use super::server::Server;
use crate::metrics::{Refusal, outcome_index};
use crate::protocol::INTERNAL_ERROR;

/// How a request is answered: in which era, counted as which method, stamped how.
#[derive(Clone, Copy)]
pub(super) struct Answering<'a> {
    pub rev: &'static Revision,
    /// The method's slot in [`super::LABELS`].
    pub metric: usize,
    pub stamp: Stamp,
    pub id: &'a RawValue,
    pub start: Instant,
}

impl Server {
    /// The answer to a request whose handler wrote its result into `out` (`Ok`) or failed.
    pub(super) fn reply(&self, a: &Answering<'_>, result: Result<(), RpcError>, mut out: Vec<u8>) -> Reply {
        let result = result.and_then(|()| {
            if a.rev.stateless && a.stamp != Stamp::Own {
                let snap = self.registry.load();
                if a.stamp == Stamp::Cached {
                    let mut f = snap.result_stamp.to_vec();
                    f.extend_from_slice(&crate::dispatch::stateless::cache_fields(
                        self.limits.cache_ttl_ms,
                    ));
                    // A tool list rendered for its caller is no one else's to reuse, nor is a
                    // read (policies may decide it per caller; an upstream's changes).
                    if (snap.tool_entries.is_some() && a.metric == super::TOOLS_LIST)
                        || a.metric == super::RESOURCES_READ
                    {
                        crate::dispatch::stateless::make_private(&mut f);
                    }
                    crate::dispatch::stateless::stamp(&mut out, &f);
                } else {
                    crate::dispatch::stateless::stamp(&mut out, &snap.result_stamp);
                }
            }
            if out.len() > self.limits.max_response_bytes {
                self.metrics.refused(Refusal::ResponseBytes);
                return Err(RpcError::new(
                    INTERNAL_ERROR,
                    format!(
                        "the response ({} bytes) exceeds the server's limit of {} bytes",
                        out.len(),
                        self.limits.max_response_bytes
                    ),
                ));
            }
            Ok(())
        });
        match result {
            Ok(()) => {
                self.by_method.record(a.metric, 0, a.start.elapsed());
                Reply::new(out, 200)
            }
            Err(e) => {
                let e = a.rev.refine(e);
                out.clear();
                out.shrink_to(256);
                let code = e.code;
                let r = Reply::failed(e, Some(a.id), a.rev.status(code), out);
                self.by_method
                    .record(a.metric, outcome_index(code), a.start.elapsed());
                r
            }
        }
    }
}

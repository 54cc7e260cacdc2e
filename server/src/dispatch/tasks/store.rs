//! The one interface to a server's tasks ([`Tasks`]), whichever store keeps them: this
//! process's memory ([`MemoryTasks`]: one replica, a task ends with its process) or Redis
//! shared by every replica ([`SharedTasks`]). The store's failures come out as JSON-RPC
//! errors, counted; the work of the tasks this replica runs is tracked, so that a stopping
//! server can let it finish.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::memory::MemoryTasks;
use super::shared::{NotCreated, SharedOptions, SharedTasks, Unavailable};
use super::task::{Quota, Refused, Status, TaskBounds, TaskView, UpdateError};
use crate::dispatch::error::RpcError;
use crate::metrics::tasks::{Running, TaskMetrics};
use crate::protocol;

/// The message of a task whose replica stopped before the task finished.
fn stopped_message(drain: Duration) -> String {
    format!(
        "the server running this task stopped before the task finished (a stopping server lets its tasks run for {}s); start it again",
        drain.as_secs()
    )
}

/// The store itself.
#[derive(Debug)]
enum Store {
    Memory(MemoryTasks),
    Shared(SharedTasks),
}

/// A server's tasks.
///
/// `owner` is who may see and act on a task: its caller's authenticated subject, or else its
/// session; empty for a caller with neither, whose task is reachable by its id alone (128
/// random bits, shown to nobody else). An unknown, expired and foreign id answer alike.
#[derive(Debug)]
pub(in crate::dispatch) struct Tasks {
    store: Store,
    metrics: Arc<TaskMetrics>,
}

impl Tasks {
    /// Tasks in this process's memory.
    pub(in crate::dispatch) fn memory(bounds: TaskBounds, metrics: Arc<TaskMetrics>) -> Self {
        Tasks {
            store: Store::Memory(MemoryTasks::new(bounds)),
            metrics,
        }
    }

    /// Tasks in the Redis of `opts`, shared with every replica that names it.
    pub(in crate::dispatch) fn shared(
        opts: SharedOptions,
        bounds: TaskBounds,
        metrics: Arc<TaskMetrics>,
    ) -> Self {
        Tasks {
            store: Store::Shared(SharedTasks::new(opts, bounds)),
            metrics,
        }
    }

    /// The store's failure `e` in `op`, counted, as a JSON-RPC error.
    fn unavailable(&self, op: &'static str, e: &Unavailable) -> RpcError {
        self.metrics.store_failed(op);
        RpcError::new(protocol::INTERNAL_ERROR, e.to_string())
    }

    /// Creates a working task of `owner` within the bounds of `quota`, cancelled through
    /// `token`, kept for `ttl` (at most the store's TTL; `Duration::MAX` for that).
    pub(in crate::dispatch) async fn create(
        &self,
        owner: &str,
        quota: &Quota<'_>,
        token: CancellationToken,
        ttl: Duration,
    ) -> Result<TaskView, RpcError> {
        let refused = |e: Refused| RpcError::new(protocol::RATE_LIMITED, e.to_string());
        let t = match &self.store {
            Store::Memory(m) => m.create_for(owner, quota, token, ttl).map_err(refused)?,
            Store::Shared(s) => s.create(owner, quota, token, ttl).await.map_err(|e| match e {
                NotCreated::Refused(r) => refused(r),
                NotCreated::Unavailable(u) => self.unavailable("create", &u),
            })?,
        };
        self.metrics.created();
        Ok(t)
    }

    /// The task `id` of `owner`; `None` for an unknown, expired or foreign id.
    pub(super) async fn get(&self, owner: &str, id: &str) -> Result<Option<TaskView>, RpcError> {
        match &self.store {
            Store::Memory(m) => Ok(m.get(owner, id)),
            Store::Shared(s) => s.get(owner, id).await.map_err(|e| self.unavailable("get", &e)),
        }
    }

    /// Waits until the task `id` of `owner` has ended (or is forgotten): `false` at once for
    /// an unknown, expired or foreign id. In Redis the task is looked at every poll interval.
    pub(super) async fn wait_end(&self, owner: &str, id: &str) -> Result<bool, RpcError> {
        match &self.store {
            Store::Memory(m) => match m.finished(owner, id) {
                None => Ok(false),
                Some(f) => {
                    f.wait().await;
                    Ok(true)
                }
            },
            Store::Shared(s) => s
                .wait_end(owner, id)
                .await
                .map_err(|e| self.unavailable("wait", &e)),
        }
    }

    /// A page of `owner`'s tasks after the cursor `after`, at most `limit`, with the cursor of
    /// the next page; `None` for a cursor this store would never give. In memory the pages
    /// follow the order of creation, in Redis the order of expiry.
    pub(super) async fn list(
        &self,
        owner: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Option<(Vec<TaskView>, Option<u64>)>, RpcError> {
        match &self.store {
            Store::Memory(m) => Ok(m.list(owner, after, limit)),
            Store::Shared(s) => s
                .list(owner, after, limit)
                .await
                .map(Some)
                .map_err(|e| self.unavailable("list", &e)),
        }
    }

    /// Records the end of a task this replica ran (no effect on a task already ended, e.g.
    /// cancelled); a result over the store's bounds fails the task instead.
    pub(in crate::dispatch) async fn finish(&self, id: &str, status: Status) {
        self.metrics.ended(match &status {
            Status::Completed(r) if r.get("isError") == Some(&Value::Bool(true)) => "tool_error",
            Status::Completed(_) => "completed",
            _ => "failed",
        });
        match &self.store {
            Store::Memory(m) => m.finish(id, status),
            Store::Shared(s) => {
                if !s.finish(id, status).await {
                    self.metrics.store_failed("finish");
                }
            }
        }
    }

    /// Cancels the task `id` of `owner`: `false` for an unknown, expired or foreign id. A task
    /// already ended stays as it is (cancelling it again is no error). Its work stops at once
    /// when this replica runs it, else when its replica next looks ([`Tasks::follow`]).
    pub(super) async fn cancel(&self, owner: &str, id: &str) -> Result<bool, RpcError> {
        match &self.store {
            Store::Memory(m) => Ok(m.cancel(owner, id)),
            Store::Shared(s) => s
                .cancel(owner, id)
                .await
                .map_err(|e| self.unavailable("cancel", &e)),
        }
    }

    /// Parks the working task `id` until the client answers `asked` (`used`: the answers its
    /// run had already): the task shows `input_required`, and the receiver yields every
    /// answer once the last one is in, through whichever replica it came. `None` when the
    /// task no longer works (cancelled, expired) or the store failed.
    pub(in crate::dispatch) async fn park(
        &self,
        id: &str,
        asked: Map<String, Value>,
        used: Map<String, Value>,
    ) -> Option<oneshot::Receiver<Map<String, Value>>> {
        match &self.store {
            Store::Memory(m) => m.park(id, asked, used),
            Store::Shared(s) => s.park(id, asked, used).await,
        }
    }

    /// Records answers to the questions of the task `id` of `owner`, before answering (the
    /// next [`Tasks::get`] shows them taken). Answers to keys it does not wait for, and any
    /// answer to a task that waits for none, are ignored; a malformed answer to one it waits
    /// for is refused with nothing changed. The last answer resumes the task's run.
    pub(super) async fn update(
        &self,
        owner: &str,
        id: &str,
        responses: Map<String, Value>,
    ) -> Result<(), UpdateError> {
        let r = match &self.store {
            Store::Memory(m) => m.update(owner, id, responses),
            Store::Shared(s) => s.update(owner, id, responses).await,
        };
        if matches!(r, Err(UpdateError::Store(_))) {
            self.metrics.store_failed("update");
        }
        r
    }

    /// Counts a task's work as running on this replica while the guard is held.
    pub(in crate::dispatch) fn running(&self) -> Running {
        self.metrics.running()
    }

    /// Counts a task's work stopped before it ended (cancelled, expired, or its server
    /// stopping).
    pub(in crate::dispatch) fn stopped(&self) {
        self.metrics.ended("stopped");
    }

    /// Follows the shared store until `stop` (a task cancelled through another replica stops
    /// here); nothing to follow in memory.
    pub(in crate::dispatch) async fn follow(&self, stop: CancellationToken) {
        if let Store::Shared(s) = &self.store {
            s.follow(stop).await;
        }
    }

    /// On shutdown: lets the work of this replica's tasks run for `drain`, then records the
    /// tasks still running as failed (with [`stopped_message`]) and stops them. In memory
    /// there is nothing to wait for: the tasks end with the process, and nobody could read a
    /// result after it.
    pub(in crate::dispatch) async fn drain(&self, running: &TaskTracker, drain: Duration) {
        running.close();
        let Store::Shared(s) = &self.store else {
            return;
        };
        if running.is_empty() {
            return;
        }
        tracing::info!(tasks = running.len(), drain = ?drain, "shutdown: letting running tasks finish");
        if tokio::time::timeout(drain, running.wait()).await.is_ok() {
            tracing::info!("shutdown: every task finished");
            return;
        }
        let n = s.abandon(&stopped_message(drain)).await;
        tracing::warn!(tasks = n, "shutdown: tasks still running were recorded as failed");
    }
}

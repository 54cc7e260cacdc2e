//! Where a server's tasks live: in its own memory (one replica; a task ends with its
//! process), or in Redis shared by every replica ([`SharedTasks`]). The dispatcher sees one
//! interface, with the store's failures as JSON-RPC errors; and the work of the tasks this
//! replica runs is tracked, so that a stopping server can let it finish.

use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::RpcError;
use super::task_shared::{NotCreated, SharedTasks, Unavailable};
use super::task_store::{MemoryTasks, Status, TaskStore, TaskView, UpdateError};
use crate::protocol;

/// The message of a task whose replica stopped before the task finished.
pub(super) fn stopped_message(drain: Duration) -> String {
    format!(
        "the server running this task stopped before the task finished (a stopping server lets its tasks run for {}s); start it again",
        drain.as_secs()
    )
}

/// A server's tasks.
#[derive(Debug)]
pub(super) enum Tasks {
    Memory(MemoryTasks),
    Shared(SharedTasks),
}

fn unavailable(e: &Unavailable) -> RpcError {
    RpcError::new(protocol::INTERNAL_ERROR, e.to_string())
}

impl Tasks {
    /// Creates a working task of `owner`, cancelled through `token`.
    pub(super) async fn create(&self, owner: &str, token: CancellationToken) -> Result<TaskView, RpcError> {
        let refused = |e: super::task_store::Refused| RpcError::new(protocol::RATE_LIMITED, e.to_string());
        match self {
            Tasks::Memory(m) => m.create(owner, token).map_err(refused),
            Tasks::Shared(s) => s.create(owner, token, Duration::MAX).await.map_err(|e| match e {
                NotCreated::Refused(r) => refused(r),
                NotCreated::Unavailable(u) => unavailable(&u),
            }),
        }
    }

    /// The task `id` of `owner`; `None` for an unknown, expired or foreign id.
    pub(super) async fn get(&self, owner: &str, id: &str) -> Result<Option<TaskView>, RpcError> {
        match self {
            Tasks::Memory(m) => Ok(m.get(owner, id)),
            Tasks::Shared(s) => s.get(owner, id).await.map_err(|e| unavailable(&e)),
        }
    }

    /// Records the end of a task (no effect on a task already ended).
    pub(super) async fn finish(&self, id: &str, status: Status) {
        match self {
            Tasks::Memory(m) => m.finish(id, status),
            Tasks::Shared(s) => {
                s.finish(id, status).await;
            }
        }
    }

    /// Cancels the task `id` of `owner`: `false` for an unknown, expired or foreign id.
    pub(super) async fn cancel(&self, owner: &str, id: &str) -> Result<bool, RpcError> {
        match self {
            Tasks::Memory(m) => Ok(m.cancel(owner, id)),
            Tasks::Shared(s) => s.cancel(owner, id).await.map_err(|e| unavailable(&e)),
        }
    }

    /// Parks the working task `id` until the client answers `asked` (`used`: the answers its
    /// run had already); the receiver yields every answer once the last one is in. `None`
    /// when the task no longer works.
    pub(super) async fn park(
        &self,
        id: &str,
        asked: Map<String, Value>,
        used: Map<String, Value>,
    ) -> Option<oneshot::Receiver<Map<String, Value>>> {
        match self {
            Tasks::Memory(m) => m.park(id, asked, used),
            Tasks::Shared(s) => s.park(id, asked, used).await,
        }
    }

    /// Records answers to the questions of the task `id` of `owner`, before answering.
    pub(super) async fn update(
        &self,
        owner: &str,
        id: &str,
        responses: Map<String, Value>,
    ) -> Result<(), UpdateError> {
        match self {
            Tasks::Memory(m) => m.update(owner, id, responses),
            Tasks::Shared(s) => s.update(owner, id, responses).await,
        }
    }

    /// Follows the shared store until `stop` (a task cancelled through another replica stops
    /// here); nothing to follow in memory.
    pub(super) async fn follow(&self, stop: CancellationToken) {
        if let Tasks::Shared(s) = self {
            s.follow(stop).await;
        }
    }

    /// On shutdown: lets the work of this replica's tasks run for `drain`, then records the
    /// tasks still running as failed (with [`stopped_message`]) and stops them. In memory
    /// there is nothing to wait for: the tasks end with the process, and nobody could read a
    /// result after it.
    pub(super) async fn drain(&self, running: &TaskTracker, drain: Duration) {
        running.close();
        let Tasks::Shared(s) = self else {
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

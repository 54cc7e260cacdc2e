//! The metrics of tasks (tool calls answered with a task the client polls): how many start,
//! how they end, how many this replica runs now, and what the shared task store failed to
//! do. No series carries a caller or a task id.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

/// Counters of tasks.
#[derive(Debug, Default)]
pub struct TaskMetrics {
    created: Counter,
    ended: Family<StatusLabels, Counter>,
    running: Gauge<i64, AtomicI64>,
    store_failures: Family<OpLabels, Counter>,
}

/// While held, one task's work counts as running on this replica.
#[derive(Debug)]
pub struct Running(Gauge<i64, AtomicI64>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl TaskMetrics {
    /// Registers the metrics in `root` (the `quiver_` registry).
    pub fn register(root: &mut Registry) -> Arc<Self> {
        let m = Self::default();
        root.register(
            "tasks_created",
            "Tasks created through this replica",
            m.created.clone(),
        );
        root.register(
            "tasks_ended",
            "Tasks whose work ended on this replica, by status (completed, tool_error, failed; stopped: cancelled, expired or stopped with the server)",
            m.ended.clone(),
        );
        root.register(
            "tasks_running",
            "Tasks whose work runs on this replica now (waiting for input included)",
            m.running.clone(),
        );
        root.register(
            "task_store_failures",
            "Task operations the shared task store (Redis) did not answer, by operation",
            m.store_failures.clone(),
        );
        // Every series exists from the start (at 0), so rates and alerts see them.
        for status in ["completed", "tool_error", "failed", "stopped"] {
            let _ = m.ended.get_or_create(&StatusLabels { status });
        }
        for op in ["create", "get", "cancel", "update", "list", "wait", "finish"] {
            let _ = m.store_failures.get_or_create(&OpLabels { op });
        }
        Arc::new(m)
    }

    /// Metrics not exposed anywhere (tests, and servers built without [`crate::metrics`]).
    pub fn unregistered() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts a created task.
    pub fn created(&self) {
        self.created.inc();
    }

    /// Counts a task's end on this replica.
    pub fn ended(&self, status: &'static str) {
        self.ended.get_or_create(&StatusLabels { status }).inc();
    }

    /// Tasks that ended with `status` so far.
    pub fn ended_count(&self, status: &'static str) -> u64 {
        self.ended.get_or_create(&StatusLabels { status }).get()
    }

    /// Counts a task's work as running until the guard is dropped.
    pub fn running(&self) -> Running {
        self.running.inc();
        Running(self.running.clone())
    }

    /// Counts an operation the shared store did not answer.
    pub fn store_failed(&self, op: &'static str) {
        self.store_failures.get_or_create(&OpLabels { op }).inc();
    }
}

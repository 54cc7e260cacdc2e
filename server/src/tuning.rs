//! Runtime sizing and CPU pinning: one tokio worker per CPU the process may use (its
//! affinity mask and cgroup quota), and optionally each worker pinned to its own CPU, for
//! Guaranteed pods under the kubelet's static CPU manager.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

/// What the runtime was sized and pinned to, reported on `/status`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tuning {
    /// Tokio worker threads.
    pub worker_threads: usize,
    /// CPUs in the process's affinity mask.
    pub allowed_cpus: Vec<usize>,
    /// `std::thread::available_parallelism` (affinity and cgroup quota).
    pub available_parallelism: usize,
    /// Whether workers are pinned.
    pub pinned: bool,
    /// Whether the MCP port is served by one single-threaded runtime per worker
    /// (`--per-core-listeners`).
    pub per_core_listeners: bool,
}

/// CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Chooses the worker count: `requested` when non-zero, else the CPUs available.
pub fn plan(requested: usize, pin: bool) -> Tuning {
    let allowed = allowed_cpus();
    let avail = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = if requested > 0 {
        requested
    } else {
        avail.min(allowed.len().max(1))
    };
    Tuning {
        worker_threads: workers.max(1),
        allowed_cpus: allowed,
        available_parallelism: avail,
        pinned: pin,
        per_core_listeners: false,
    }
}

/// Builds the multi-threaded runtime. With pinning, the first `worker_threads` threads the
/// runtime starts (its workers, which it starts before any blocking thread) are each bound
/// to one allowed CPU, round-robin.
///
/// # Errors
/// The runtime could not be built.
pub fn runtime(t: &Tuning) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.worker_threads(t.worker_threads)
        .enable_all()
        .thread_name("quiver-worker");
    if t.pinned && !t.allowed_cpus.is_empty() {
        let cpus = Arc::new(t.allowed_cpus.clone());
        let started = Arc::new(AtomicUsize::new(0));
        let workers = t.worker_threads;
        b.on_thread_start(move || {
            let n = started.fetch_add(1, Ordering::SeqCst);
            if n < workers {
                let cpu = cpus[n % cpus.len()];
                let ok = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
                if ok {
                    tracing::debug!(worker = n, cpu, "worker pinned");
                } else {
                    tracing::warn!(worker = n, cpu, "could not pin worker");
                }
            }
        });
    }
    b.build()
}

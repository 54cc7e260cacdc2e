//! Per-core listeners (`--per-core-listeners`): the MCP port served by one single-threaded
//! tokio runtime per worker, each on an OS thread of its own with its own listening socket
//! bound to the same address with `SO_REUSEPORT`. The kernel spreads new connections over
//! the sockets (by a hash of the connection's addresses), and a connection lives on the
//! thread that accepted it: no work-stealing queues, no cross-thread wake-ups, no atomic
//! reference counts contended between cores on the request path.
//!
//! What stays shared: the dispatch state ([`super::http::HttpState`]), the connection cap
//! ([`Connections`]), metrics. Everything else the server runs (reloads, upstream
//! connections, the admin port, task stores) stays on the main runtime; a call that waits
//! on one of those is woken across runtimes like any channel.
//!
//! The trade-off: a connection cannot move to an idle core, so a few long-lived, busy
//! connections can load one core while another idles. Clients that open many connections
//! (or a proxy in front) spread well; see docs/operator.md.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::limits::Connections;
use super::listen::{self, App, ConnOptions};
use crate::metrics::Metrics;

/// Backlog of each listening socket (the kernel caps it at `net.core.somaxconn`).
const BACKLOG: u32 = 4096;

/// Binds `count` listening sockets to `addr`, all with `SO_REUSEPORT` (so each may share the
/// port). With port 0, the first socket's port is used for the rest. Call inside a runtime;
/// the sockets come back as std listeners, ready to be moved to the threads that serve them.
///
/// # Errors
/// A socket could not be created, bound (e.g. the port is taken by a socket without
/// `SO_REUSEPORT`) or listen.
pub async fn bind(addr: SocketAddr, count: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut bound = Vec::with_capacity(count);
    let mut at = addr;
    for _ in 0..count.max(1) {
        let socket = if at.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(at)?;
        let listener = socket.listen(BACKLOG)?;
        at = listener.local_addr()?;
        bound.push(listener.into_std()?);
    }
    Ok(bound)
}

/// The threads serving the MCP port, started by [`start`].
pub struct PerCore {
    served: Vec<oneshot::Receiver<()>>,
    release: CancellationToken,
}

impl PerCore {
    /// Resolves when every thread's accept loop has returned (after `stop` was cancelled and
    /// its connections closed) or its thread ended.
    pub async fn served(&mut self) {
        for done in &mut self.served {
            let _ = done.await;
        }
    }
}

impl Drop for PerCore {
    /// Lets the threads end their runtimes: tasks spawned by requests (tool tasks, resumable
    /// answers) run on them until then, so the server drops this only once it has drained
    /// them.
    fn drop(&mut self) {
        self.release.cancel();
    }
}

/// What each thread serves, and how.
pub struct Serve<A> {
    /// The service each thread answers with (cloned per thread).
    pub app: A,
    /// The connection cap, shared by every thread.
    pub conns: Arc<Connections>,
    /// Per-connection options.
    pub options: ConnOptions,
    /// Cancelled to stop accepting and drain (as for [`listen::serve`]).
    pub stop: CancellationToken,
    /// Counts connections and refusals.
    pub metrics: Option<Arc<Metrics>>,
    /// CPU for thread `i`: `cpus[i % len]`; empty: threads are not pinned.
    pub cpus: Vec<usize>,
}

/// Starts one thread per listener, each running a single-threaded runtime that serves
/// `serve.app` on its listener with [`listen::serve`].
///
/// # Errors
/// A thread could not be spawned. (A runtime that cannot be built, or a listener that
/// cannot be registered, is logged and ends its thread: [`PerCore::served`] then does
/// not wait for it.)
pub fn start<A: App>(listeners: Vec<std::net::TcpListener>, serve: &Serve<A>) -> std::io::Result<PerCore> {
    let release = CancellationToken::new();
    let mut served = Vec::with_capacity(listeners.len());
    for (i, listener) in listeners.into_iter().enumerate() {
        let (done, waited) = oneshot::channel();
        served.push(waited);
        let cpu = (!serve.cpus.is_empty()).then(|| serve.cpus[i % serve.cpus.len()]);
        let thread = Thread {
            index: i,
            listener,
            app: serve.app.clone(),
            conns: serve.conns.clone(),
            options: serve.options,
            stop: serve.stop.clone(),
            metrics: serve.metrics.clone(),
            release: release.clone(),
        };
        std::thread::Builder::new()
            .name(format!("quiver-http-{i}"))
            .spawn(move || thread.run(cpu, done))?;
    }
    Ok(PerCore { served, release })
}

/// One thread's share of [`start`].
struct Thread<A> {
    index: usize,
    listener: std::net::TcpListener,
    app: A,
    conns: Arc<Connections>,
    options: ConnOptions,
    stop: CancellationToken,
    metrics: Option<Arc<Metrics>>,
    release: CancellationToken,
}

impl<A: App> Thread<A> {
    fn run(self, cpu: Option<usize>, done: oneshot::Sender<()>) {
        let index = self.index;
        if let Some(cpu) = cpu {
            if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                tracing::debug!(thread = index, cpu, "per-core listener pinned");
            } else {
                tracing::warn!(thread = index, cpu, "could not pin a per-core listener");
            }
        }
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(thread = index, error = %e, "per-core runtime could not be built");
                return;
            }
        };
        let release = self.release.clone();
        rt.block_on(async move {
            match TcpListener::from_std(self.listener) {
                Ok(listener) => {
                    listen::serve(
                        listener,
                        self.app,
                        self.conns,
                        self.options,
                        self.stop,
                        self.metrics,
                    )
                    .await;
                }
                Err(e) => {
                    tracing::error!(thread = index, error = %e, "per-core listener could not be registered")
                }
            }
            let _ = done.send(());
            // Tasks that requests spawned on this runtime keep running until the server
            // has drained them.
            release.cancelled().await;
        });
        rt.shutdown_timeout(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sockets_share_one_port_and_the_port_stays_taken_for_others() {
        let bound = bind(SocketAddr::from(([127, 0, 0, 1], 0)), 3).await.unwrap();
        assert_eq!(bound.len(), 3);
        let port = bound[0].local_addr().unwrap().port();
        assert_ne!(port, 0);
        assert!(bound.iter().all(|l| l.local_addr().unwrap().port() == port));
        // A socket without SO_REUSEPORT cannot join the group.
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err());
    }
}

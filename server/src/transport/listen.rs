//! The accept loop shared by the MCP and admin listeners: HTTP/1.1 over hyper with a
//! connection cap, a header-read timeout (which also closes idle keep-alive connections),
//! and graceful shutdown.
//!
//! `axum::serve` cannot set hyper's timer or header timeout, hence this loop.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::limits::Connections;
use crate::metrics::{Metrics, Refusal};

/// Per-connection options of a listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnOptions {
    /// Time a client has to send a request's headers, counted from when the connection is
    /// ready for a request: a keep-alive connection idle this long is closed too.
    pub header_read_timeout: Duration,
}

impl Default for ConnOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Largest request head (start line and headers); larger ones get 431. Also the read
/// buffer's cap: hyper's default (~400 KiB) times 10,000 connections would be 4 GiB.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// How long the loop pauses after an accept error such as EMFILE, rather than spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `stop` is cancelled, then stops accepting, lets every
/// connection finish its in-flight request (idle ones close at once), and returns when all
/// are closed. Bound the wait from outside (a timeout around this future): connection tasks
/// are detached and end with the runtime.
///
/// `metrics`, when given, counts open connections and pauses at the cap.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    conns: Arc<Connections>,
    options: ConnOptions,
    stop: CancellationToken,
    metrics: Option<Arc<Metrics>>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_HEAD_BYTES);
    loop {
        let slot = match conns.try_take() {
            Some(s) => s,
            None => {
                if let Some(m) = &metrics {
                    m.refused(Refusal::Connections);
                }
                tokio::select! {
                    s = conns.take() => s,
                    () = stop.cancelled() => break,
                }
            }
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    if !is_connection_error(&e) {
                        tracing::warn!(error = %e, "accept failed; pausing");
                        tokio::select! {
                            () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                            () = stop.cancelled() => break,
                        }
                    }
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
        let slot = conns.opened(slot);
        let stop = stop.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _open = metrics.as_ref().map(OpenConnection::new);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = stop.cancelled() => {}
            }
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error while draining");
            }
        });
    }
    drop(listener);
    conns.all_closed().await;
}

/// Counts a connection in `quiver_open_connections` while it lives.
struct OpenConnection(Arc<Metrics>);

impl OpenConnection {
    fn new(m: &Arc<Metrics>) -> Self {
        m.connections.inc();
        Self(m.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.dec();
    }
}

/// Errors about one incoming connection (it was reset before we took it), as opposed to the
/// listener's (out of file descriptors, ...).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}

/// The process's open-file limit (soft `RLIMIT_NOFILE`), from /proc/self/limits.
pub fn fd_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

/// File descriptors kept out of the MCP connection cap: the admin listener's connections,
/// outgoing http/exec tool calls, the config watch, the runtime's own, and a margin.
pub fn fd_headroom(limit: u64) -> u64 {
    256 + limit / 10
}

/// The MCP connection cap actually used: `wanted`, lowered to leave [`fd_headroom`] below the
/// file-descriptor limit. Returns the cap and whether it was lowered.
pub fn connection_cap(wanted: usize, fd_limit: Option<u64>) -> (usize, bool) {
    let Some(limit) = fd_limit else {
        return (wanted, false);
    };
    let room = limit.saturating_sub(fd_headroom(limit)).max(16);
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    if wanted > room {
        (room, true)
    } else {
        (wanted, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_cap_leaves_fd_headroom() {
        assert_eq!(connection_cap(10_000, Some(1_048_576)), (10_000, false));
        // 1024 descriptors: 256 + 102 kept back.
        assert_eq!(connection_cap(10_000, Some(1024)), (666, true));
        assert_eq!(connection_cap(100, Some(1024)), (100, false));
        assert_eq!(connection_cap(10_000, Some(20_000)), (10_000, false));
        assert_eq!(connection_cap(10_000, Some(10_000)), (8_744, true));
        assert_eq!(connection_cap(500, None), (500, false));
        assert!(
            fd_limit().is_some_and(|l| l > 0),
            "Linux exposes /proc/self/limits"
        );
    }
}

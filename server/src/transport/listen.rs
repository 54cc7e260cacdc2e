//! The accept loop shared by the MCP and admin listeners: HTTP/1.1, and on request (MCP
//! port, `--http2`) HTTP/2 over cleartext with prior knowledge (h2c, what proxies and
//! multiplexing clients speak to a backend), over hyper, with a connection cap, a header-read timeout (which also closes
//! idle keep-alive connections), and graceful shutdown.
//!
//! `axum::serve` cannot set hyper's timer or header timeout, hence this loop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
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
    /// Also serve HTTP/2 with prior knowledge (h2c). Off by default: a client that stops
    /// reading (a flow-control window of 0) can hold an HTTP/2 connection's streams, and
    /// the request slots behind them, for as long as it likes; see docs/protocol.md.
    pub http2: bool,
}

impl Default for ConnOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            http2: false,
        }
    }
}

/// Largest request head (start line and headers); larger ones get 431. Also the read
/// buffer's cap: hyper's default (~400 KiB) times 10,000 connections would be 4 GiB.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// How long the loop pauses after an accept error such as EMFILE, rather than spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Concurrent requests on one HTTP/2 connection (hyper's default is 200); each is a request
/// like any other, under the same body, response and time limits.
const MAX_H2_STREAMS: u32 = 128;

/// How an HTTP/2 connection starts (RFC 9113, 3.4). No HTTP/1 method begins with "PRI".
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

tokio::task_local! {
    /// The TCP peer of the connection the request being served arrived on.
    static PEER: std::net::IpAddr;
}

/// The TCP peer of the connection the request being served arrived on; `None` for a
/// request that did not come through [`serve`] (a router driven without a socket).
pub fn peer() -> Option<std::net::IpAddr> {
    PEER.try_with(|p| *p).ok()
}

/// What a listener answers each request with: a [`Router`] (the admin port), or the MCP
/// port's service, which answers `POST /mcp` itself and hands the rest to its router.
pub trait App: Clone + Send + Sync + 'static {
    /// The answer to `req`. The future must not read [`peer`] before it is first polled:
    /// HTTP/2 requests are polled inside the scope that sets it, not called there.
    fn answer(&self, req: http::Request<Incoming>) -> impl Future<Output = Response> + Send + use<Self>;
}

impl App for Router {
    fn answer(&self, req: http::Request<Incoming>) -> impl Future<Output = Response> + Send + use<> {
        let call = tower::ServiceExt::oneshot(self.clone(), req);
        async move {
            match call.await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        }
    }
}

/// `app`'s answer as a hyper service's future.
fn answer<A: App>(
    app: &A,
    req: http::Request<Incoming>,
) -> impl Future<Output = Result<Response, std::convert::Infallible>> + Send + use<A> {
    let answer = app.answer(req);
    async move { Ok(answer.await) }
}

/// The connection builders of one listener.
struct Builders {
    h1: http1::Builder,
    /// `None` when HTTP/2 is off: connections go straight to HTTP/1.1, nothing peeked.
    h2: Option<http2::Builder<TokioExecutor>>,
    sniff_timeout: Duration,
}

impl Builders {
    fn new(options: ConnOptions) -> Self {
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            .header_read_timeout(options.header_read_timeout)
            .keep_alive(true)
            .max_header_size(MAX_HEAD_BYTES)
            .max_buf_size(MAX_HEAD_BYTES);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(MAX_H2_STREAMS)
            .max_header_list_size(MAX_HEAD_BYTES as u32);
        Self {
            h1,
            h2: options.http2.then_some(h2),
            sniff_timeout: options.header_read_timeout,
        }
    }

    /// Serves one accepted connection until it ends or `stop` (then gracefully).
    async fn serve(
        &self,
        stream: tokio::net::TcpStream,
        peer: std::net::IpAddr,
        app: impl App,
        stop: CancellationToken,
    ) {
        let h2 = match &self.h2 {
            None => None,
            Some(builder) => tokio::select! {
                r = tokio::time::timeout(self.sniff_timeout, speaks_h2(&stream)) => match r {
                    Ok(Ok(h2)) => h2.then_some(builder),
                    _ => return, // silent, closed, or broken before its first bytes
                },
                () = stop.cancelled() => return,
            },
        };
        let io = TokioIo::new(stream);
        if let Some(h2) = h2 {
            // hyper closes idle HTTP/1.1 connections (the header timeout) but has no such
            // limit for HTTP/2, not even for a client stuck in the preface: count the
            // requests in flight and close the connection once it has had none for as long.
            let activity = Arc::new(Activity::new());
            let tracked = activity.clone();
            let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
                let guard = tracked.begin();
                authority_as_host(&mut req);
                // HTTP/2 streams are served on tasks of their own: each carries the peer.
                let answer = PEER.scope(peer, answer(&app, req));
                async move {
                    let r = answer.await?;
                    Ok::<_, std::convert::Infallible>(
                        r.map(|body| Body::new(Tracked { body, _guard: guard })),
                    )
                }
            });
            let conn = h2.serve_connection(io, service);
            let idle = activity.idle_for(self.sniff_timeout);
            drive(conn, stop, idle, self.sniff_timeout, |c| c.graceful_shutdown()).await;
        } else {
            let service = hyper::service::service_fn(move |req| answer(&app, req));
            let conn = self.h1.serve_connection(io, service);
            let idle = std::future::pending();
            // HTTP/1.1 requests are served inside the connection's own future.
            PEER.scope(
                peer,
                drive(conn, stop, idle, self.sniff_timeout, |c| c.graceful_shutdown()),
            )
            .await;
        }
    }
}

/// Requests in progress on one HTTP/2 connection (from when the request's head arrives
/// until its response body is sent or the stream reset; a stream open for server-sent
/// events counts), and since when there have been none.
struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Resolves once the connection has had no request in progress for `limit`.
    async fn idle_for(self: Arc<Self>, limit: Duration) {
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        loop {
            let wait = if self.in_flight.load(Ordering::Acquire) > 0 {
                limit_ms
            } else {
                let idle = self
                    .now_ms()
                    .saturating_sub(self.idle_since_ms.load(Ordering::Acquire));
                if idle >= limit_ms {
                    return;
                }
                limit_ms - idle
            };
            tokio::time::sleep(Duration::from_millis(wait.max(1))).await;
        }
    }
}

/// One request in progress; the connection's idle clock restarts when the last ends.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.idle_since_ms.store(self.0.now_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds its [`InFlight`] until hyper drops it.
struct Tracked {
    body: Body,
    _guard: InFlight,
}

impl HttpBody for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// An HTTP/2 request names its server in `:authority` and may leave out `Host`; what
/// reads `Host` (the DNS-rebinding check, the protected-resource URL) must see it either
/// way, so the authority is copied there, as HTTP/1.1 requires it.
fn authority_as_host<B>(req: &mut http::Request<B>) {
    if req.headers().contains_key(http::header::HOST) {
        return;
    }
    let host = req
        .uri()
        .authority()
        .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok());
    if let Some(host) = host {
        req.headers_mut().insert(http::header::HOST, host);
    }
}

/// Whether the client opens with the HTTP/2 preface, from its first bytes (peeked, so
/// nothing is consumed). Waits while what arrived is too short to tell.
async fn speaks_h2(stream: &tokio::net::TcpStream) -> std::io::Result<bool> {
    let mut buf = [0u8; 3];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if n == buf.len() || buf[..n] != H2_PREFACE[..n] {
            return Ok(buf[..n] == H2_PREFACE[..buf.len()]);
        }
        // "P" or "PR" so far: peek would return at once again, so wait for more.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs a connection. When `stop` fires first, asks it to finish its in-flight requests
/// and waits for that (bounded from outside, see [`serve`]); when `idle` resolves first,
/// closes it the same way but waits at most `linger` before dropping it.
async fn drive<C>(
    conn: C,
    stop: CancellationToken,
    idle: impl Future<Output = ()>,
    linger: Duration,
    graceful_shutdown: impl FnOnce(Pin<&mut C>),
) where
    C: Future<Output = hyper::Result<()>>,
{
    tokio::pin!(conn);
    let stopping = tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            return;
        }
        () = stop.cancelled() => true,
        () = idle => false,
    };
    graceful_shutdown(conn.as_mut());
    let r = if stopping {
        conn.await
    } else {
        match tokio::time::timeout(linger, conn).await {
            Ok(r) => r,
            Err(_) => return, // the peer does not read its GOAWAY: drop the connection
        }
    };
    if let Err(e) = r {
        tracing::debug!(error = %e, "connection ended with an error while draining");
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then stops accepting, lets every
/// connection finish its in-flight request (idle ones close at once), and returns when all
/// are closed. Bound the wait from outside (a timeout around this future): connection tasks
/// are detached and end with the runtime.
///
/// `metrics`, when given, counts open connections and pauses at the cap.
pub async fn serve(
    listener: TcpListener,
    app: impl App,
    conns: Arc<Connections>,
    options: ConnOptions,
    stop: CancellationToken,
    metrics: Option<Arc<Metrics>>,
) {
    let builders = Arc::new(Builders::new(options));
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, addr)) => (s, addr.ip()),
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
        // The slot is taken after the accept, not before: listeners sharing one cap
        // (per-core listeners) must not each hold a slot while they wait for a connection
        // that may never come to them. At the cap, the one connection accepted waits here,
        // unserved, and the rest wait in the kernel's backlog.
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
        let _ = stream.set_nodelay(true);
        let slot = conns.opened(slot);
        let (builders, app, stop) = (builders.clone(), app.clone(), stop.clone());
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _open = metrics.as_ref().map(OpenConnection::new);
            builders.serve(stream, peer, app, stop).await;
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

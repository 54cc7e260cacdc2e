//! A lean HTTP/1.1 client for the POSTs to a plain-`http://` remote upstream: the calling
//! task writes the request and reads the answer itself, on a keep-alive connection taken
//! from the upstream's own pool.
//!
//! hyper's pooled client runs each connection as a task of its own and hands every request
//! and answer across channels to it: two task wake-ups, a header map and a boxed body per
//! call, the largest part of what forwarding a `tools/call` cost this server. Here a call
//! is one `write` and (usually) one `read` in the task that serves the client.
//!
//! The upstream is untrusted: the response head is bounded ([`MAX_HEAD`], [`MAX_HEADERS`]),
//! the body by the caller's limit whatever its framing (length, chunked, until close), a
//! connection is reused only after a complete, well-framed answer with nothing after it,
//! and one idle for longer than [`MAX_IDLE_TIME`] is closed rather than reused (servers
//! close idle connections after a few seconds; uvicorn after 5). Time limits are the
//! caller's: dropping a [`Response`] (or the future reading it) closes its connection.
//! `https://` upstreams and the long-lived GET stream use the hyper client.

use std::io::{ErrorKind, Write as _};
use std::os::fd::AsRawFd;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use http::HeaderValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Idle connections kept per upstream; a connection finishing beyond it is closed. Under a
/// steady load every connection in use goes idle between calls, so this is about the
/// concurrency the pool serves without opening a connection per call (at 128 client
/// connections a cap of 64 made one call in ten connect).
const MAX_IDLE: usize = 256;
/// A connection idle for longer is closed instead of reused.
const MAX_IDLE_TIME: Duration = Duration::from_secs(4);
/// Bytes of a response head (status line and headers).
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// Header lines of a response.
const MAX_HEADERS: usize = 64;
/// A chunk-size line (hex digits and extensions).
const MAX_CHUNK_LINE: usize = 1024;
/// Interim (1xx) responses before the final one.
const MAX_INTERIM: usize = 8;
/// Most of a `Content-Length` reserved at once (the rest as it arrives).
const MAX_RESERVE: usize = 1 << 20;
/// Read buffer capacity a pooled connection keeps (a large answer's buffer is not kept):
/// at most [`MAX_IDLE`] x this is held by idle connections.
const KEEP_CAPACITY: usize = 2 * READ_SIZE;
/// Bytes asked of each read.
const READ_SIZE: usize = 16 * 1024;
/// An idle connection put back more recently than this, on which the reactor has seen
/// nothing, is reused without asking the socket (see [`Conn::reusable`]). Under load a
/// connection waits a round of calls between uses (milliseconds); one idle for longer
/// serves so few calls that the syscall does not matter. The reactor's view lags the
/// socket only by the time since its last turn (it turns whenever the worker runs out of
/// tasks, and every few dozen task polls), so a close it has not yet seen can only have
/// arrived within that lag: taking such a connection fails one call, as a close arriving
/// just after the request would.
const FRESH: Duration = Duration::from_millis(100);

/// The pool of one upstream.
#[derive(Debug)]
pub(super) struct Pool {
    /// `host:port` to connect to.
    authority: String,
    /// The request line and the headers every request has.
    prefix: Vec<u8>,
    idle: Mutex<Vec<Conn>>,
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    pos: usize,
    idle_since: Instant,
    /// How long it may stay idle: [`MAX_IDLE_TIME`], or less when the upstream said so.
    max_idle: Duration,
}

impl Conn {
    /// Reads more bytes into the buffer; `Ok(0)` at the end of the stream. Consumed bytes
    /// are dropped first, so the buffer holds only what is still to be read (the limits on
    /// heads and lines bound it).
    async fn fill(&mut self) -> std::io::Result<usize> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        self.stream.read_buf(&mut self.buf).await
    }

    /// Whether the reactor has seen the socket readable (data, or the end of the stream)
    /// since the last read that cleared it. Asks no syscall.
    fn reactor_saw_something(&self) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        self.stream.poll_read_ready(&mut cx).is_ready()
    }

    fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Whether an idle connection can carry another request: not idle for too long, and
    /// nothing (not even the end of the stream) has arrived since its last answer.
    ///
    /// The reactor is asked first: it has seen every event up to its last turn, and the
    /// read that ended the last answer cleared the connection's readiness. A connection it
    /// has seen nothing on, put back less than [`FRESH`] ago, is reused as is (under load,
    /// that is nearly every call, which then costs no extra syscall). Any other is asked
    /// with a non-blocking peek of the socket itself, which also sees a close that arrived
    /// since the reactor's last turn.
    fn reusable(&self) -> bool {
        let idle = self.idle_since.elapsed();
        if idle > self.max_idle {
            return false;
        }
        if idle < FRESH && !self.reactor_saw_something() {
            return true;
        }
        let mut probe = 0u8;
        // SAFETY: a valid socket of this stream and a one-byte buffer that outlives the call.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                (&raw mut probe).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n < 0 && std::io::Error::last_os_error().kind() == ErrorKind::WouldBlock
    }
}

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes remain.
    Length(u64),
    /// Chunked: this many bytes remain of the current chunk (0: a size line is next).
    Chunked(u64),
    /// Chunked: the CRLF that ends a chunk is next.
    ChunkEnd,
    /// Until the connection closes.
    Close,
    /// The body has been read.
    Done,
}

/// A response whose head has been read; the body is read through it.
#[derive(Debug)]
pub(super) struct Response<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    pub status: u16,
    /// The `Mcp-Session-Id` header.
    pub session: Option<HeaderValue>,
    /// The body is `text/event-stream`.
    pub is_stream: bool,
    framing: Framing,
    keep_alive: bool,
    /// Body bytes read so far, and the most allowed.
    read: usize,
    limit: usize,
    /// A decoded chunked body (see [`Response::whole`]).
    decoded: Vec<u8>,
}

/// Why a request failed.
pub(super) type Failed = String;

fn failed(why: impl Into<String>) -> Failed {
    why.into()
}

impl Pool {
    /// A pool for a plain `http://` URL; `None` for any other.
    pub(super) fn for_url(url: &http::Uri, user_agent: &str) -> Option<Self> {
        if url.scheme_str() != Some("http") {
            return None;
        }
        let authority = url.authority()?;
        let host = authority.host();
        // The Host header is the host and an explicit port, never the URL's user info.
        let host_header = match authority.port() {
            Some(p) => format!("{host}:{}", p.as_str()),
            None => host.to_owned(),
        };
        let port = authority.port_u16().unwrap_or(80);
        let mut prefix = Vec::with_capacity(256);
        prefix.extend_from_slice(b"POST ");
        prefix.extend_from_slice(if url.path().is_empty() {
            b"/"
        } else {
            url.path().as_bytes()
        });
        if let Some(q) = url.query() {
            prefix.push(b'?');
            prefix.extend_from_slice(q.as_bytes());
        }
        prefix.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        prefix.extend_from_slice(host_header.as_bytes());
        prefix.extend_from_slice(b"\r\naccept: application/json, text/event-stream\r\nuser-agent: ");
        prefix.extend_from_slice(user_agent.as_bytes());
        prefix.extend_from_slice(b"\r\ncontent-type: application/json\r\n");
        Some(Self {
            authority: format!("{host}:{port}"),
            prefix,
            idle: Mutex::new(Vec::new()),
        })
    }

    fn take_idle(&self) -> Option<Conn> {
        loop {
            let conn = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop()?;
            if conn.reusable() {
                return Some(conn);
            }
        }
    }

    fn put_idle(&self, mut conn: Conn) {
        if conn.buf.capacity() > KEEP_CAPACITY {
            conn.buf = Vec::new();
        }
        conn.buf.clear();
        conn.pos = 0;
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // The oldest (first) connection is closed once it has expired, so a burst's extra
        // connections do not stay open for good.
        if idle.first().is_some_and(|c| c.idle_since.elapsed() > c.max_idle) {
            idle.remove(0);
        }
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    async fn connect(&self) -> Result<Conn, Failed> {
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| failed(format!("connecting to {}: {e}", self.authority)))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            buf: Vec::new(),
            pos: 0,
            idle_since: Instant::now(),
            max_idle: MAX_IDLE_TIME,
        })
    }

    /// Sends a POST of `body` with the extra header lines `headers` (each `name: value\r\n`,
    /// already validated) and reads the answer's head. The body is limited to `limit` bytes.
    ///
    /// A request that could not be written on a reused connection (the upstream had closed
    /// it) is sent once more on a new one: it cannot have reached the upstream. Nothing else
    /// is retried, since a `tools/call` is not idempotent.
    pub(super) async fn post(
        &self,
        headers: &[u8],
        body: &[u8],
        limit: usize,
    ) -> Result<Response<'_>, Failed> {
        let mut request = Vec::with_capacity(self.prefix.len() + headers.len() + 40 + body.len());
        request.extend_from_slice(&self.prefix);
        request.extend_from_slice(headers);
        request.extend_from_slice(b"content-length: ");
        let _ = write!(request, "{}\r\n\r\n", body.len());
        request.extend_from_slice(body);
        let mut conn = match self.take_idle() {
            Some(mut c) => match c.stream.write_all(&request).await {
                Ok(()) => c,
                Err(_) => {
                    drop(c);
                    let mut c = self.connect().await?;
                    write(&mut c, &request).await?;
                    c
                }
            },
            None => {
                let mut c = self.connect().await?;
                write(&mut c, &request).await?;
                c
            }
        };
        let head = read_head(&mut conn).await?;
        if let Some(t) = head.idle_timeout {
            conn.max_idle = conn.max_idle.min(t);
        }
        Ok(Response {
            pool: self,
            conn: Some(conn),
            status: head.status,
            session: head.session,
            is_stream: head.is_stream,
            framing: head.framing,
            keep_alive: head.keep_alive,
            read: 0,
            limit,
            decoded: Vec::new(),
        })
    }
}

async fn write(conn: &mut Conn, request: &[u8]) -> Result<(), Failed> {
    conn.stream
        .write_all(request)
        .await
        .map_err(|e| failed(format!("sending the request: {e}")))
}

struct Head {
    status: u16,
    session: Option<HeaderValue>,
    is_stream: bool,
    framing: Framing,
    keep_alive: bool,
    /// `Keep-Alive: timeout=N`, halved (the upstream closes the connection after N s idle).
    idle_timeout: Option<Duration>,
}

/// Where the blank line that ends a head is in `buf`, searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let from = from.saturating_sub(3);
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\n\n" || w == b"\n\r")
        .map(|i| from + i)
}

/// Reads a response head (skipping at most [`MAX_INTERIM`] interim 1xx responses). Every
/// head byte counts against [`MAX_HEAD`], interim ones too, and a head is parsed only once
/// its end has arrived (an upstream sending it a byte at a time costs one scan, not one
/// parse per byte).
async fn read_head(conn: &mut Conn) -> Result<Head, Failed> {
    let mut interim = 0;
    let mut head_bytes = 0;
    // Bytes of the buffered data already searched for the end of the head.
    let mut scanned = 0;
    loop {
        if head_end(conn.buffered(), scanned).is_some() {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Response::new(&mut headers);
            match r.parse(conn.buffered()) {
                Ok(httparse::Status::Complete(n)) => {
                    head_bytes += n;
                    if head_bytes > MAX_HEAD {
                        return Err(failed(format!("a response head over {MAX_HEAD} bytes")));
                    }
                    let head = interpret(&r)?;
                    conn.pos += n;
                    scanned = 0;
                    match head {
                        Some(head) => return Ok(head),
                        None if interim < MAX_INTERIM => {
                            interim += 1;
                            continue;
                        }
                        None => return Err(failed("too many interim (1xx) responses")),
                    }
                }
                // A blank line inside a head httparse has not finished (a bare `\n\r`).
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Err(failed(format!("a malformed response head ({e})"))),
            }
        }
        scanned = conn.buffered().len();
        if head_bytes + scanned >= MAX_HEAD {
            return Err(failed(format!("a response head over {MAX_HEAD} bytes")));
        }
        match conn.fill().await {
            Ok(0) => {
                return Err(failed(if conn.buffered().is_empty() {
                    "the connection closed before the answer"
                } else {
                    "the connection closed in the response head"
                }));
            }
            Ok(_) => {}
            Err(e) => return Err(failed(format!("reading the answer: {e}"))),
        }
    }
}

/// The head of a complete response; `None` for an interim (1xx) one.
fn interpret(r: &httparse::Response<'_, '_>) -> Result<Option<Head>, Failed> {
    let status = r.code.unwrap_or(0);
    if !(100..600).contains(&status) {
        return Err(failed(format!("a malformed status {status}")));
    }
    if status < 200 {
        if status == 101 {
            return Err(failed("the upstream switched protocols"));
        }
        return Ok(None);
    }
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut keep_alive = r.version == Some(1);
    let mut idle_timeout = None;
    let mut session = None;
    let mut is_stream = None;
    for h in r.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let v = h.value.trim_ascii();
            let n = std::str::from_utf8(v)
                .ok()
                .filter(|v| !v.is_empty() && v.len() <= 19 && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| failed("an invalid Content-Length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(failed("conflicting Content-Length headers"));
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let v = std::str::from_utf8(h.value).unwrap_or_default();
            let last = v.rsplit(',').next().unwrap_or_default().trim();
            if !last.eq_ignore_ascii_case("chunked") {
                return Err(failed(format!("an unsupported Transfer-Encoding `{}`", v.trim())));
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in std::str::from_utf8(h.value).unwrap_or_default().split(',') {
                let token = token.trim();
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("keep-alive") {
            idle_timeout = keep_alive_timeout(h.value).or(idle_timeout);
        } else if name.eq_ignore_ascii_case("mcp-session-id") {
            // The first valid one, as the hyper path reads it.
            if session.is_none() {
                session = HeaderValue::from_bytes(h.value).ok();
            }
        } else if name.eq_ignore_ascii_case("content-type") && is_stream.is_none() {
            is_stream = Some(
                h.value
                    .trim_ascii_start()
                    .get(..17)
                    .is_some_and(|v| v.eq_ignore_ascii_case(b"text/event-stream")),
            );
        }
    }
    let is_stream = is_stream.unwrap_or(false);
    let framing = if status == 204 || status == 304 {
        Framing::Done
    } else if chunked {
        // A length beside chunked framing is a smuggling attempt or a broken server.
        if length.is_some() {
            return Err(failed("both Content-Length and chunked framing"));
        }
        Framing::Chunked(0)
    } else if let Some(n) = length {
        if n == 0 { Framing::Done } else { Framing::Length(n) }
    } else {
        keep_alive = false;
        Framing::Close
    };
    Ok(Some(Head {
        status,
        session,
        is_stream,
        framing,
        keep_alive,
        idle_timeout,
    }))
}

/// Half of the `timeout=N` of a `Keep-Alive` header, so a connection is retired well before
/// the upstream closes it.
fn keep_alive_timeout(value: &[u8]) -> Option<Duration> {
    let v = std::str::from_utf8(value).ok()?;
    v.split(',').find_map(|p| {
        let (k, n) = p.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("timeout") {
            return None;
        }
        let secs: u64 = n.trim().parse().ok()?;
        Some(Duration::from_millis(secs.min(3600) * 500))
    })
}

impl Response<'_> {
    fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a response has its connection until dropped")
    }

    fn count(&mut self, n: usize) -> Result<(), Failed> {
        self.read += n;
        if self.read > self.limit {
            return Err(failed(format!("an answer over {} bytes", self.limit)));
        }
        Ok(())
    }

    /// Consumes up to `max` of the buffered body bytes, counted against the limit; their
    /// place in the buffer.
    fn take(&mut self, max: u64) -> Result<std::ops::Range<usize>, Failed> {
        let conn = self.conn();
        let n = conn
            .buffered()
            .len()
            .min(usize::try_from(max).unwrap_or(usize::MAX));
        let start = conn.pos;
        conn.pos += n;
        self.count(n)?;
        Ok(start..start + n)
    }

    /// The next piece of the body; `None` once it is complete.
    pub(super) async fn chunk(&mut self) -> Result<Option<&[u8]>, Failed> {
        let range = loop {
            match self.framing {
                Framing::Done => return Ok(None),
                Framing::Length(remaining) | Framing::Chunked(remaining @ 1..) => {
                    if self.conn().buffered().is_empty() {
                        self.fill_body().await?;
                        continue;
                    }
                    let range = self.take(remaining)?;
                    let left = remaining - range.len() as u64;
                    self.framing = match (self.framing, left) {
                        (Framing::Length(_), 0) => Framing::Done,
                        (Framing::Length(_), left) => Framing::Length(left),
                        (_, 0) => Framing::ChunkEnd,
                        (_, left) => Framing::Chunked(left),
                    };
                    break range;
                }
                Framing::Close => {
                    if self.conn().buffered().is_empty() {
                        match self.conn().fill().await {
                            Ok(0) => {
                                self.framing = Framing::Done;
                                return Ok(None);
                            }
                            Ok(_) => continue,
                            Err(e) => return Err(failed(format!("reading the answer: {e}"))),
                        }
                    }
                    break self.take(u64::MAX)?;
                }
                Framing::ChunkEnd => {
                    self.expect_crlf().await?;
                    self.framing = Framing::Chunked(0);
                }
                Framing::Chunked(_) => {
                    let Some(size) = self.chunk_size().await? else {
                        self.trailers().await?;
                        self.framing = Framing::Done;
                        return Ok(None);
                    };
                    // A chunk announced larger than what is left fails before it is read.
                    if size > self.limit.saturating_sub(self.read) as u64 {
                        return Err(failed(format!("an answer over {} bytes", self.limit)));
                    }
                    self.framing = Framing::Chunked(size);
                }
            }
        };
        Ok(Some(&self.conn.as_ref().expect("connection").buf[range]))
    }

    /// Lifts the limit on the body's total size: an event stream is bounded per event by
    /// its reader, and in time by the caller.
    pub(super) fn unlimited(&mut self) {
        self.limit = usize::MAX;
    }

    /// Reads what is left of the body if it has already arrived, without waiting, so that
    /// the connection can be reused (an event stream usually ends right after the answer
    /// the caller was waiting for).
    pub(super) fn finish_now(&mut self) {
        while let Some(Ok(Some(_))) = self.chunk().now_or_never() {}
    }

    /// The whole body (at most the limit). A length-delimited body is read in place.
    pub(super) async fn whole(&mut self) -> Result<&[u8], Failed> {
        if let Framing::Length(n) = self.framing
            && self.read == 0
        {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > self.limit {
                return Err(failed(format!("an answer over {} bytes", self.limit)));
            }
            // What is announced is reserved only up to a point: the rest as it arrives.
            let have = self.conn().buffered().len();
            self.conn().buf.reserve(n.saturating_sub(have).min(MAX_RESERVE));
            while self.conn().buffered().len() < n {
                self.fill_body().await?;
            }
            let conn = self.conn.as_mut().expect("connection");
            let start = conn.pos;
            conn.pos += n;
            self.read = n;
            self.framing = Framing::Done;
            let conn = self.conn.as_ref().expect("connection");
            return Ok(&conn.buf[start..start + n]);
        }
        let mut decoded = std::mem::take(&mut self.decoded);
        decoded.clear();
        while let Some(c) = self.chunk().await? {
            decoded.extend_from_slice(c);
        }
        self.decoded = decoded;
        Ok(&self.decoded)
    }

    /// Reads more of a body that is not complete yet (its end is an error).
    async fn fill_body(&mut self) -> Result<(), Failed> {
        match self.conn().fill().await {
            Ok(0) => Err(failed("the connection closed in the middle of the answer")),
            Ok(_) => Ok(()),
            Err(e) => Err(failed(format!("reading the answer: {e}"))),
        }
    }

    /// Reads one CRLF-terminated line of at most [`MAX_CHUNK_LINE`] bytes, without it.
    async fn line(&mut self) -> Result<std::ops::Range<usize>, Failed> {
        loop {
            let conn = self.conn();
            let buffered = conn.buffered();
            if let Some(i) = buffered.iter().take(MAX_CHUNK_LINE + 2).position(|&b| b == b'\n') {
                if i == 0 || buffered[i - 1] != b'\r' {
                    return Err(failed("a line of the chunked framing not ended by CRLF"));
                }
                let start = conn.pos;
                conn.pos += i + 1;
                return Ok(start..start + i - 1);
            }
            if conn.buffered().len() > MAX_CHUNK_LINE {
                return Err(failed("a chunk line over 1 KiB"));
            }
            self.fill_body().await?;
        }
    }

    /// The next chunk's size; `None` for the last chunk.
    async fn chunk_size(&mut self) -> Result<Option<u64>, Failed> {
        let range = self.line().await?;
        let line = &self.conn().buf[range];
        let digits = line.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(failed("an invalid chunk size"));
        }
        let size = digits.iter().fold(0u64, |n, &d| {
            n * 16 + u64::from(char::from(d).to_digit(16).unwrap_or(0))
        });
        Ok((size > 0).then_some(size))
    }

    async fn expect_crlf(&mut self) -> Result<(), Failed> {
        let range = self.line().await?;
        if range.is_empty() {
            Ok(())
        } else {
            Err(failed("a chunk longer than its size"))
        }
    }

    /// Skips the trailer section after the last chunk (bounded like a head).
    async fn trailers(&mut self) -> Result<(), Failed> {
        let mut bytes = 0;
        loop {
            let range = self.line().await?;
            if range.is_empty() {
                return Ok(());
            }
            bytes += range.len();
            if bytes > MAX_HEAD {
                return Err(failed("trailers over 64 KiB"));
            }
        }
    }
}

impl Drop for Response<'_> {
    /// A connection goes back to the pool only after a complete answer with nothing after it.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.framing == Framing::Done
            && self.keep_alive
            && conn.buffered().is_empty()
        {
            self.pool.put_idle(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    /// A server that answers each request read on a connection with the next of `answers`
    /// (raw bytes), closes the connection after the last, and counts the connections it
    /// accepted.
    async fn serve(answers: Vec<&'static [u8]>) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let answers = Arc::new(Mutex::new(answers.into_iter()));
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let answers = Arc::clone(&answers);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let mut have = Vec::new();
                    loop {
                        let Ok(n) = s.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        have.extend_from_slice(&buf[..n]);
                        // One request: its head, then Content-Length bytes.
                        let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&have[..end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if have.len() < end + 4 + len {
                            continue;
                        }
                        have.drain(..end + 4 + len);
                        let (next, last) = {
                            let mut answers = answers.lock().unwrap();
                            (answers.next(), answers.len() == 0)
                        };
                        let Some(a) = next else { return };
                        // After the last answer the connection is closed.
                        if s.write_all(a).await.is_err() || last {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/mcp"), accepted)
    }

    fn pool(url: &str) -> Pool {
        Pool::for_url(&url.parse().unwrap(), "test").unwrap()
    }

    async fn body(p: &Pool, limit: usize) -> Result<(u16, Vec<u8>), String> {
        let mut r = p.post(b"", b"{}", limit).await?;
        let status = r.status;
        let b = r.whole().await?.to_vec();
        Ok((status, b))
    }

    #[test]
    fn only_plain_http_urls_get_a_pool() {
        assert!(Pool::for_url(&"https://example.com/mcp".parse().unwrap(), "t").is_none());
        let p = pool("http://example.com/mcp?x=1");
        assert_eq!(p.authority, "example.com:80");
        let prefix = String::from_utf8(p.prefix).unwrap();
        assert!(
            prefix.starts_with("POST /mcp?x=1 HTTP/1.1\r\nhost: example.com\r\n"),
            "{prefix}"
        );
        // No path: `/`; the URL's user info never reaches the Host header; a port does.
        let p = pool("http://user:pw@example.com:8080?x=1");
        assert_eq!(p.authority, "example.com:8080");
        let prefix = String::from_utf8(p.prefix).unwrap();
        assert!(
            prefix.starts_with("POST /?x=1 HTTP/1.1\r\nhost: example.com:8080\r\n"),
            "{prefix}"
        );
    }

    #[test]
    fn keep_alive_timeouts_retire_connections_at_half_the_upstreams_time() {
        assert_eq!(
            keep_alive_timeout(b"timeout=5, max=100"),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(keep_alive_timeout(b"max=100"), None);
        assert_eq!(keep_alive_timeout(b"timeout=soon"), None);
        assert_eq!(keep_alive_timeout(b"timeout=99999999999999999999"), None);
    }

    #[tokio::test]
    async fn framings_are_read_and_connections_reused_only_after_complete_answers() {
        let (url, accepted) = serve(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nMcp-Session-Id: abc\r\n\r\n3;ext=1\r\nhel\r\n2\r\nlo\r\n0\r\nx-trailer: 1\r\n\r\n",
            b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: 1\n\n",
        ])
        .await;
        let p = pool(&url);
        assert_eq!(body(&p, 100).await.unwrap(), (200, b"hello".to_vec()));
        {
            let mut r = p.post(b"", b"{}", 100).await.unwrap();
            assert_eq!(r.session.as_ref().map(HeaderValue::as_bytes), Some(&b"abc"[..]));
            assert_eq!(r.whole().await.unwrap(), b"hello");
        }
        assert_eq!(body(&p, 100).await.unwrap(), (202, Vec::new()));
        {
            let mut r = p.post(b"", b"{}", 100).await.unwrap();
            assert!(r.is_stream);
            assert_eq!(r.whole().await.unwrap(), b"data: 1\n\n");
        }
        // The first three answers were complete and kept the connection; the last closed it.
        assert_eq!(accepted.load(Ordering::Relaxed), 1);
        assert_eq!(p.idle.lock().unwrap().len(), 0);
    }

    #[tokio::test]
    async fn hostile_answers_fail_the_request_and_are_never_reused() {
        let cases: [(&'static [u8], &str); 13] = [
            (
                b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n",
                "malformed status",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n",
                "not ended by CRLF",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\n0\r\n\r\n",
                "not ended by CRLF",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
                "invalid Content-Length",
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", "over 50 bytes"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
                "conflicting",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                "both",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                "unsupported",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "invalid chunk size",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n",
                "over 50 bytes",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
                "longer than its size",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
                "closed in the middle",
            ),
        ];
        for (answer, why) in cases {
            let (url, _) = serve(vec![answer]).await;
            let p = pool(&url);
            let err = body(&p, 50).await.unwrap_err();
            assert!(err.contains(why), "{answer:?}: {err}");
            assert_eq!(p.idle.lock().unwrap().len(), 0, "{answer:?}");
        }
    }

    #[tokio::test]
    async fn heads_are_bounded_and_garbage_is_refused() {
        let huge: &'static [u8] = Box::leak(
            [
                &b"HTTP/1.1 200 OK\r\nx: "[..],
                &vec![b'a'; MAX_HEAD][..],
                b"\r\n\r\n",
            ]
            .concat()
            .into_boxed_slice(),
        );
        let many: &'static [u8] = Box::leak(
            [
                &b"HTTP/1.1 200 OK\r\n"[..],
                &b"x: 1\r\n".repeat(MAX_HEADERS + 1)[..],
                b"\r\n",
            ]
            .concat()
            .into_boxed_slice(),
        );
        for (answer, why) in [
            (huge, "over 65536 bytes"),
            (many, "malformed"),
            (&b"SSH-2.0-OpenSSH\r\n\r\n"[..], "malformed"),
            (&b"HTTP/1.1 101 Switching Protocols\r\n\r\n"[..], "switched"),
            (&b"HTTP/1.1 200 OK\r\nContent-"[..], "closed in the response head"),
        ] {
            let (url, _) = serve(vec![answer]).await;
            let err = body(&pool(&url), 1 << 20).await.unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[tokio::test]
    async fn interim_floods_and_endless_chunk_lines_are_cut_off() {
        let flood: &'static [u8] = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM + 1).leak();
        let (url, _) = serve(vec![flood]).await;
        let err = body(&pool(&url), 1 << 20).await.unwrap_err();
        assert!(err.contains("too many interim"), "{err}");
        // Up to the most allowed, interim answers are skipped.
        let some: &'static [u8] = [
            &b"HTTP/1.1 102 Processing\r\n\r\n".repeat(MAX_INTERIM)[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ]
        .concat()
        .leak();
        let (url, _) = serve(vec![some]).await;
        assert_eq!(body(&pool(&url), 10).await.unwrap(), (200, b"ok".to_vec()));
        // A one-byte chunk with an extension that never ends.
        let ext: &'static [u8] = [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;"[..],
            &vec![b'x'; 4 * MAX_CHUNK_LINE][..],
        ]
        .concat()
        .leak();
        let (url, _) = serve(vec![ext]).await;
        let err = body(&pool(&url), 1 << 20).await.unwrap_err();
        assert!(err.contains("chunk line over"), "{err}");
    }

    #[tokio::test]
    async fn a_finished_event_stream_leaves_its_connection_for_the_next_request() {
        let (url, accepted) = serve(vec![
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ])
        .await;
        let p = pool(&url);
        {
            let mut r = p.post(b"", b"{}", 4).await.unwrap();
            assert!(r.is_stream);
            r.unlimited();
            // The event (over the 4-byte limit, lifted for streams), then what is already here.
            assert_eq!(r.chunk().await.unwrap(), Some(&b"data: 1\n\n"[..]));
            r.finish_now();
        }
        assert_eq!(p.idle.lock().unwrap().len(), 1);
        assert_eq!(body(&p, 10).await.unwrap(), (200, b"ok".to_vec()));
        assert_eq!(accepted.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn extra_bytes_after_an_answer_and_closed_idle_connections_are_not_reused() {
        // Bytes after the answer: the connection is not pooled.
        let (url, accepted) = serve(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ])
        .await;
        let p = pool(&url);
        assert_eq!(body(&p, 10).await.unwrap().1, b"ok");
        assert_eq!(body(&p, 10).await.unwrap().1, b"ok");
        assert_eq!(accepted.load(Ordering::Relaxed), 2);

        // A server that closes after each answer (while the connection sits idle): the next
        // request opens a new connection instead of failing.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let closing = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&closing);
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                drop(s);
            }
        });
        let p = pool(&url);
        for _ in 0..3 {
            assert_eq!(body(&p, 10).await.unwrap().1, b"ok");
            // Until the server's close has reached this side (bounded): then the pooled
            // connection is a stale one.
            let deadline = Instant::now() + Duration::from_secs(5);
            while p.idle.lock().unwrap().iter().all(Conn::reusable) {
                assert!(Instant::now() < deadline, "the server's close never arrived");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        assert_eq!(closing.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn bytes_arriving_on_a_fresh_idle_connection_disqualify_it() {
        // A connection put back moments ago is judged by the reactor's view (no syscall):
        // a server that writes to it after its answer (here: a second, unasked answer) must
        // not have it reused, or the next request would read the stale bytes as its answer.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let go = Arc::new(tokio::sync::Notify::new());
        let send_unasked = Arc::clone(&go);
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let first = count.fetch_add(1, Ordering::Relaxed) == 0;
                let send_unasked = Arc::clone(&send_unasked);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await;
                    if first {
                        // Once the answer has been read and the connection pooled.
                        send_unasked.notified().await;
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")
                            .await;
                    }
                    while s.read(&mut buf).await.is_ok_and(|n| n > 0) {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await;
                    }
                });
            }
        });
        let p = pool(&url);
        assert_eq!(body(&p, 10).await.unwrap().1, b"ok");
        assert_eq!(p.idle.lock().unwrap().len(), 1);
        go.notify_one();
        // Until the reactor has seen the unasked bytes (bounded). Usually well within
        // FRESH, so this is the reactor's path; on a slow machine the peek's, same verdict.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            {
                let idle = p.idle.lock().unwrap();
                if idle[0].reactor_saw_something() {
                    assert!(
                        !idle[0].reusable(),
                        "a connection with unread bytes was taken as reusable"
                    );
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the unasked answer never arrived");
            tokio::task::yield_now().await;
        }
        assert_eq!(body(&p, 10).await.unwrap().1, b"ok");
        assert_eq!(
            accepted.load(Ordering::Relaxed),
            2,
            "the stale connection was not replaced"
        );
    }
}

//! A minimal Redis (RESP2) client over tokio, shared by what keeps state in Redis (shared rate
//! limits, tasks): a bounded set of connections, every exchange under one time limit
//! (connecting, the TLS handshake and `AUTH` included), optional TLS ([`super::resp_tls`]), an
//! optional password or ACL user and password (`AUTH`), and replies bounded in size so a
//! misbehaving Redis (or something else on its port) cannot make the server allocate at will.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

pub use super::resp_tls::{Stream, Tls, TlsFiles};

/// Longest reply line read (status, error and length lines).
const MAX_LINE: usize = 4096;

/// Which Redis, and who this client is to it.
#[derive(Clone, Default)]
pub struct Endpoint {
    /// `host:port`.
    pub addr: String,
    /// The ACL user (Redis 6 and later) sent with the password; without it, `AUTH` names
    /// only the password (the `default` user).
    pub username: Option<String>,
    /// Sent with `AUTH` on every new connection.
    pub password: Option<String>,
    /// TLS on every connection, when set.
    pub tls: Option<Arc<Tls>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Endpoint {
    /// A plain-TCP Redis at `addr`, without `AUTH`.
    pub fn plain(addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            ..Self::default()
        }
    }

    /// The `AUTH` command of a new connection, if it needs one.
    pub(crate) fn auth(&self) -> Option<Vec<u8>> {
        let p = self.password.as_ref()?.as_bytes();
        Some(match &self.username {
            Some(u) => command(&[b"AUTH", u.as_bytes(), p]),
            None => command(&[b"AUTH", p]),
        })
    }
}

/// Where Redis is and how it is used.
#[derive(Debug, Clone)]
pub struct Options {
    /// Which Redis, and who this client is to it.
    pub endpoint: Endpoint,
    /// Longest exchange (waiting for a connection, connecting, the TLS handshake and `AUTH`
    /// included).
    pub timeout: Duration,
    /// Connections at most.
    pub max_connections: usize,
    /// Largest bulk reply accepted, in bytes.
    pub max_reply: usize,
}

/// Most elements of an array reply.
pub const MAX_ELEMENTS: usize = 1024;

/// A reply this client understands (arrays of scalars only; nested arrays are refused).
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// `:n`
    Int(i64),
    /// `+text`
    Status(String),
    /// `$n` and n bytes.
    Bulk(Vec<u8>),
    /// `-text`
    Error(String),
    /// `$-1` (and `*-1`)
    Nil,
    /// `*n` and n scalar replies; at most [`MAX_ELEMENTS`], their bulk bytes together within
    /// the size limit of one reply.
    Array(Vec<Reply>),
}

/// A pool of connections to one Redis.
#[derive(Debug)]
pub struct Client {
    opts: Options,
    idle: Mutex<Vec<BufReader<Stream>>>,
    slots: Semaphore,
}

/// A command as RESP: an array of bulk strings.
pub(crate) fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<String> {
    let mut line = Vec::new();
    let n = (&mut *r)
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 || !line.ends_with(b"\r\n") {
        return Err(std::io::Error::other("redis: short or overlong reply line"));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| std::io::Error::other("redis: reply is not UTF-8"))
}

/// Reads one reply: a bulk one of at most `max_reply` bytes, an array of at most
/// [`MAX_ELEMENTS`] scalars whose bulk bytes together are at most `max_reply`.
pub(crate) async fn read_reply<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max_reply: usize,
) -> std::io::Result<Reply> {
    let line = read_line(r).await?;
    if let Some(n) = line.strip_prefix('*') {
        let n: i64 = n
            .parse()
            .map_err(|_| std::io::Error::other("redis: unexpected reply"))?;
        let Ok(n) = usize::try_from(n) else {
            return Ok(Reply::Nil);
        };
        if n > MAX_ELEMENTS {
            return Err(std::io::Error::other("redis: reply over the size limit"));
        }
        let mut items = Vec::with_capacity(n);
        let mut left = max_reply;
        for _ in 0..n {
            let line = read_line(r).await?;
            if line.starts_with('*') {
                return Err(std::io::Error::other("redis: nested arrays are not read"));
            }
            let item = read_scalar(r, &line, left).await?;
            if let Reply::Bulk(b) = &item {
                left -= b.len();
            }
            items.push(item);
        }
        return Ok(Reply::Array(items));
    }
    read_scalar(r, &line, max_reply).await
}

/// The scalar reply whose first line is `line`.
async fn read_scalar<R: AsyncBufRead + Unpin>(
    r: &mut R,
    line: &str,
    max_reply: usize,
) -> std::io::Result<Reply> {
    let (kind, rest) = line.split_at(line.len().min(1));
    let bad = || std::io::Error::other("redis: unexpected reply");
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                return Ok(Reply::Nil);
            }
            let n = usize::try_from(n)
                .ok()
                .filter(|n| *n <= max_reply)
                .ok_or_else(|| std::io::Error::other("redis: reply over the size limit"))?;
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf).await?;
            if !buf.ends_with(b"\r\n") {
                return Err(bad());
            }
            buf.truncate(n);
            Reply::Bulk(buf)
        }
        _ => return Err(bad()),
    })
}

impl Reply {
    /// A status or bulk reply as text.
    pub fn text(self) -> Option<String> {
        match self {
            Self::Status(s) => Some(s),
            Self::Bulk(b) => String::from_utf8(b).ok(),
            _ => None,
        }
    }
}

impl Client {
    /// A client for `opts` (connecting on first use).
    pub fn new(opts: Options) -> Self {
        let slots = Semaphore::new(opts.max_connections.max(1));
        Self {
            opts,
            idle: Mutex::default(),
            slots,
        }
    }

    /// `host:port` of the Redis.
    pub fn addr(&self) -> &str {
        &self.opts.endpoint.addr
    }

    /// Sends `args` and reads the reply, within the time limit. A connection whose exchange
    /// failed is dropped (it may hold half a reply); a good one goes back to the pool.
    ///
    /// # Errors
    /// Connecting, `AUTH`, writing or reading failed, a reply was malformed or too large, or
    /// the time limit passed.
    pub async fn call(&self, args: &[&[u8]]) -> std::io::Result<Reply> {
        tokio::time::timeout(self.opts.timeout, self.exchange(args))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "redis: no answer in time"))?
    }

    /// `EVAL script numkeys keys... args...` through [`call`](Self::call): a Redis error
    /// reply comes back as `Ok(Reply::Error)`, for the caller to name.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn eval(&self, script: &str, keys: &[&[u8]], args: &[&[u8]]) -> std::io::Result<Reply> {
        let n = keys.len().to_string();
        let mut all: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
        all.extend([b"EVAL".as_slice(), script.as_bytes(), n.as_bytes()]);
        all.extend_from_slice(keys);
        all.extend_from_slice(args);
        self.call(&all).await
    }

    async fn exchange(&self, args: &[&[u8]]) -> std::io::Result<Reply> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| std::io::Error::other("redis: closed"))?;
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut c = match idle {
            Some(c) => c,
            None => self.connect().await?,
        };
        let s = c.get_mut();
        s.write_all(&command(args)).await?;
        // TLS holds written records until flushed; on plain TCP this does nothing.
        s.flush().await?;
        let reply = read_reply(&mut c, self.opts.max_reply).await?;
        if let Ok(mut v) = self.idle.lock() {
            v.push(c);
        }
        Ok(reply)
    }

    async fn connect(&self) -> std::io::Result<BufReader<Stream>> {
        let e = &self.opts.endpoint;
        let s = TcpStream::connect(&e.addr).await?;
        s.set_nodelay(true)?;
        let s = match &e.tls {
            None => Stream::Plain(s),
            Some(tls) => tls.connect(s).await?,
        };
        let mut c = BufReader::new(s);
        if let Some(auth) = e.auth() {
            let s = c.get_mut();
            s.write_all(&auth).await?;
            s.flush().await?;
            match read_reply(&mut c, MAX_LINE).await? {
                Reply::Status(_) => {}
                // Never the password; Redis's own words only (WRONGPASS, NOPERM, ...).
                Reply::Error(e) => return Err(std::io::Error::other(format!("redis: AUTH refused: {e}"))),
                _ => return Err(std::io::Error::other("redis: AUTH: unexpected reply")),
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_names_the_acl_user_when_there_is_one_and_debug_hides_the_password() {
        let mut e = Endpoint::plain("r:6379");
        assert_eq!(e.auth(), None, "no password, no AUTH");
        e.password = Some("s3cret-pw".into());
        assert_eq!(e.auth().unwrap(), command(&[b"AUTH", b"s3cret-pw"]));
        e.username = Some("quiver".into());
        assert_eq!(e.auth().unwrap(), command(&[b"AUTH", b"quiver", b"s3cret-pw"]));
        let shown = format!("{e:?}");
        assert!(!shown.contains("s3cret") && shown.contains("quiver"), "{shown}");
    }

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        assert_eq!(
            command(&[b"GET", b"k y"]),
            b"*2\r\n$3\r\nGET\r\n$3\r\nk y\r\n".to_vec()
        );
    }

    #[tokio::test]
    async fn replies_are_read_and_bounded() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(b"+OK\r\n:42\r\n-NOSCRIPT x\r\n$3\r\nabc\r\n$-1\r\n$9\r\n")
                .await
                .unwrap();
            s
        });
        let mut c = BufReader::new(TcpStream::connect(addr).await.unwrap());
        assert_eq!(read_reply(&mut c, 8).await.unwrap(), Reply::Status("OK".into()));
        assert_eq!(read_reply(&mut c, 8).await.unwrap(), Reply::Int(42));
        assert_eq!(
            read_reply(&mut c, 8).await.unwrap(),
            Reply::Error("NOSCRIPT x".into())
        );
        assert_eq!(read_reply(&mut c, 8).await.unwrap(), Reply::Bulk(b"abc".to_vec()));
        assert_eq!(read_reply(&mut c, 8).await.unwrap(), Reply::Nil);
        let e = read_reply(&mut c, 8).await.unwrap_err();
        assert!(e.to_string().contains("over the size limit"), "{e}");
        drop(server);

        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(&vec![b'+'; MAX_LINE + 10]).await.unwrap();
            s
        });
        let mut c = BufReader::new(TcpStream::connect(addr).await.unwrap());
        assert!(
            read_reply(&mut c, 8).await.is_err(),
            "an overlong line is an error"
        );
        drop(server);
    }

    #[tokio::test]
    async fn arrays_of_scalars_are_read_within_one_size_limit() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(b"*3\r\n$2\r\nab\r\n$-1\r\n:7\r\n*-1\r\n*0\r\n")
                .await
                .unwrap();
            // Two bulks of 5 fit 8 one by one but not together; then a nested array; then too many.
            s.write_all(b"*2\r\n$5\r\nabcde\r\n$5\r\nfghij\r\n")
                .await
                .unwrap();
            s
        });
        let mut c = BufReader::new(TcpStream::connect(addr).await.unwrap());
        assert_eq!(
            read_reply(&mut c, 8).await.unwrap(),
            Reply::Array(vec![Reply::Bulk(b"ab".to_vec()), Reply::Nil, Reply::Int(7)])
        );
        assert_eq!(read_reply(&mut c, 8).await.unwrap(), Reply::Nil);
        assert_eq!(read_reply(&mut c, 8).await.unwrap(), Reply::Array(vec![]));
        let e = read_reply(&mut c, 8).await.unwrap_err();
        assert!(e.to_string().contains("over the size limit"), "{e}");
        drop(server);

        for bad in [
            b"*1\r\n*1\r\n:1\r\n".to_vec(),
            format!("*{}\r\n", MAX_ELEMENTS + 1).into_bytes(),
        ] {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (mut s, _) = l.accept().await.unwrap();
                s.write_all(&bad).await.unwrap();
                s
            });
            let mut c = BufReader::new(TcpStream::connect(addr).await.unwrap());
            assert!(read_reply(&mut c, 64).await.is_err());
            drop(server);
        }
    }

    #[tokio::test]
    async fn a_silent_server_is_a_timeout() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(s);
        });
        let c = Client::new(Options {
            endpoint: Endpoint::plain(addr),
            timeout: Duration::from_millis(100),
            max_connections: 1,
            max_reply: 64,
        });
        let e = c.call(&[b"PING"]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        held.abort();
    }
}

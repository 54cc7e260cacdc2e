//! Shared rate limits in Redis: the same GCRA as the local limits, as one Lua script run
//! atomically by Redis (`EVALSHA`), on Redis's clock, so every replica counts against one
//! budget. A minimal RESP2 client over tokio: a bounded set of connections, every exchange
//! under a timeout, an optional password (`AUTH`).
//!
//! When Redis fails (refused, timed out, an error answer), the call is decided by the
//! [`FailMode`], and Redis is not tried again for [`BACKOFF`]: a Redis that is down costs one
//! timeout per backoff period, not one per call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::FailMode;
use crate::config::governance::Rate;
use crate::gov_metrics::GovMetrics;

/// How long Redis is left alone after a failure.
pub const BACKOFF: Duration = Duration::from_secs(1);
/// Longest reply line read (the replies of this client are short).
const MAX_LINE: usize = 4096;

/// The GCRA of [`super::gcra`] in Redis: `KEYS[1]` the budget, `ARGV[1]` the interval and
/// `ARGV[2]` the burst window, in microseconds. Answers 0 when the call is admitted, else
/// the microseconds until it would be.
pub const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local nextt = tat + interval
local ahead = nextt - now
if ahead > tolerance then return ahead - tolerance end
redis.call('SET', KEYS[1], string.format('%d', nextt), 'PX', math.floor(ahead / 1000) + 1)
return 0
";

/// Where the shared limits live and how to treat it.
#[derive(Debug, Clone)]
pub struct Options {
    /// `host:port`.
    pub addr: String,
    /// Part of every key: whose budgets these are (`--limits-redis-prefix`).
    pub prefix: String,
    /// Sent with `AUTH` on every new connection.
    pub password: Option<String>,
    /// Longest exchange (connecting included).
    pub timeout: Duration,
    /// Connections at most.
    pub max_connections: usize,
    /// What a failure means.
    pub fail: FailMode,
}

/// A connection to Redis, shared limits' side.
#[derive(Debug)]
pub struct Shared {
    opts: Options,
    idle: Mutex<Vec<BufReader<TcpStream>>>,
    slots: Semaphore,
    /// The script's SHA-1, as `SCRIPT LOAD` answered it.
    sha: OnceLock<String>,
    /// Until when (milliseconds since `epoch`) Redis is not tried.
    down_until: AtomicU64,
    epoch: Instant,
    metrics: Arc<GovMetrics>,
}

/// A reply this client understands.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Int(i64),
    Text(String),
    Error(String),
    Nil,
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + args.iter().map(|a| a.len()).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

async fn read_line(r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
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

async fn read_reply(r: &mut BufReader<TcpStream>) -> std::io::Result<Reply> {
    let line = read_line(r).await?;
    let (kind, rest) = line.split_at(line.len().min(1));
    let bad = || std::io::Error::other("redis: unexpected reply");
    Ok(match kind {
        "+" => Reply::Text(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                return Ok(Reply::Nil);
            }
            let n = usize::try_from(n)
                .ok()
                .filter(|n| *n <= MAX_LINE)
                .ok_or_else(bad)?;
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf).await?;
            buf.truncate(n);
            Reply::Text(String::from_utf8(buf).map_err(|_| bad())?)
        }
        _ => return Err(bad()),
    })
}

async fn exchange(c: &mut BufReader<TcpStream>, args: &[&[u8]]) -> std::io::Result<Reply> {
    c.get_mut().write_all(&command(args)).await?;
    read_reply(c).await
}

impl Shared {
    /// A client for `opts` (connecting on first use).
    pub fn new(opts: Options, metrics: Arc<GovMetrics>) -> Self {
        let slots = Semaphore::new(opts.max_connections.max(1));
        Self {
            opts,
            idle: Mutex::default(),
            slots,
            sha: OnceLock::new(),
            down_until: AtomicU64::new(0),
            epoch: Instant::now(),
            metrics,
        }
    }

    /// What a failure means.
    pub fn fail_mode(&self) -> FailMode {
        self.opts.fail
    }

    /// Whose budgets these are (part of every key).
    pub fn prefix(&self) -> &str {
        &self.opts.prefix
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs the GCRA of `key` in Redis: `Ok(Ok(()))` admitted, `Ok(Err(retry))` refused,
    /// `Err(())` Redis could not decide (counted; see [`FailMode`]).
    #[allow(clippy::result_unit_err)] // the failure is counted and logged here; callers only branch
    pub async fn gcra(&self, key: &str, rate: Rate) -> Result<Result<(), Duration>, ()> {
        if self.millis() < self.down_until.load(Ordering::Relaxed) {
            self.metrics.shared_failure("backoff");
            return Err(());
        }
        let interval = (rate.interval_ns / 1000).max(1);
        let tolerance = (rate.tolerance_ns() / 1000).max(interval);
        match tokio::time::timeout(self.opts.timeout, self.run(key, interval, tolerance)).await {
            Ok(Ok(0)) => Ok(Ok(())),
            Ok(Ok(us)) => Ok(Err(Duration::from_micros(us.unsigned_abs()))),
            Ok(Err(e)) => {
                self.failed("error", &e.to_string());
                Err(())
            }
            Err(_) => {
                self.failed("timeout", "no answer in time");
                Err(())
            }
        }
    }

    fn failed(&self, kind: &'static str, why: &str) {
        self.metrics.shared_failure(kind);
        let until = self.millis() + u64::try_from(BACKOFF.as_millis()).unwrap_or(1000);
        let was = self.down_until.swap(until, Ordering::Relaxed);
        if was <= self.millis() {
            tracing::warn!(addr = %self.opts.addr, error = %why, fail = ?self.opts.fail, "shared rate limits: Redis failed; not tried again for {}s", BACKOFF.as_secs());
        }
    }

    async fn run(&self, key: &str, interval: u64, tolerance: u64) -> std::io::Result<i64> {
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
        let (i, t) = (interval.to_string(), tolerance.to_string());
        let mut loaded = false;
        let answer = loop {
            let sha = match self.sha.get() {
                Some(s) => s.clone(),
                None => self.load(&mut c).await?,
            };
            match exchange(
                &mut c,
                &[
                    b"EVALSHA",
                    sha.as_bytes(),
                    b"1",
                    key.as_bytes(),
                    i.as_bytes(),
                    t.as_bytes(),
                ],
            )
            .await?
            {
                Reply::Int(n) => break n,
                // A Redis restarted (or flushed) since: load the script again, once.
                Reply::Error(e) if e.starts_with("NOSCRIPT") && !loaded => {
                    self.load(&mut c).await?;
                    loaded = true;
                }
                other => return Err(std::io::Error::other(format!("redis: {other:?}"))),
            }
        };
        if let Ok(mut v) = self.idle.lock() {
            v.push(c);
        }
        Ok(answer)
    }

    async fn load(&self, c: &mut BufReader<TcpStream>) -> std::io::Result<String> {
        match exchange(c, &[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]).await? {
            Reply::Text(sha) if sha.len() == 40 => {
                let _ = self.sha.set(sha.clone());
                Ok(sha)
            }
            other => Err(std::io::Error::other(format!("redis: SCRIPT LOAD: {other:?}"))),
        }
    }

    async fn connect(&self) -> std::io::Result<BufReader<TcpStream>> {
        let s = TcpStream::connect(&self.opts.addr).await?;
        s.set_nodelay(true)?;
        let mut c = BufReader::new(s);
        if let Some(p) = &self.opts.password {
            match exchange(&mut c, &[b"AUTH", p.as_bytes()]).await? {
                Reply::Text(_) => {}
                // Never the password; Redis's own words only.
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
            s.write_all(b"+OK\r\n:42\r\n-NOSCRIPT x\r\n$3\r\nabc\r\n$-1\r\n")
                .await
                .unwrap();
            s.write_all(&vec![b'+'; MAX_LINE + 10]).await.unwrap();
            s
        });
        let mut c = BufReader::new(TcpStream::connect(addr).await.unwrap());
        assert_eq!(read_reply(&mut c).await.unwrap(), Reply::Text("OK".into()));
        assert_eq!(read_reply(&mut c).await.unwrap(), Reply::Int(42));
        assert_eq!(
            read_reply(&mut c).await.unwrap(),
            Reply::Error("NOSCRIPT x".into())
        );
        assert_eq!(read_reply(&mut c).await.unwrap(), Reply::Text("abc".into()));
        assert_eq!(read_reply(&mut c).await.unwrap(), Reply::Nil);
        assert!(read_reply(&mut c).await.is_err(), "an overlong line is an error");
        drop(server);
    }

    #[tokio::test]
    async fn an_unreachable_redis_fails_fast_and_backs_off() {
        // A port nothing listens on.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let m = GovMetrics::unregistered();
        let s = Shared::new(
            Options {
                addr,
                prefix: String::new(),
                password: None,
                timeout: Duration::from_millis(200),
                max_connections: 2,
                fail: FailMode::Open,
            },
            m.clone(),
        );
        let r = Rate {
            interval_ns: 1_000_000,
            burst: 1,
        };
        assert!(s.gcra("k", r).await.is_err());
        assert!(s.gcra("k", r).await.is_err());
        assert_eq!(m.shared_failures("error"), 1);
        assert_eq!(m.shared_failures("backoff"), 1);
    }
}

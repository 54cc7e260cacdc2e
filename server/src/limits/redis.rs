//! Shared rate limits in Redis: the same GCRA as the local limits, as one Lua script run
//! atomically by Redis (`EVALSHA`), on Redis's clock, so every replica counts against one
//! budget, over the [`crate::net::resp`] client.
//!
//! When Redis fails (refused, timed out, an error answer), the call is decided by the
//! [`FailMode`], and Redis is not tried again for [`BACKOFF`]: a Redis that is down costs one
//! timeout per backoff period, not one per call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::FailMode;
use crate::config::governance::Rate;
use crate::metrics::governance::GovMetrics;
use crate::net::resp::{Client, Endpoint, Reply};

/// How long Redis is left alone after a failure.
pub const BACKOFF: Duration = Duration::from_secs(1);
/// Largest reply read (the replies of the script are short).
const MAX_REPLY: usize = 4096;

/// What shared limits need of a Redis ACL user (`ACL SETUSER`): the script is loaded
/// (`SCRIPT LOAD`) and run by its digest (`EVALSHA`), and it calls `TIME`, `GET` and `SET`.
pub const ACL_COMMANDS: &str = "+evalsha +script|load +time +get +set";
/// The keys of shared limits, as an ACL key pattern (whatever the prefix: it is hashed into
/// each key).
pub const ACL_KEYS: &str = "~quiver:rl:*";

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
    /// Which Redis (address, ACL user and password, TLS).
    pub endpoint: Endpoint,
    /// Part of every key: whose budgets these are (`--limits-redis-prefix`).
    pub prefix: String,
    /// Longest exchange (connecting, the TLS handshake and `AUTH` included).
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
    redis: Client,
    /// The script's SHA-1, as `SCRIPT LOAD` answered it.
    sha: OnceLock<String>,
    /// Until when (milliseconds since `epoch`) Redis is not tried.
    down_until: AtomicU64,
    epoch: Instant,
    metrics: Arc<GovMetrics>,
}

impl Shared {
    /// A client for `opts` (connecting on first use).
    pub fn new(opts: Options, metrics: Arc<GovMetrics>) -> Self {
        let redis = Client::new(crate::net::resp::Options {
            endpoint: opts.endpoint.clone(),
            timeout: opts.timeout,
            max_connections: opts.max_connections,
            max_reply: MAX_REPLY,
        });
        Self {
            opts,
            redis,
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
        match self.run(key, interval, tolerance).await {
            Ok(0) => Ok(Ok(())),
            Ok(us) => Ok(Err(Duration::from_micros(us.unsigned_abs()))),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                self.failed("timeout", "no answer in time");
                Err(())
            }
            Err(e) => {
                self.failed("error", &e.to_string());
                Err(())
            }
        }
    }

    fn failed(&self, kind: &'static str, why: &str) {
        self.metrics.shared_failure(kind);
        let until = self.millis() + u64::try_from(BACKOFF.as_millis()).unwrap_or(1000);
        let was = self.down_until.swap(until, Ordering::Relaxed);
        if was <= self.millis() {
            tracing::warn!(addr = %self.opts.endpoint.addr, error = %why, fail = ?self.opts.fail, "shared rate limits: Redis failed; not tried again for {}s", BACKOFF.as_secs());
        }
    }

    async fn run(&self, key: &str, interval: u64, tolerance: u64) -> std::io::Result<i64> {
        let (i, t) = (interval.to_string(), tolerance.to_string());
        let mut loaded = false;
        loop {
            let sha = match self.sha.get() {
                Some(s) => s.clone(),
                None => self.load().await?,
            };
            let args: [&[u8]; 6] = [
                b"EVALSHA",
                sha.as_bytes(),
                b"1",
                key.as_bytes(),
                i.as_bytes(),
                t.as_bytes(),
            ];
            match self.redis.call(&args).await? {
                Reply::Int(n) => return Ok(n),
                // A Redis restarted (or flushed) since: load the script again, once.
                Reply::Error(e) if e.starts_with("NOSCRIPT") && !loaded => {
                    self.load().await?;
                    loaded = true;
                }
                other => return Err(std::io::Error::other(format!("redis: {other:?}"))),
            }
        }
    }

    async fn load(&self) -> std::io::Result<String> {
        match self
            .redis
            .call(&[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()])
            .await?
            .text()
        {
            Some(sha) if sha.len() == 40 => {
                let _ = self.sha.set(sha.clone());
                Ok(sha)
            }
            _ => Err(std::io::Error::other("redis: SCRIPT LOAD: unexpected reply")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_redis_fails_fast_and_backs_off() {
        // A port nothing listens on.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let m = GovMetrics::unregistered();
        let s = Shared::new(
            Options {
                endpoint: Endpoint::plain(addr),
                prefix: String::new(),
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

    #[tokio::test]
    async fn over_tls_an_acl_user_with_the_documented_commands_shares_the_budget_and_failures_count() {
        use crate::net::resp::{Reply, Tls, TlsFiles};
        let r = crate::net::resp_tls::tests::TlsRedis::start().await;
        let mut acl = vec![
            "ACL",
            "SETUSER",
            "limits",
            "on",
            ">limits-pw",
            ACL_KEYS,
            "resetchannels",
            "-@all",
        ];
        acl.extend(ACL_COMMANDS.split_whitespace());
        assert_eq!(r.admin(&acl).await, Reply::Status("OK".into()));
        let shared = |endpoint: Endpoint, timeout: Duration| {
            let m = GovMetrics::unregistered();
            let s = Shared::new(
                Options {
                    endpoint,
                    prefix: "ns/a".into(),
                    timeout,
                    max_connections: 2,
                    fail: FailMode::Open,
                },
                m.clone(),
            );
            (s, m)
        };
        let hourly = Rate {
            interval_ns: 3_600_000_000_000,
            burst: 1,
        };
        let user = Some(("limits", "limits-pw"));
        let ((a, ma), (b, mb)) = (
            shared(r.endpoint("ca.crt", false, user), Duration::from_secs(5)),
            shared(r.endpoint("ca.crt", false, user), Duration::from_secs(5)),
        );
        // One budget for both: the first call is admitted, the other replica's refused.
        assert_eq!(a.gcra("quiver:rl:tls", hourly).await, Ok(Ok(())));
        assert!(matches!(b.gcra("quiver:rl:tls", hourly).await, Ok(Err(_))));
        assert_eq!(ma.shared_failures("error") + mb.shared_failures("error"), 0);

        // Each failure to reach Redis is one the limits already know, counted as such.
        let failing = [
            r.endpoint("other-ca.crt", false, user),
            r.endpoint("ca.crt", false, Some(("limits", "wrong-pw"))),
        ];
        for endpoint in failing {
            let (s, m) = shared(endpoint, Duration::from_secs(5));
            assert_eq!(s.gcra("quiver:rl:tls", hourly).await, Err(()));
            assert_eq!(m.shared_failures("error"), 1);
        }
        // A listener that never answers the handshake: a timeout.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let tls = Tls::load(&addr, &TlsFiles::default()).unwrap();
        let (s, m) = shared(
            Endpoint {
                tls: Some(Arc::new(tls)),
                ..Endpoint::plain(addr)
            },
            Duration::from_millis(200),
        );
        assert_eq!(s.gcra("quiver:rl:tls", hourly).await, Err(()));
        assert_eq!(m.shared_failures("timeout"), 1);
        drop(l);
    }
}

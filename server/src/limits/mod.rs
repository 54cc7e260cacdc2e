//! Rate and concurrency limits on tool calls: GCRA token buckets and in-flight counts per
//! (limit, caller) key, kept in a sharded map of bounded size; optionally the rates counted
//! in Redis, shared by every replica ([`redis`]).
//!
//! A key whose bucket is full again and that has no call in flight is the same as no key:
//! a full shard first forgets those, so an idle caller costs nothing. Should a shard still
//! be full (a flood of callers each with a fresh, non-idle bucket), the key nearest to idle
//! without a call in flight is forgotten, which gives its caller a full bucket back early:
//! memory stays bounded at the price of a little generosity, never of a refusal.

pub mod redis;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use sha2::{Digest, Sha256};

use crate::config::governance::{Limit, Rate};
use crate::metrics::governance::GovMetrics;

/// Shards of the key map (a power of two).
const SHARDS: usize = 64;
/// Keys kept at most by default (about 64 bytes each).
pub use quiver_flags::DEFAULT_MAX_LIMIT_KEYS as DEFAULT_MAX_KEYS;
/// The retry hint of a call refused by a concurrency limit (nothing says when a slot frees).
const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

pub use quiver_flags::FailMode;

/// The network address an anonymous caller is counted by: an IPv4 address, or the /64
/// network of an IPv6 address (what one subscriber is usually given, so rotating addresses
/// inside it gains nothing). An IPv4 client reaching an IPv6 socket (`::ffff:a.b.c.d`) is
/// its IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientAddr(IpAddr);

impl ClientAddr {
    /// The address `ip` is counted by.
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let net = u128::from(v6) & !((1u128 << 64) - 1);
                Self(IpAddr::V6(Ipv6Addr::from(net)))
            }
            v4 => Self(v4),
        }
    }

    /// The 16 bytes that key it (an IPv4 address as its IPv4-mapped IPv6 form).
    fn octets(self) -> [u8; 16] {
        match self.0 {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        }
    }
}

impl std::fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// Who a call is counted against.
#[derive(Debug, Clone, Copy)]
pub enum Who<'a> {
    /// An authenticated caller: its subject.
    Subject(&'a str),
    /// An anonymous caller whose network address is known (over HTTP, with or without a
    /// session): that address. A session id is free to mint; an address is not.
    Address(ClientAddr),
    /// An anonymous caller in a session whose address is not known (stdio): its session id.
    Session(&'a str),
    /// An anonymous caller with neither: every such caller together.
    Anonymous,
}

/// The bytes that name a caller inside its kind.
enum Id<'a> {
    Text(&'a str),
    Addr([u8; 16]),
}

impl Id<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Id::Text(s) => s.as_bytes(),
            Id::Addr(b) => b,
        }
    }
}

impl<'a> Who<'a> {
    fn parts(self) -> (u8, &'static str, Id<'a>) {
        match self {
            Who::Subject(s) => (1, "sub", Id::Text(s)),
            Who::Session(s) => (2, "session", Id::Text(s)),
            Who::Anonymous => (3, "anonymous", Id::Text("")),
            Who::Address(a) => (4, "addr", Id::Addr(a.octets())),
        }
    }
}

/// Why a call was refused.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The limit that refused it.
    pub limit: Arc<Limit>,
    /// `rate`, `concurrency` or `unavailable` (a shared limit while Redis is down, failing
    /// closed).
    pub kind: &'static str,
    /// When a retry may succeed.
    pub retry_after: Duration,
}

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    /// GCRA theoretical arrival time, nanoseconds since the limiter's epoch.
    tat: u64,
    inflight: u32,
}

/// The budgets of every (limit, caller) key.
#[derive(Debug)]
pub struct Limiter {
    shards: Box<[Mutex<FxHashMap<u64, Slot>>]>,
    per_shard: usize,
    hasher: RandomState,
    epoch: Instant,
    shared: Option<redis::Shared>,
    metrics: Arc<GovMetrics>,
}

/// The in-flight places a call holds; given back when dropped (also when the call's future
/// is dropped).
#[derive(Debug)]
pub struct Permits {
    /// Set when `keys` holds any (a call under rate limits alone holds nothing).
    limiter: Option<Arc<Limiter>>,
    keys: Vec<u64>,
}

impl Drop for Permits {
    fn drop(&mut self) {
        let Some(limiter) = &self.limiter else { return };
        for k in &self.keys {
            let mut shard = limiter.shard(*k);
            if let Some(s) = shard.get_mut(k) {
                s.inflight = s.inflight.saturating_sub(1);
            }
        }
    }
}

/// GCRA: admits a call at `now` if the bucket allows, moving its arrival time; else the
/// time until it would.
fn gcra(tat: &mut u64, now: u64, rate: Rate) -> Result<(), Duration> {
    let next = (*tat).max(now).saturating_add(rate.interval_ns);
    let ahead = next - now;
    let tolerance = rate.tolerance_ns();
    if ahead > tolerance {
        return Err(Duration::from_nanos(ahead - tolerance));
    }
    *tat = next;
    Ok(())
}

impl Limiter {
    /// A limiter keeping at most `max_keys` keys, with shared limits in `shared`.
    pub fn new(max_keys: usize, shared: Option<redis::Shared>, metrics: Arc<GovMetrics>) -> Arc<Self> {
        Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: (max_keys / SHARDS).max(16),
            hasher: RandomState::new(),
            epoch: Instant::now(),
            shared,
            metrics,
        })
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, FxHashMap<u64, Slot>> {
        // The high bits pick the shard; the map hashes the whole key again.
        let i = (key >> 58) as usize % SHARDS;
        self.shards[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn key(&self, limit: &Limit, who: Who<'_>) -> u64 {
        let (kind, _, id) = who.parts();
        if limit.per_caller {
            self.hasher
                .hash_one((limit.scope.label(), &*limit.name, &*limit.at, kind, id.bytes()))
        } else {
            self.hasher
                .hash_one((limit.scope.label(), &*limit.name, &*limit.at))
        }
    }

    /// Keys held now, over every shard.
    pub fn keys(&self) -> usize {
        (0..SHARDS).map(|i| self.shard((i as u64) << 58).len()).sum()
    }

    /// Applies `f` to the slot of `key`, making room for it first when it is new.
    fn with_slot<T>(&self, key: u64, now: u64, f: impl FnOnce(&mut Slot) -> T) -> T {
        let mut shard = self.shard(key);
        if !shard.contains_key(&key) && shard.len() >= self.per_shard {
            shard.retain(|_, s| s.inflight > 0 || s.tat > now);
            if shard.len() >= self.per_shard {
                // Only calls in flight hold slots that cannot go; they are bounded by the
                // server's concurrency limit.
                let nearest = shard
                    .iter()
                    .filter(|(_, s)| s.inflight == 0)
                    .min_by_key(|(_, s)| s.tat)
                    .map(|(k, _)| *k);
                if let Some(k) = nearest {
                    shard.remove(&k);
                    self.metrics.limit_key_evicted();
                }
            }
        }
        let slot = shard.entry(key).or_default();
        f(slot)
    }

    /// Admits a call under `limits` (in order) for `who`, or tells which limit refused it.
    /// In-flight places are taken first (and given back if a rate then refuses), rates after.
    ///
    /// # Errors
    /// The first limit that refuses the call.
    pub async fn admit(self: &Arc<Self>, limits: &[Arc<Limit>], who: Who<'_>) -> Result<Permits, Refusal> {
        let mut permits = Permits {
            limiter: None,
            keys: Vec::new(),
        };
        let mut now = self.now();
        for l in limits {
            let Some(max) = l.concurrency else { continue };
            let key = self.key(l, who);
            let taken = self.with_slot(key, now, |s| {
                if s.inflight >= max {
                    false
                } else {
                    s.inflight += 1;
                    true
                }
            });
            if !taken {
                return Err(Refusal {
                    limit: l.clone(),
                    kind: "concurrency",
                    retry_after: CONCURRENCY_RETRY,
                });
            }
            permits.keys.push(key);
            if permits.limiter.is_none() {
                permits.limiter = Some(self.clone());
            }
        }
        for l in limits {
            let Some(rate) = l.rate else { continue };
            let refused = |retry_after, kind| Refusal {
                limit: l.clone(),
                kind,
                retry_after,
            };
            if l.shared
                && let Some(shared) = &self.shared
            {
                match shared.gcra(&shared_key(shared.prefix(), l, who), rate).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(retry)) => return Err(refused(retry, "rate")),
                    Err(()) => {
                        if shared.fail_mode() == FailMode::Closed {
                            return Err(refused(Duration::from_secs(1), "unavailable"));
                        }
                        // Open: this replica's own count of the same limit, as of now
                        // (Redis took a while to fail).
                        now = self.now();
                    }
                }
            }
            let key = self.key(l, who);
            self.with_slot(key, now, |s| gcra(&mut s.tat, now, rate))
                .map_err(|retry| refused(retry, "rate"))?;
        }
        Ok(permits)
    }
}

/// The Redis key of a shared limit's budget: the same on every replica serving the same
/// config under the same `prefix` (whose budgets: the McpServer), never another server's,
/// and never showing the caller.
fn shared_key(prefix: &str, limit: &Limit, who: Who<'_>) -> String {
    let mut h = Sha256::new();
    for part in [prefix, limit.scope.label(), &limit.name, &limit.at] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    if limit.per_caller {
        let (_, kind, id) = who.parts();
        h.update(kind.as_bytes());
        h.update([0]);
        h.update(id.bytes());
    }
    let d = h.finalize();
    let mut key = String::with_capacity(11 + 32);
    key.push_str("quiver:rl:");
    for b in &d[..16] {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::governance::Scope;

    fn limit(rate: Option<(u64, u32)>, concurrency: Option<u32>, per_caller: bool) -> Arc<Limit> {
        Arc::new(Limit {
            scope: Scope::Tool,
            name: "t".into(),
            at: "tools[0].limits[0]".into(),
            rate: rate.map(|(interval_ns, burst)| Rate { interval_ns, burst }),
            concurrency,
            per_caller,
            shared: false,
        })
    }

    fn limiter(max_keys: usize) -> Arc<Limiter> {
        Limiter::new(max_keys, None, GovMetrics::unregistered())
    }

    #[test]
    fn gcra_allows_the_burst_then_one_per_interval() {
        let r = Rate {
            interval_ns: 100,
            burst: 3,
        };
        let mut tat = 0;
        for _ in 0..3 {
            assert!(gcra(&mut tat, 1000, r).is_ok());
        }
        assert_eq!(gcra(&mut tat, 1000, r), Err(Duration::from_nanos(100)));
        assert_eq!(gcra(&mut tat, 1050, r), Err(Duration::from_nanos(50)));
        assert!(gcra(&mut tat, 1100, r).is_ok());
        assert!(gcra(&mut tat, 1100, r).is_err());
        // Idle long enough: the whole burst again, never more.
        for _ in 0..3 {
            assert!(gcra(&mut tat, 10_000, r).is_ok());
        }
        assert!(gcra(&mut tat, 10_000, r).is_err());
    }

    #[tokio::test]
    async fn each_caller_has_its_own_budget_unless_shared_by_all() {
        let l = limiter(1000);
        let per = [limit(Some((60_000_000_000, 1)), None, true)];
        assert!(l.admit(&per, Who::Subject("a")).await.is_ok());
        let r = l.admit(&per, Who::Subject("a")).await.unwrap_err();
        assert_eq!(r.kind, "rate");
        assert!(r.retry_after > Duration::from_secs(59));
        assert!(l.admit(&per, Who::Subject("b")).await.is_ok());
        assert!(
            l.admit(&per, Who::Session("a")).await.is_ok(),
            "a session is not a subject"
        );
        let all = [limit(Some((60_000_000_000, 1)), None, false)];
        assert!(l.admit(&all, Who::Subject("a")).await.is_ok());
        assert!(l.admit(&all, Who::Subject("b")).await.is_err());
    }

    #[tokio::test]
    async fn concurrency_counts_calls_in_flight_until_their_permits_drop() {
        let l = limiter(1000);
        let c = [limit(None, Some(2), true)];
        let a = l.admit(&c, Who::Anonymous).await.unwrap();
        let b = l.admit(&c, Who::Anonymous).await.unwrap();
        let r = l.admit(&c, Who::Anonymous).await.unwrap_err();
        assert_eq!(r.kind, "concurrency");
        drop(a);
        let again = l.admit(&c, Who::Anonymous).await.unwrap();
        drop((b, again));
        // A refused rate gives back the places taken before it.
        let both = [
            limit(None, Some(1), true),
            limit(Some((60_000_000_000, 1)), None, true),
        ];
        let first = l.admit(&both, Who::Subject("x")).await.unwrap();
        drop(first);
        assert_eq!(l.admit(&both, Who::Subject("x")).await.unwrap_err().kind, "rate");
        assert!(
            l.admit(&both, Who::Subject("x"))
                .await
                .is_err_and(|r| r.kind == "rate")
        );
    }

    #[tokio::test]
    async fn rotating_callers_cannot_grow_the_map_past_its_bound() {
        let l = limiter(SHARDS * 16);
        let per = [limit(Some((60_000_000_000, 5)), Some(10), true)];
        for i in 0..50_000 {
            let who = format!("caller-{i}");
            drop(l.admit(&per, Who::Subject(&who)).await.unwrap());
        }
        assert!(l.keys() <= SHARDS * 16, "{} keys", l.keys());
        // Calls in flight keep their keys.
        let held = l.admit(&per, Who::Subject("held")).await.unwrap();
        for i in 0..20_000 {
            let who = format!("other-{i}");
            drop(l.admit(&per, Who::Subject(&who)).await.unwrap());
        }
        // The same place with a cap of one: still taken by the held call, so its key survived.
        let again = l.admit(&[limit(None, Some(1), true)], Who::Subject("held")).await;
        assert_eq!(again.unwrap_err().kind, "concurrency");
        drop(held);
        assert!(
            l.admit(&[limit(None, Some(1), true)], Who::Subject("held"))
                .await
                .is_ok()
        );
        assert!(l.keys() <= SHARDS * 16 + 1, "{} keys", l.keys());
    }

    #[tokio::test]
    async fn anonymous_callers_are_counted_by_address_an_ipv6_one_by_its_64() {
        let of = |s: &str| ClientAddr::of(s.parse().unwrap());
        assert_eq!(of("2001:db8:1:2::1"), of("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(of("2001:db8:1:2::1"), of("2001:db8:1:3::1"));
        assert_eq!(of("::ffff:192.0.2.1"), of("192.0.2.1"));
        assert_ne!(of("192.0.2.1"), of("192.0.2.2"));
        assert_eq!(of("2001:db8:1:2:3:4:5:6").to_string(), "2001:db8:1:2::/64");
        assert_eq!(of("::ffff:192.0.2.1").to_string(), "192.0.2.1");
        let l = limiter(1000);
        let per = [limit(Some((60_000_000_000, 1)), None, true)];
        let a = Who::Address(of("192.0.2.1"));
        assert!(l.admit(&per, a).await.is_ok());
        assert!(l.admit(&per, a).await.is_err());
        assert!(l.admit(&per, Who::Address(of("192.0.2.2"))).await.is_ok());
        // An address is no subject, session or the sessionless crowd, whatever its bytes.
        assert!(l.admit(&per, Who::Anonymous).await.is_ok());
        assert!(l.admit(&per, Who::Subject("192.0.2.1")).await.is_ok());
        let lim = limit(Some((1, 1)), None, true);
        let k = shared_key("ns/a", &lim, a);
        assert_ne!(k, shared_key("ns/a", &lim, Who::Address(of("192.0.2.2"))));
        assert_ne!(k, shared_key("ns/a", &lim, Who::Anonymous));
        assert!(!k.contains("192.0.2.1"));
    }

    #[test]
    fn shared_keys_are_stable_and_hide_the_caller() {
        let per = limit(Some((1, 1)), None, true);
        let k = shared_key("ns/a", &per, Who::Subject("alice"));
        assert_eq!(k, shared_key("ns/a", &per, Who::Subject("alice")));
        assert_ne!(k, shared_key("ns/a", &per, Who::Subject("bob")));
        assert_ne!(k, shared_key("ns/a", &per, Who::Session("alice")));
        assert!(!k.contains("alice") && k.starts_with("quiver:rl:") && k.len() == 42);
        let all = limit(Some((1, 1)), None, false);
        assert_eq!(
            shared_key("ns/a", &all, Who::Subject("a")),
            shared_key("ns/a", &all, Who::Subject("b"))
        );
        // Another McpServer's budget for a limit of the same name and place, in the same Redis.
        assert_ne!(
            shared_key("ns/a", &all, Who::Subject("a")),
            shared_key("ns/b", &all, Who::Subject("a"))
        );
    }
}

//! The `Authorization` values of tokens read from the vault lately, so that a user's next call
//! does not open the sealed token again (an AES-GCM open and a JSON parse of a token of a
//! kilobyte or two): by upstream, then subject, looked up without allocating. An entry lives
//! until its token is no longer usable, and with the vault in Redis at most [`SHARED_TTL`]
//! (another replica may sign the user out meanwhile); this replica's own sign-in, refresh,
//! sign-out and revocation replace or drop it at once, and a change of the key ring drops
//! them all. Bounded: full, it starts over. Like the memory vault's key ring, these values
//! are in the process's memory: whoever reads it reads them.

use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rustc_hash::FxHashMap;

/// Longest an entry is used when the vault is shared by replicas.
pub(super) const SHARED_TTL: Duration = Duration::from_secs(10);
/// Most entries kept.
const MAX_ENTRIES: usize = 16_384;

struct Entry {
    bearer: Bearer,
    until: Instant,
    /// The upstream's URL as configured when the token was checked against it, and the
    /// token's issuer: a reload that moves the upstream or pins another server misses.
    audience: Box<str>,
    issuer: Box<str>,
}

/// What a call of an upstream sends as its user: the `Authorization` value, and the upstream
/// account the token is for when the authorization server named it (for the call's audit
/// record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bearer {
    /// `Bearer TOKEN`.
    pub header: http::HeaderValue,
    /// The upstream account (1-64 of `[A-Za-z0-9._+@-]`), when known.
    pub account: Option<std::sync::Arc<str>>,
}

/// The entries of one upstream, by subject.
type BySubject = FxHashMap<Box<str>, Entry>;

/// The warm `Authorization` values.
#[derive(Default)]
pub(super) struct Warm {
    /// Upstream, then subject.
    map: RwLock<FxHashMap<Box<str>, BySubject>>,
    len: std::sync::atomic::AtomicUsize,
}

impl Warm {
    /// The value kept for `subject` and `upstream`, while it is good and the upstream is
    /// still at `audience` with no other `issuer` pinned.
    pub(super) fn get(
        &self,
        subject: &str,
        upstream: &str,
        audience: &str,
        issuer: Option<&str>,
    ) -> Option<Bearer> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let e = map.get(upstream)?.get(subject)?;
        let same = *e.audience == *audience && issuer.is_none_or(|i| *e.issuer == *i);
        (same && e.until > Instant::now()).then(|| e.bearer.clone())
    }

    /// Keeps `bearer` for `subject` and `upstream` at `audience`, of a token of `issuer`,
    /// until `usable_until` (wall clock: the token's expiry less the refresh margin; `None`:
    /// no expiry), at most `max`.
    pub(super) fn put(
        &self,
        (subject, upstream): (&str, &str),
        (audience, issuer): (&str, &str),
        bearer: &Bearer,
        usable_until: Option<SystemTime>,
        max: Option<Duration>,
    ) {
        let now = Instant::now();
        let mut left = usable_until
            .map(|at| at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
            .unwrap_or(Duration::MAX);
        if let Some(m) = max {
            left = left.min(m);
        }
        let Some(until) = now.checked_add(left.min(Duration::from_secs(86_400))) else {
            return;
        };
        if left.is_zero() {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if self.len.load(std::sync::atomic::Ordering::Relaxed) >= MAX_ENTRIES {
            map.clear();
            self.len.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let entry = Entry {
            bearer: bearer.clone(),
            until,
            audience: audience.into(),
            issuer: issuer.into(),
        };
        let fresh = map
            .entry(upstream.into())
            .or_default()
            .insert(subject.into(), entry)
            .is_none();
        if fresh {
            self.len.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Drops everything (the key ring changed).
    pub(super) fn clear(&self) {
        self.map.write().unwrap_or_else(PoisonError::into_inner).clear();
        self.len.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// Drops what is kept for `subject`: for `upstream`, or for every upstream.
    pub(super) fn forget(&self, subject: &str, upstream: Option<&str>) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let mut gone = 0;
        for (name, subjects) in map.iter_mut() {
            if upstream.is_none_or(|u| u == &**name) && subjects.remove(subject).is_some() {
                gone += 1;
            }
        }
        self.len.fetch_sub(gone, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_live_while_usable_within_the_bound_and_are_forgotten_on_demand() {
        const A: &str = "https://a.example/mcp";
        const AS: &str = "https://as.example";
        let w = Warm::default();
        let h = Bearer {
            header: http::HeaderValue::from_static("Bearer t"),
            account: Some("carol".into()),
        };
        let later = SystemTime::now() + Duration::from_secs(300);
        w.put(("alice", "notes"), (A, AS), &h, Some(later), None);
        w.put(("alice", "wiki"), (A, AS), &h, None, Some(SHARED_TTL));
        w.put(
            ("bob", "notes"),
            (A, AS),
            &h,
            Some(SystemTime::now() - Duration::from_secs(1)),
            None,
        );
        assert_eq!(w.get("alice", "notes", A, None), Some(h.clone()));
        assert_eq!(w.get("alice", "notes", A, Some(AS)), Some(h.clone()));
        assert_eq!(w.get("alice", "wiki", A, None), Some(h.clone()));
        assert_eq!(w.get("bob", "notes", A, None), None, "not usable: not kept");
        assert_eq!(w.get("carol", "notes", A, None), None);
        // The upstream moved, or another server is pinned: not this token.
        assert_eq!(w.get("alice", "notes", "https://b.example/mcp", None), None);
        assert_eq!(w.get("alice", "notes", A, Some("https://evil.example")), None);
        w.forget("alice", Some("notes"));
        assert_eq!(w.get("alice", "notes", A, None), None);
        assert_eq!(w.get("alice", "wiki", A, None), Some(h.clone()));
        w.forget("alice", None);
        assert_eq!(w.get("alice", "wiki", A, None), None);
        for i in 0..MAX_ENTRIES + 5 {
            w.put((&format!("u{i}"), "notes"), (A, AS), &h, None, None);
        }
        assert!(w.len.load(std::sync::atomic::Ordering::Relaxed) <= MAX_ENTRIES);
    }
}

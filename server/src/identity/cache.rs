//! The bounded cache of exchanged tokens: one entry per (subject token, audience, scopes) digest,
//! used until shortly before the token expires. Concurrent misses of one key wait for one
//! exchange; a failed exchange is remembered for a moment, so a burst of calls of one caller
//! makes one request to the issuer, not one each. The number of entries is capped: a full
//! cache first drops what expired, then entries no call is using.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::HeaderValue;
use rustc_hash::FxHashMap;

/// A cache key: a digest of which subject token, for what audience, with which scopes.
pub type Key = [u8; 32];

/// How long a failed exchange is answered from the cache.
pub const FAILURE_TTL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    token: Option<(HeaderValue, Instant)>,
    failed: Option<(String, Instant)>,
}

#[derive(Debug, Default)]
struct Slot {
    state: tokio::sync::Mutex<State>,
}

/// Exchanged tokens by key, at most `max` entries (plus those calls hold at the moment).
#[derive(Debug)]
pub struct Cache {
    slots: Mutex<FxHashMap<Key, Arc<Slot>>>,
    max: usize,
}

impl Cache {
    /// An empty cache of at most `max` entries.
    pub fn new(max: usize) -> Self {
        Self {
            slots: Mutex::default(),
            max: max.max(1),
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn slot(&self, key: &Key) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = slots.get(key) {
            return Arc::clone(s);
        }
        if slots.len() >= self.max {
            let now = Instant::now();
            // Expired, failed or never filled, and not in use by a call: gone first.
            slots.retain(|_, s| {
                Arc::strong_count(s) > 1
                    || s.state.try_lock().map_or(true, |st| {
                        st.token.as_ref().is_some_and(|(_, until)| *until > now)
                    })
            });
            // Still full of live tokens: drop unused ones (a later call exchanges again).
            if slots.len() >= self.max {
                let target = self.max - self.max / 4;
                let drop: Vec<Key> = slots
                    .iter()
                    .filter(|(_, s)| Arc::strong_count(s) == 1)
                    .map(|(k, _)| *k)
                    .take(slots.len().saturating_sub(target))
                    .collect();
                for k in drop {
                    slots.remove(&k);
                }
            }
        }
        Arc::clone(slots.entry(*key).or_default())
    }

    /// The token of `key`: the cached one while it is valid, else what `fetch` gets (with
    /// how long it may be used), which is then cached.
    ///
    /// # Errors
    /// What `fetch` failed with, also for the calls that waited for it or come within
    /// [`FAILURE_TTL`].
    pub async fn get_or_fetch<F>(&self, key: &Key, fetch: F) -> Result<HeaderValue, String>
    where
        F: Future<Output = Result<(HeaderValue, Duration), String>>,
    {
        let slot = self.slot(key);
        let mut st = slot.state.lock().await;
        let now = Instant::now();
        if let Some((t, until)) = &st.token
            && *until > now
        {
            return Ok(t.clone());
        }
        if let Some((e, at)) = &st.failed
            && now.duration_since(*at) < FAILURE_TTL
        {
            return Err(e.clone());
        }
        match fetch.await {
            Ok((token, valid)) => {
                st.failed = None;
                // A lifetime too long for the clock to add is as good as a day.
                let now = Instant::now();
                let until = now
                    .checked_add(valid)
                    .unwrap_or_else(|| now + Duration::from_secs(86_400));
                st.token = Some((token.clone(), until));
                Ok(token)
            }
            Err(e) => {
                st.token = None;
                st.failed = Some((e.clone(), Instant::now()));
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn key(n: u32) -> Key {
        let mut k = [0; 32];
        k[..4].copy_from_slice(&n.to_le_bytes());
        k
    }

    fn tok(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[tokio::test]
    async fn concurrent_misses_of_one_key_make_one_fetch() {
        let cache = Cache::new(16);
        let fetches = AtomicUsize::new(0);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok((tok("Bearer a"), Duration::from_secs(60)))
        };
        let k = key(1);
        let all = futures_util::future::join_all((0..20).map(|_| cache.get_or_fetch(&k, fetch()))).await;
        assert!(all.iter().all(|r| r.as_ref().unwrap() == "Bearer a"));
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        // Another key is another exchange.
        cache.get_or_fetch(&key(2), fetch()).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_expired_token_is_fetched_again_and_a_failure_is_not_cached_long() {
        let cache = Cache::new(16);
        let short = async { Ok((tok("Bearer old"), Duration::ZERO)) };
        cache.get_or_fetch(&key(1), short).await.unwrap();
        let fresh = async { Ok((tok("Bearer new"), Duration::from_secs(60))) };
        assert_eq!(cache.get_or_fetch(&key(1), fresh).await.unwrap(), "Bearer new");
        let fail = async { Err::<(HeaderValue, Duration), _>("refused".to_owned()) };
        assert_eq!(cache.get_or_fetch(&key(3), fail).await, Err("refused".to_owned()));
        // Within the failure's moment the issuer is not asked again.
        let unused = async { panic!("fetched within FAILURE_TTL") };
        assert_eq!(
            cache.get_or_fetch(&key(3), unused).await,
            Err("refused".to_owned())
        );
    }

    #[tokio::test]
    async fn the_number_of_entries_stays_bounded() {
        let cache = Cache::new(64);
        for n in 0..10_000 {
            let ok = async { Ok((tok("Bearer x"), Duration::from_secs(60))) };
            cache.get_or_fetch(&key(n), ok).await.unwrap();
            assert!(cache.len() <= 64, "{} entries after {n}", cache.len());
        }
        // Expired entries go before live ones.
        let cache = Cache::new(4);
        for n in 0..3 {
            let gone = async { Ok((tok("Bearer x"), Duration::ZERO)) };
            cache.get_or_fetch(&key(n), gone).await.unwrap();
        }
        let live = async { Ok((tok("Bearer live"), Duration::from_secs(60))) };
        cache.get_or_fetch(&key(100), live).await.unwrap();
        let more = async { Ok((tok("Bearer y"), Duration::from_secs(60))) };
        cache.get_or_fetch(&key(101), more).await.unwrap();
        let unused = async { panic!("the live entry was dropped") };
        assert_eq!(
            cache.get_or_fetch(&key(100), unused).await.unwrap(),
            "Bearer live"
        );
    }
}

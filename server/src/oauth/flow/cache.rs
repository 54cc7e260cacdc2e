//! The flow's memory: a small map with a bound and a time to live per entry, and one lock
//! per key for work that should not run twice at once (registering at one server).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Most entries each cache keeps (upstreams and authorization servers of one server).
pub(super) const MAX_ENTRIES: usize = 256;

/// `now + ttl`, saturating at a distant point (a huge configured time to live).
pub(super) fn later(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl)
        .unwrap_or_else(|| now + Duration::from_secs(10 * 365 * 86_400))
}

/// Values by key, each until its deadline; full, the entry nearest its deadline goes.
#[derive(Debug)]
pub(super) struct Cache<V> {
    max: usize,
    ttl: Duration,
    map: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> Cache<V> {
    pub(super) fn new(max: usize, ttl: Duration) -> Self {
        Self {
            max: max.max(1),
            ttl,
            map: Mutex::default(),
        }
    }

    /// The value of `key`, unless absent or expired.
    pub(super) fn get(&self, key: &str) -> Option<V> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(key) {
            Some((deadline, v)) if *deadline > Instant::now() => Some(v.clone()),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for the cache's time to live.
    pub(super) fn put(&self, key: String, value: V) {
        self.put_for(key, value, self.ttl);
    }

    /// Keeps `value` for `ttl` (at most the cache's).
    pub(super) fn put_for(&self, key: String, value: V, ttl: Duration) {
        let now = Instant::now();
        let deadline = later(now, ttl.min(self.ttl));
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.max && !map.contains_key(&key) {
            map.retain(|_, (d, _)| *d > now);
            if map.len() >= self.max
                && let Some(first) = map.iter().min_by_key(|(_, (d, _))| *d).map(|(k, _)| k.clone())
            {
                map.remove(&first);
            }
        }
        map.insert(key, (deadline, value));
    }

    /// Forgets `key`.
    pub(super) fn remove(&self, key: &str) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// One async lock per key, kept while someone holds or waits for it.
#[derive(Debug, Default)]
pub(super) struct Locks {
    map: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl Locks {
    /// The lock of `key` (the same one for everyone asking while it lives).
    pub(super) fn of(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lock) = map.get(key).and_then(Weak::upgrade) {
            return lock;
        }
        if map.len() >= MAX_ENTRIES {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key.to_owned(), Arc::downgrade(&lock));
        lock
    }
}

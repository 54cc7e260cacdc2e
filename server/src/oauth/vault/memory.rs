//! The vault in this process's memory (one replica): sealed tokens by user, then upstream;
//! past the bound of users the least recently used user is forgotten whole. Entries past
//! their time read as absent. Counts what it holds in `quiver_oauth_vault_tokens`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::{Loaded, Options, Slot, StoreError, slot_id};
use crate::metrics::oauth::OAuthMetrics;

#[derive(Debug)]
struct Held {
    sealed: String,
    until: Instant,
}

#[derive(Debug, Default)]
struct User {
    /// When it was last read or written (a tick of [`Inner::clock`]).
    used: u64,
    slots: FxHashMap<[u8; 32], Held>,
}

#[derive(Debug, Default)]
struct Inner {
    users: FxHashMap<[u8; 32], User>,
    clock: u64,
}

/// Sealed tokens in memory.
#[derive(Debug)]
pub(super) struct Memory {
    inner: Mutex<Inner>,
    metrics: Arc<OAuthMetrics>,
}

impl Memory {
    pub(super) fn new(metrics: Arc<OAuthMetrics>) -> Self {
        Self {
            inner: Mutex::default(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops what expired in `user`'s slots; answers how many.
    fn expire(user: &mut User, now: Instant) -> usize {
        let before = user.slots.len();
        user.slots.retain(|_, h| h.until > now);
        before - user.slots.len()
    }

    fn forget(&self, n: usize) {
        self.metrics
            .vault_tokens_add(-i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(super) fn load(&self, slot: &Slot) -> Loaded {
        let mut g = self.lock();
        g.clock += 1;
        let tick = g.clock;
        let Some(user) = g.users.get_mut(&slot.user) else {
            return Loaded::Absent;
        };
        user.used = tick;
        let now = Instant::now();
        match user.slots.get(&slot.upstream) {
            Some(h) if h.until > now => Loaded::Sealed(h.sealed.clone().into_bytes()),
            Some(_) => {
                user.slots.remove(&slot.upstream);
                let empty = user.slots.is_empty();
                if empty {
                    g.users.remove(&slot.user);
                }
                drop(g);
                self.forget(1);
                Loaded::Absent
            }
            None => Loaded::Absent,
        }
    }

    /// Keeps `sealed` in `slot`; with `expected`, only if the slot still holds those bytes.
    pub(super) fn store(
        &self,
        slot: &Slot,
        sealed: String,
        (ttl, expected): (Duration, Option<&[u8]>),
        opts: &Options,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let until = now
            .checked_add(ttl)
            .unwrap_or_else(|| now + Duration::from_secs(86_400));
        let mut g = self.lock();
        if let Some(old) = expected {
            let holds = g
                .users
                .get(&slot.user)
                .and_then(|u| u.slots.get(&slot.upstream))
                .is_some_and(|h| h.until > now && h.sealed.as_bytes() == old);
            if !holds {
                return Err(StoreError::Changed);
            }
        }
        g.clock += 1;
        let tick = g.clock;
        let mut gone = 0;
        if !g.users.contains_key(&slot.user) && g.users.len() >= opts.max_users {
            // The least recently used user goes whole.
            if let Some(lru) = g.users.iter().min_by_key(|(_, u)| u.used).map(|(k, _)| *k) {
                gone += g.users.remove(&lru).map_or(0, |u| u.slots.len());
                tracing::info!(
                    max_users = opts.max_users,
                    "oauth vault: the least recently used user's upstream tokens were forgotten for a new user"
                );
            }
        }
        let user = g.users.entry(slot.user).or_default();
        user.used = tick;
        gone += Self::expire(user, now);
        let new = !user.slots.contains_key(&slot.upstream);
        if new && user.slots.len() >= opts.max_per_user {
            drop(g);
            self.forget(gone);
            return Err(StoreError::TooManyUpstreams);
        }
        user.slots.insert(slot.upstream, Held { sealed, until });
        drop(g);
        self.forget(gone);
        if new {
            self.metrics.vault_tokens_add(1);
        }
        Ok(())
    }

    /// Sets `new` where `old` still is; whether it did.
    pub(super) fn replace(&self, slot: &Slot, old: &[u8], new: &[u8]) -> bool {
        let mut g = self.lock();
        let Some(h) = g
            .users
            .get_mut(&slot.user)
            .and_then(|u| u.slots.get_mut(&slot.upstream))
            .filter(|h| h.sealed.as_bytes() == old)
        else {
            return false;
        };
        h.sealed = String::from_utf8_lossy(new).into_owned();
        true
    }

    /// Deletes the slot if it still holds `old`; whether it did.
    pub(super) fn discard(&self, slot: &Slot, old: &[u8]) -> bool {
        let mut g = self.lock();
        let Some(user) = g.users.get_mut(&slot.user) else {
            return false;
        };
        if user
            .slots
            .get(&slot.upstream)
            .is_none_or(|h| h.sealed.as_bytes() != old)
        {
            return false;
        }
        user.slots.remove(&slot.upstream);
        if user.slots.is_empty() {
            g.users.remove(&slot.user);
        }
        drop(g);
        self.forget(1);
        true
    }

    pub(super) fn remove(&self, slot: &Slot) -> Option<Vec<u8>> {
        let mut g = self.lock();
        let user = g.users.get_mut(&slot.user)?;
        let held = user.slots.remove(&slot.upstream)?;
        if user.slots.is_empty() {
            g.users.remove(&slot.user);
        }
        drop(g);
        self.forget(1);
        Some(held.sealed.into_bytes())
    }

    /// Removes every slot of `user`: each one's id (under `base`) and sealed bytes.
    pub(super) fn remove_user(&self, user: &[u8; 32], base: &str) -> Vec<(String, Vec<u8>)> {
        let removed = self.lock().users.remove(user);
        let Some(u) = removed else { return Vec::new() };
        self.forget(u.slots.len());
        let now = Instant::now();
        u.slots
            .into_iter()
            .filter(|(_, h)| h.until > now)
            .map(|(up, h)| (slot_id(base, &up, user), h.sealed.into_bytes()))
            .collect()
    }

    pub(super) fn count(&self, user: &[u8; 32]) -> usize {
        let now = Instant::now();
        self.lock()
            .users
            .get(user)
            .map_or(0, |u| u.slots.values().filter(|h| h.until > now).count())
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        let held: usize = self.lock().users.values().map(|u| u.slots.len()).sum();
        self.forget(held);
    }
}

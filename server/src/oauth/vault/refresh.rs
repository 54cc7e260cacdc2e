//! [`Vault::refresh_once`]: one refresh per slot at a time. In this process, the first
//! caller leads and the others wait for its result (success or failure alike); across
//! replicas, the leader takes the slot's Redis lock before it refreshes, and a replica that
//! finds the lock taken re-reads the vault until the holder's new tokens are there (or the
//! lock is free again).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rustc_hash::FxHashMap;
use tokio::sync::watch;

use super::{Slot, Store, TokenSet, Vault, VaultError, usable};

/// How often a replica waiting for another's refresh looks at the vault again.
const LOCK_POLL: Duration = Duration::from_millis(50);
/// Longest failure reason kept from a refresh function.
const MAX_REASON: usize = 256;
/// How many times a caller whose leader went away (its call was cancelled) starts over.
const MAX_ROUNDS: usize = 8;

/// How a refresh function failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefreshFailure {
    /// The authorization server refused the refresh token (`invalid_grant`: expired,
    /// revoked, rotated) or the client (`invalid_client`): the tokens are forgotten and the
    /// user signs in again.
    InvalidGrant(String),
    /// Anything else (unreachable, timed out, a server error): the tokens are kept and the
    /// refresh tried again later.
    Other(String),
}

/// Why [`Vault::refresh_once`] answered no usable tokens. Names the upstream, never the
/// subject or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefreshError {
    /// Nothing to refresh: no tokens, or no refresh token (forgotten now).
    #[error("no usable authorization for upstream {upstream}: sign in again")]
    SignIn {
        /// The upstream.
        upstream: String,
    },
    /// The authorization server refused the refresh token; the tokens were forgotten.
    #[error("the authorization server of upstream {upstream} refused the refresh ({reason}): sign in again")]
    Revoked {
        /// The upstream.
        upstream: String,
        /// What the refresh function said (at most 256 bytes).
        reason: String,
    },
    /// The refresh failed or timed out; the tokens are kept.
    #[error("the token for upstream {upstream} could not be refreshed ({reason}); try again")]
    Failed {
        /// The upstream.
        upstream: String,
        /// What the refresh function said (at most 256 bytes).
        reason: String,
    },
    /// Another replica held the refresh lock all the while and wrote no new tokens.
    #[error("another replica is refreshing the token for upstream {upstream}; try again")]
    Busy {
        /// The upstream.
        upstream: String,
    },
    /// The vault failed.
    #[error(transparent)]
    Vault(#[from] VaultError),
}

type Outcome = Result<TokenSet, RefreshError>;

/// A refresh in flight: its number, and where its outcome goes.
type Flight = (u64, watch::Sender<Option<Outcome>>);

/// The refreshes in flight in this process, by slot id.
#[derive(Debug, Default)]
pub(super) struct Flights {
    map: Mutex<FxHashMap<String, Flight>>,
    next: AtomicU64,
    /// Times a refresh found another replica's lock and waited (tests look at it).
    lock_waits: AtomicU64,
}

enum Role<'a> {
    Lead(Lead<'a>),
    Follow(watch::Receiver<Option<Outcome>>),
}

/// The leader's place in [`Flights`]: gone when dropped (its followers then start over).
struct Lead<'a> {
    flights: &'a Flights,
    key: String,
    id: u64,
}

impl Flights {
    fn join(&self, key: &str) -> Role<'_> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, tx)) = map.get(key) {
            return Role::Follow(tx.subscribe());
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        map.insert(key.to_owned(), (id, watch::channel(None).0));
        Role::Lead(Lead {
            flights: self,
            key: key.to_owned(),
            id,
        })
    }

    /// Callers waiting for the refresh of slot `key` now.
    #[cfg(test)]
    pub(super) fn waiting(&self, key: &str) -> usize {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key).map_or(0, |(_, tx)| tx.receiver_count())
    }

    /// Times a refresh waited for another replica's lock.
    #[cfg(test)]
    pub(super) fn lock_waits(&self) -> u64 {
        self.lock_waits.load(Ordering::Relaxed)
    }
}

impl Lead<'_> {
    /// Gives `outcome` to the callers waiting, then (dropped) leaves the map.
    fn finish(self, outcome: &Outcome) {
        let map = self.flights.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((id, tx)) = map.get(&self.key)
            && *id == self.id
        {
            tx.send_replace(Some(outcome.clone()));
        }
        drop(map);
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut map = self.flights.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            map.remove(&self.key);
        }
    }
}

fn bounded(mut reason: String) -> String {
    if reason.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    reason
}

/// A lock owner no other process or refresh uses.
fn owner() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 16];
    if SystemRandom::new().fill(&mut b).is_ok() {
        return super::hex(&b);
    }
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

impl Vault {
    /// Refreshes what `subject` holds for `upstream` with `f`, unless it is usable (another
    /// call refreshed it meanwhile): when it is within [`super::Options::skew`] of its
    /// expiry, or its access token is `rejected` (the upstream refused that token). `f` gets
    /// the tokens held and answers new ones; an answer without a refresh token keeps the old
    /// one. `f` runs at most once per slot at a time in this process (concurrent callers
    /// share its result) and, with Redis, across replicas; it is cancelled after
    /// [`super::Options::refresh_timeout`]. Its failure reasons are shown to callers: they
    /// must not hold a token.
    ///
    /// # Errors
    /// See [`RefreshError`].
    pub async fn refresh_once<F, Fut>(
        &self,
        subject: &str,
        upstream: &str,
        rejected: Option<&str>,
        f: F,
    ) -> Result<TokenSet, RefreshError>
    where
        F: FnOnce(TokenSet) -> Fut,
        Fut: Future<Output = Result<TokenSet, RefreshFailure>>,
    {
        self.refresh_once_dropping(subject, upstream, rejected, f, drop)
            .await
    }

    /// [`refresh_once`](Self::refresh_once), handing `dropped` the tokens `f` answered when
    /// they are not kept: the slot was emptied (a sign-out, a revocation) or holds another
    /// sign-in's tokens by the time they would be written. Nothing else holds them then, so
    /// the caller revokes them. Tokens that share an access or refresh token with what the
    /// slot holds, or a slot that still holds the tokens refreshed (sealed anew meanwhile),
    /// are not handed over. Called at most once, by the caller that ran `f`.
    ///
    /// # Errors
    /// See [`RefreshError`].
    pub async fn refresh_once_dropping<F, Fut, D>(
        &self,
        subject: &str,
        upstream: &str,
        rejected: Option<&str>,
        f: F,
        dropped: D,
    ) -> Result<TokenSet, RefreshError>
    where
        F: FnOnce(TokenSet) -> Fut,
        Fut: Future<Output = Result<TokenSet, RefreshFailure>>,
        D: FnOnce(TokenSet),
    {
        let slot = self.slot(subject, upstream);
        for _ in 0..MAX_ROUNDS {
            match self.flights.join(&slot.id) {
                Role::Lead(lead) => {
                    let outcome = self.lead(&slot, upstream, rejected, f, dropped).await;
                    lead.finish(&outcome);
                    return outcome;
                }
                Role::Follow(mut rx) => {
                    if let Ok(v) = rx.wait_for(Option::is_some).await
                        && let Some(outcome) = v.as_ref()
                    {
                        return outcome.clone();
                    }
                    // The leader's call was cancelled before it finished: start over.
                }
            }
        }
        Err(RefreshError::Busy {
            upstream: upstream.to_owned(),
        })
    }

    fn needs_refresh(&self, t: &TokenSet, rejected: Option<&str>) -> bool {
        !usable(t, SystemTime::now(), self.opts.skew) || rejected.is_some_and(|r| r == t.access_token)
    }

    async fn lead<F, Fut, D>(
        &self,
        slot: &Slot,
        upstream: &str,
        rejected: Option<&str>,
        f: F,
        dropped: D,
    ) -> Outcome
    where
        F: FnOnce(TokenSet) -> Fut,
        Fut: Future<Output = Result<TokenSet, RefreshFailure>>,
        D: FnOnce(TokenSet),
    {
        let owner = owner();
        let hold = self.opts.refresh_timeout + Duration::from_secs(5);
        let deadline = Instant::now() + hold + LOCK_POLL;
        loop {
            let current = self
                .read(slot, upstream)
                .await?
                .ok_or_else(|| sign_in(upstream))?;
            if !self.needs_refresh(&current, rejected) {
                return Ok(current);
            }
            let redis = match &self.store {
                Store::Memory(_) => None,
                Store::Redis(r) => Some(r),
            };
            let locked = match redis {
                None => true,
                Some(r) => r
                    .lock(slot, &owner, hold)
                    .await
                    .map_err(|e| self.unavailable(upstream, e))?,
            };
            if locked {
                let outcome = self.refresh_locked(slot, upstream, rejected, f, dropped).await;
                if let Some(r) = redis
                    && let Err(e) = r.unlock(slot, &owner).await
                {
                    // The lock expires on its own.
                    self.unavailable(upstream, e);
                }
                return outcome;
            }
            if Instant::now() >= deadline {
                return Err(RefreshError::Busy {
                    upstream: upstream.to_owned(),
                });
            }
            self.flights.lock_waits.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(LOCK_POLL).await;
        }
    }

    /// The refresh itself, under the slot's lock: what is held is read again (another
    /// replica may have refreshed it since it was last read). Every write and delete is a
    /// compare-and-set against the bytes read: a sign-out, a revocation or a newer sign-in
    /// meanwhile is never undone.
    async fn refresh_locked<F, Fut, D>(
        &self,
        slot: &Slot,
        upstream: &str,
        rejected: Option<&str>,
        f: F,
        dropped: D,
    ) -> Outcome
    where
        F: FnOnce(TokenSet) -> Fut,
        Fut: Future<Output = Result<TokenSet, RefreshFailure>>,
        D: FnOnce(TokenSet),
    {
        let held = self
            .read_held(slot, upstream)
            .await?
            .ok_or_else(|| sign_in(upstream))?;
        let current = &held.tokens;
        if !self.needs_refresh(current, rejected) {
            return Ok(held.tokens);
        }
        if current.refresh_token.is_none() {
            self.forget(slot, upstream, &held).await?;
            return Err(sign_in(upstream));
        }
        let failed = |reason: String| RefreshError::Failed {
            upstream: upstream.to_owned(),
            reason: bounded(reason),
        };
        match tokio::time::timeout(self.opts.refresh_timeout, f(current.clone())).await {
            Err(_) => Err(failed("no answer in time".into())),
            Ok(Err(RefreshFailure::Other(reason))) => Err(failed(reason)),
            Ok(Err(RefreshFailure::InvalidGrant(reason))) => {
                self.forget(slot, upstream, &held).await?;
                Err(RefreshError::Revoked {
                    upstream: upstream.to_owned(),
                    reason: bounded(reason),
                })
            }
            Ok(Ok(new)) => {
                let new = new.refreshed_from(current);
                if self.write(slot, upstream, &new, Some(&held.sealed)).await? {
                    return Ok(new);
                }
                // Signed out, revoked or signed in again while the refresh ran: what is
                // held now stands, and the refreshed tokens are dropped (handed over to be
                // revoked when nothing held shares them).
                let now = self.read(slot, upstream).await?;
                if now.as_ref().is_none_or(|t| unrelated(t, current, &new)) {
                    dropped(new);
                }
                match now {
                    Some(t) if usable(&t, SystemTime::now(), self.opts.skew) => Ok(t),
                    _ => Err(sign_in(upstream)),
                }
            }
        }
    }

    /// Drops `held` from `slot`, unless the slot changed since it was read.
    async fn forget(&self, slot: &Slot, upstream: &str, held: &super::Held) -> Result<(), VaultError> {
        self.store
            .discard(slot, &held.sealed)
            .await
            .map(drop)
            .map_err(|e| self.unavailable(upstream, e))
    }
}

/// Whether `held` (what the slot holds after a refresh's write was refused) has nothing to
/// do with the tokens `refreshed` that were refreshed into `new`: not those tokens sealed
/// anew, and no access or refresh token in common with `new` (a server that keeps the refresh
/// token on a refresh answers the same one).
fn unrelated(held: &TokenSet, refreshed: &TokenSet, new: &TokenSet) -> bool {
    held.access_token != refreshed.access_token
        && held.access_token != new.access_token
        && (held.refresh_token.is_none() || held.refresh_token != new.refresh_token)
}

fn sign_in(upstream: &str) -> RefreshError {
    RefreshError::SignIn {
        upstream: upstream.to_owned(),
    }
}

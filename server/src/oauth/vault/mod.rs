//! The token vault: what each caller holds for each upstream (see [`super`]).
//!
//! # Design
//!
//! A slot is one (subject, upstream) pair: `subject` is the caller's validated identity
//! (`issuer|sub` of its client-facing token), `upstream` the upstream's name in the ToolSet.
//! A slot's id is `quiver:oauth:v1:{prefix-hash}:{upstream-hash}:{subject-hash}`, each hash
//! the SHA-256 of the name in hex (the prefix is [`Options::namespace`]), so no name is ever
//! stored in clear; in Redis the id is the key. Every other Redis key of the vault starts
//! with `quiver:oauth:v1:{prefix-hash}:` too, so servers with different prefixes sharing a
//! Redis never see, count or remove each other's users, and an ACL key pattern per prefix
//! ([`acl_keys`]) keeps them apart.
//!
//! A [`TokenSet`] is kept sealed: its JSON sealed by the [`KeyRing`] (AES-256-GCM, a fresh
//! nonce per write) with the slot id as additional data. Reading opens it; bytes sealed
//! under an older key of the ring are re-sealed under the current one on read (compare and
//! set: a newer write is never overwritten); bytes that do not open (altered, moved from
//! another slot, sealed under a key that left the ring) read as absent and are deleted, and
//! the user signs in again.
//!
//! Two stores: memory (one replica; whole users evicted least recently used past
//! [`Options::max_users`]) and Redis over [`crate::net::resp`] (every replica; each change
//! one Lua script, a sorted set per subject indexing its slots, one of all subjects,
//! scored by expiry: new users past the bound are refused). A token is kept as long as it can
//! be refreshed, at most [`Options::max_ttl`]; without a refresh token, until it expires.
//! Everything read or written is bounded: fields, the sealed size, tokens per user, users.
//!
//! [`Vault::refresh_once`] refreshes a slot once at a time: in-process, concurrent callers
//! share one result; across replicas, the one that takes a short Redis lock refreshes and the
//! others wait for its result. What it writes or deletes is a compare-and-set against the
//! bytes it read, so a sign-out, a revocation or a newer sign-in meanwhile stands.
//!
//! # Threat model
//!
//! - Read access to Redis gives nothing usable: sealed bytes, hashed names, how many
//!   upstreams each hashed subject holds tokens for, and until when. Without the key ring's
//!   Secret no token can be opened, nor a subject or upstream named except by guessing it
//!   and hashing the guess.
//! - Write access to Redis can deny service: delete tokens (users sign in again), fill the
//!   set of subjects (new users are refused), hold a refresh lock (refreshes wait, then
//!   fail). It can put back an older value a slot held before (an earlier token of the same
//!   user for the same upstream; a rotated refresh token the authorization server then
//!   refuses). It cannot forge a token, change one, or move one to another user's or another
//!   upstream's slot: those do not open, are deleted and counted
//!   (`quiver_oauth_vault_errors_total{reason="forged"}`). Values over the size bound are
//!   deleted unread.
//! - The memory store keeps tokens sealed too; the key ring is in the same process, so
//!   whoever reads the process's memory reads the tokens.
//! - Nothing of a token reaches logs, errors, `Debug` or metric labels; errors name the
//!   upstream, never the subject.

mod memory;
mod redis;
mod refresh;
mod token;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

pub use self::redis::{ACL_COMMANDS, RedisOptions, acl_keys};
pub use refresh::{RefreshError, RefreshFailure};
pub use token::{FieldBounds, TokenSet, usable};

use super::keyring::{KeyRing, OpenError};
use crate::metrics::oauth::OAuthMetrics;

/// The start of every slot id and Redis key of the vault, before the prefix's hash.
pub const KEY_PREFIX: &str = "quiver:oauth:v1:";

/// The SHA-256 of a vault prefix ([`Options::namespace`]) in hex: the part of every key
/// that tells whose it is.
pub fn prefix_hash(prefix: &str) -> String {
    hex(&Sha256::digest(prefix.as_bytes()))
}

/// The start of every key of prefix `prefix`: `quiver:oauth:v1:{prefix-hash}:`.
fn key_base(prefix: &str) -> String {
    format!("{KEY_PREFIX}{}:", prefix_hash(prefix))
}

/// How the vault is bounded and timed. `Default` gives the documented defaults.
#[derive(Debug, Clone)]
pub struct Options {
    /// Whose tokens these are, when several servers share one Redis: its SHA-256 is part of
    /// every key (empty is a prefix too).
    pub namespace: String,
    /// Users (subjects) holding tokens, at most. Memory: the least recently used user is
    /// forgotten whole for a new one; Redis: a new user is refused. Default 10,000.
    pub max_users: usize,
    /// Upstreams one user holds tokens for, at most (1 to 512); one more is refused. Default 32.
    pub max_per_user: usize,
    /// Largest sealed [`TokenSet`], in bytes (up to 256 KiB); larger is refused, and
    /// larger bytes read from Redis are deleted. Default 32 KiB.
    pub max_sealed: usize,
    /// Longest fields.
    pub fields: FieldBounds,
    /// Longest a token is kept (a refresh token's lifetime is not told). Default 90 days.
    pub max_ttl: Duration,
    /// A token within this of its expiry is refreshed rather than sent. Default 60 s.
    pub skew: Duration,
    /// Longest refresh (the refresh function is cancelled after it); the Redis lock of a
    /// refresh is held at most this plus 5 s. Default 10 s.
    pub refresh_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            namespace: String::new(),
            max_users: 10_000,
            max_per_user: 32,
            max_sealed: 32 * 1024,
            fields: FieldBounds::default(),
            max_ttl: Duration::from_secs(90 * 86_400),
            skew: Duration::from_secs(60),
            refresh_timeout: Duration::from_secs(10),
        }
    }
}

/// Where the tokens live.
#[derive(Debug, Clone)]
pub enum Backend {
    /// This process's memory: one replica.
    Memory,
    /// A Redis every replica reaches.
    Redis(RedisOptions),
}

/// Why the vault did not do what was asked. Names the upstream, never the subject or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VaultError {
    /// Redis failed or did not answer in time.
    #[error("the token vault is unavailable for upstream {upstream} ({reason}); try again")]
    Unavailable {
        /// The upstream.
        upstream: String,
        /// What failed (Redis's words, never a value).
        reason: String,
    },
    /// A field of the tokens over its bound, or empty where one is required.
    #[error(
        "the tokens of upstream {upstream} were refused: {field} is {len} bytes (at most {max}, not empty)"
    )]
    BadField {
        /// The upstream.
        upstream: String,
        /// The field's name.
        field: &'static str,
        /// Its length.
        len: usize,
        /// Its bound.
        max: usize,
    },
    /// The sealed tokens are over [`Options::max_sealed`].
    #[error("the tokens of upstream {upstream} were refused: {size} bytes sealed, at most {max}")]
    TooLarge {
        /// The upstream.
        upstream: String,
        /// Their sealed size.
        size: usize,
        /// The bound.
        max: usize,
    },
    /// A new user over [`Options::max_users`] (Redis).
    #[error(
        "the token vault holds tokens of {max} users, its bound: sign-in for upstream {upstream} refused"
    )]
    TooManyUsers {
        /// The upstream.
        upstream: String,
        /// The bound.
        max: usize,
    },
    /// One upstream more than [`Options::max_per_user`] for this user.
    #[error("this user holds tokens for {max} upstreams, the bound: sign-in for upstream {upstream} refused")]
    TooManyUpstreams {
        /// The upstream.
        upstream: String,
        /// The bound.
        max: usize,
    },
    /// The system's random source failed (nothing was sealed).
    #[error("the tokens of upstream {upstream} could not be sealed")]
    Seal {
        /// The upstream.
        upstream: String,
    },
}

/// One slot: its subject's and upstream's hashes and its id (the Redis key and the sealing's
/// additional data).
#[derive(Debug, Clone)]
struct Slot {
    user: [u8; 32],
    upstream: [u8; 32],
    id: String,
}

fn hex(d: &[u8]) -> String {
    use std::fmt::Write;
    d.iter().fold(String::with_capacity(2 * d.len()), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The id of the slot of `user` and `upstream` hashes, under `base` ([`key_base`]).
fn slot_id(base: &str, upstream: &[u8; 32], user: &[u8; 32]) -> String {
    format!("{base}{}:{}", hex(upstream), hex(user))
}

/// What a slot held when it was read: its tokens, and its sealed bytes (so that it is
/// changed only if nothing changed it since). `Debug` shows no token.
pub struct Held {
    /// The tokens.
    pub tokens: TokenSet,
    sealed: Vec<u8>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

/// What a store holds in a slot.
enum Loaded {
    Absent,
    /// Over the size bound: deleted unread.
    TooLarge,
    Sealed(Vec<u8>),
}

/// Why a store did not keep a value.
enum StoreError {
    Io(String),
    TooManyUsers,
    TooManyUpstreams,
    /// The slot no longer holds the bytes a compare-and-set expected.
    Changed,
}

enum Store {
    Memory(memory::Memory),
    Redis(Box<redis::RedisStore>),
}

/// The tokens each user holds for each upstream, sealed, in memory or Redis, bounded.
pub struct Vault {
    ring: ArcSwap<KeyRing>,
    /// `quiver:oauth:v1:{prefix-hash}:`.
    base: String,
    store: Store,
    opts: Options,
    metrics: Arc<OAuthMetrics>,
    flights: refresh::Flights,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.store {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        };
        f.debug_struct("Vault")
            .field("backend", &backend)
            .field("ring", &*self.ring.load_full())
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl Vault {
    /// A vault sealing with `ring`, in `backend`, within `opts` (bounds clamped to their
    /// documented ranges), counting into `metrics`.
    pub fn new(ring: Arc<KeyRing>, backend: Backend, mut opts: Options, metrics: Arc<OAuthMetrics>) -> Self {
        opts.max_users = opts.max_users.max(1);
        opts.max_per_user = opts.max_per_user.clamp(1, 512);
        opts.max_sealed = opts.max_sealed.clamp(256, 256 * 1024);
        let base = key_base(&opts.namespace);
        let store = match backend {
            Backend::Memory => Store::Memory(memory::Memory::new(metrics.clone())),
            Backend::Redis(r) => Store::Redis(Box::new(redis::RedisStore::new(r, &opts, &base))),
        };
        Self {
            ring: ArcSwap::new(ring),
            base,
            store,
            opts,
            metrics,
            flights: refresh::Flights::default(),
        }
    }

    /// Seals with `ring` from now on (a Secret changed): tokens under a key it keeps are
    /// re-sealed as they are read; those under a key it dropped read as absent.
    pub fn set_ring(&self, ring: Arc<KeyRing>) {
        self.ring.store(ring);
    }

    /// The bounds and times in force.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    fn slot(&self, subject: &str, upstream: &str) -> Slot {
        let user: [u8; 32] = Sha256::digest(subject.as_bytes()).into();
        let upstream: [u8; 32] = Sha256::digest(upstream.as_bytes()).into();
        let id = slot_id(&self.base, &upstream, &user);
        Slot { user, upstream, id }
    }

    /// Whether `t` can be sent now (see [`usable`], with [`Options::skew`]).
    pub fn usable(&self, t: &TokenSet) -> bool {
        usable(t, SystemTime::now(), self.opts.skew)
    }

    fn unavailable(&self, upstream: &str, reason: String) -> VaultError {
        self.metrics.vault_error("redis");
        VaultError::Unavailable {
            upstream: upstream.to_owned(),
            reason,
        }
    }

    /// The tokens `subject` holds for `upstream`, if any. Tokens sealed under an older key
    /// are re-sealed under the current one; tokens that do not open are deleted (counted)
    /// and read as absent.
    ///
    /// # Errors
    /// [`VaultError::Unavailable`]: Redis failed.
    pub async fn get(&self, subject: &str, upstream: &str) -> Result<Option<TokenSet>, VaultError> {
        Ok(self.held(subject, upstream).await?.map(|h| h.tokens))
    }

    /// As [`get`](Self::get), with what the slot holds, so that it can be dropped only if
    /// nothing changed it since ([`discard`](Self::discard)).
    ///
    /// # Errors
    /// [`VaultError::Unavailable`]: Redis failed.
    pub async fn held(&self, subject: &str, upstream: &str) -> Result<Option<Held>, VaultError> {
        let slot = self.slot(subject, upstream);
        self.read_held(&slot, upstream).await
    }

    /// Forgets what `subject` holds for `upstream` if it is still `held` (a sign-in or a
    /// refresh since is kept); whether it was forgotten.
    ///
    /// # Errors
    /// [`VaultError::Unavailable`]: Redis failed.
    pub async fn discard(&self, subject: &str, upstream: &str, held: &Held) -> Result<bool, VaultError> {
        let slot = self.slot(subject, upstream);
        self.store
            .discard(&slot, &held.sealed)
            .await
            .map_err(|e| self.unavailable(upstream, e))
    }

    async fn read(&self, slot: &Slot, upstream: &str) -> Result<Option<TokenSet>, VaultError> {
        Ok(self.read_held(slot, upstream).await?.map(|h| h.tokens))
    }

    async fn read_held(&self, slot: &Slot, upstream: &str) -> Result<Option<Held>, VaultError> {
        let sealed = match self.store.load(slot).await {
            Ok(Loaded::Sealed(b)) => b,
            Ok(Loaded::Absent) => return Ok(None),
            Ok(Loaded::TooLarge) => {
                self.metrics.vault_error("too_large");
                tracing::warn!(
                    upstream,
                    "oauth vault: a stored token over the size bound was deleted unread"
                );
                return Ok(None);
            }
            Err(e) => return Err(self.unavailable(upstream, e)),
        };
        let ring = self.ring.load_full();
        let opened = std::str::from_utf8(&sealed)
            .map_err(|_| OpenError::Malformed)
            .and_then(|s| ring.open(slot.id.as_bytes(), s))
            .and_then(|(plain, stale)| {
                let t = serde_json::from_slice::<TokenSet>(&plain).map_err(|_| OpenError::Malformed)?;
                Ok((t, stale))
            });
        match opened {
            Ok((t, stale)) => {
                let sealed = match stale {
                    true => self.reseal(slot, upstream, &ring, sealed, &t).await,
                    false => sealed,
                };
                Ok(Some(Held { tokens: t, sealed }))
            }
            Err(e) => {
                let reason = if e == OpenError::UnknownKey {
                    "unknown_key"
                } else {
                    "forged"
                };
                self.metrics.vault_error(reason);
                tracing::warn!(
                    upstream,
                    reason,
                    "oauth vault: a stored token did not open and was deleted; the user signs in again"
                );
                if let Err(e) = self.store.discard(slot, &sealed).await {
                    self.unavailable(upstream, e);
                }
                Ok(None)
            }
        }
    }

    /// Writes `t`, read sealed under an older key, under the current one, unless the slot
    /// changed since it was read; answers what the slot holds now, as far as this call knows.
    /// A failure leaves the old bytes (read again next time).
    async fn reseal(
        &self,
        slot: &Slot,
        upstream: &str,
        ring: &KeyRing,
        old: Vec<u8>,
        t: &TokenSet,
    ) -> Vec<u8> {
        let Ok(json) = serde_json::to_vec(t) else {
            return old;
        };
        let Ok(new) = ring.seal(slot.id.as_bytes(), &json) else {
            return old;
        };
        if new.len() > self.opts.max_sealed {
            return old;
        }
        match self.store.replace(slot, &old, new.as_bytes()).await {
            Ok(true) => new.into_bytes(),
            Ok(false) => old,
            Err(e) => {
                self.unavailable(upstream, e);
                old
            }
        }
    }

    fn seal(&self, slot: &Slot, upstream: &str, t: &TokenSet) -> Result<String, VaultError> {
        if let Err(b) = t.check(self.opts.fields) {
            self.metrics.vault_error("too_large");
            return Err(VaultError::BadField {
                upstream: upstream.to_owned(),
                field: b.field,
                len: b.len,
                max: b.max,
            });
        }
        let failed = || VaultError::Seal {
            upstream: upstream.to_owned(),
        };
        let json = serde_json::to_vec(t).map_err(|_| failed())?;
        let sealed = self
            .ring
            .load()
            .seal(slot.id.as_bytes(), &json)
            .map_err(|_| failed())?;
        if sealed.len() > self.opts.max_sealed {
            self.metrics.vault_error("too_large");
            return Err(VaultError::TooLarge {
                upstream: upstream.to_owned(),
                size: sealed.len(),
                max: self.opts.max_sealed,
            });
        }
        Ok(sealed)
    }

    /// Keeps `t` as what `subject` holds for `upstream`, replacing what it held, for as long
    /// as it can be used (see [`Options::max_ttl`]).
    ///
    /// # Errors
    /// A field or the sealed whole over its bound, one user or upstream over the bound
    /// (counted), Redis failed.
    pub async fn put(&self, subject: &str, upstream: &str, t: &TokenSet) -> Result<(), VaultError> {
        let slot = self.slot(subject, upstream);
        self.write(&slot, upstream, t, None).await.map(drop)
    }

    /// Keeps `t` in `slot`; with `expected`, only if the slot still holds those bytes (a
    /// refresh does not undo a sign-out, a revocation or a newer sign-in): `Ok(false)` if it
    /// no longer does.
    async fn write(
        &self,
        slot: &Slot,
        upstream: &str,
        t: &TokenSet,
        expected: Option<&[u8]>,
    ) -> Result<bool, VaultError> {
        let sealed = self.seal(slot, upstream, t)?;
        let ttl = t.keep_for(SystemTime::now(), self.opts.max_ttl);
        let bound = |e: VaultError| {
            self.metrics.vault_error("over_bound");
            e
        };
        match self.store.store(slot, sealed, (ttl, expected), &self.opts).await {
            Ok(()) => Ok(true),
            Err(StoreError::Changed) => Ok(false),
            Err(StoreError::Io(e)) => Err(self.unavailable(upstream, e)),
            Err(StoreError::TooManyUsers) => Err(bound(VaultError::TooManyUsers {
                upstream: upstream.to_owned(),
                max: self.opts.max_users,
            })),
            Err(StoreError::TooManyUpstreams) => Err(bound(VaultError::TooManyUpstreams {
                upstream: upstream.to_owned(),
                max: self.opts.max_per_user,
            })),
        }
    }

    /// Forgets what `subject` holds for `upstream` (sign-out), and answers it, if it
    /// opened, so that the caller can revoke it at its authorization server.
    ///
    /// # Errors
    /// [`VaultError::Unavailable`]: Redis failed.
    pub async fn remove(&self, subject: &str, upstream: &str) -> Result<Option<TokenSet>, VaultError> {
        let slot = self.slot(subject, upstream);
        match self.store.remove(&slot).await {
            Ok(Some(sealed)) => Ok(self.open_quietly(&slot.id, &sealed)),
            Ok(None) => Ok(None),
            Err(e) => Err(self.unavailable(upstream, e)),
        }
    }

    /// Forgets everything `subject` holds (an administrator revoking a user everywhere), and
    /// answers the tokens that opened, so that the caller can revoke them.
    ///
    /// # Errors
    /// [`VaultError::Unavailable`]: Redis failed (named `*`: every upstream).
    pub async fn remove_subject(&self, subject: &str) -> Result<Vec<TokenSet>, VaultError> {
        let user: [u8; 32] = Sha256::digest(subject.as_bytes()).into();
        match self.store.remove_user(&user, &self.opts).await {
            Ok(all) => Ok(all
                .iter()
                .filter_map(|(id, sealed)| self.open_quietly(id, sealed))
                .collect()),
            Err(e) => Err(self.unavailable("*", e)),
        }
    }

    /// How many upstreams `subject` holds tokens for.
    ///
    /// # Errors
    /// [`VaultError::Unavailable`]: Redis failed (named `*`).
    pub async fn count(&self, subject: &str) -> Result<usize, VaultError> {
        let user: [u8; 32] = Sha256::digest(subject.as_bytes()).into();
        self.store
            .count(&user)
            .await
            .map_err(|e| self.unavailable("*", e))
    }

    /// Marks a sign-in state (or link) of `nonce` used for `ttl` where every replica sees it:
    /// `Some(true)` the first time, `Some(false)` after (and when Redis fails: a state that
    /// cannot be marked is not used). `None` when the vault is in memory: the caller keeps
    /// used states itself, in this replica.
    pub async fn mark_used(&self, nonce: &str, ttl: Duration) -> Option<bool> {
        let Store::Redis(r) = &self.store else {
            return None;
        };
        let hash = hex(&Sha256::digest(nonce.as_bytes()));
        Some(match r.first_use(&hash, ttl).await {
            Ok(fresh) => fresh,
            Err(e) => {
                self.unavailable("*", e);
                false
            }
        })
    }

    fn open_quietly(&self, id: &str, sealed: &[u8]) -> Option<TokenSet> {
        let s = std::str::from_utf8(sealed).ok()?;
        let (plain, _) = self.ring.load().open(id.as_bytes(), s).ok()?;
        serde_json::from_slice(&plain).ok()
    }
}

impl Store {
    async fn load(&self, slot: &Slot) -> Result<Loaded, String> {
        match self {
            Self::Memory(m) => Ok(m.load(slot)),
            Self::Redis(r) => r.load(slot).await,
        }
    }

    async fn store(
        &self,
        slot: &Slot,
        sealed: String,
        at: (Duration, Option<&[u8]>),
        opts: &Options,
    ) -> Result<(), StoreError> {
        match self {
            Self::Memory(m) => m.store(slot, sealed, at, opts),
            Self::Redis(r) => r.store(slot, &sealed, at, opts).await,
        }
    }

    /// Sets `new` where `old` still is; whether it did.
    async fn replace(&self, slot: &Slot, old: &[u8], new: &[u8]) -> Result<bool, String> {
        match self {
            Self::Memory(m) => Ok(m.replace(slot, old, new)),
            Self::Redis(r) => r.replace(slot, old, new).await,
        }
    }

    /// Drops the slot if it still holds `old`; whether it did.
    async fn discard(&self, slot: &Slot, old: &[u8]) -> Result<bool, String> {
        match self {
            Self::Memory(m) => Ok(m.discard(slot, old)),
            Self::Redis(r) => r.discard(slot, old).await,
        }
    }

    async fn remove(&self, slot: &Slot) -> Result<Option<Vec<u8>>, String> {
        match self {
            Self::Memory(m) => Ok(m.remove(slot)),
            Self::Redis(r) => r.remove(slot).await,
        }
    }

    async fn remove_user(&self, user: &[u8; 32], opts: &Options) -> Result<Vec<(String, Vec<u8>)>, String> {
        match self {
            Self::Memory(m) => Ok(m.remove_user(user, &key_base(&opts.namespace))),
            Self::Redis(r) => r.remove_user(user, opts).await,
        }
    }

    async fn count(&self, user: &[u8; 32]) -> Result<usize, String> {
        match self {
            Self::Memory(m) => Ok(m.count(user)),
            Self::Redis(r) => r.count(user).await,
        }
    }
}

#[cfg(test)]
mod tests;

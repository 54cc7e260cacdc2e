//! What the server remembers about a session: what its client can do (sampling,
//! elicitation), the logging level it asked for, and the resources it subscribed to.
//!
//! A session id is the server's: [`mint`] draws it at `initialize` and binds it to the caller
//! (`NONCE.OWNER`, 128 random bits and a digest of the caller's identity), so any replica can
//! tell, without shared state, whether a request's caller is the one the id was issued to
//! ([`owned_by`]); the transport answers any other id as an unknown session.
//!
//! Everything here is bounded: at most [`MAX_SESSIONS`] sessions are remembered, at most
//! [`MAX_SESSIONS_PER_CALLER`] of one authenticated caller (its own oldest is forgotten
//! first, so one caller cannot push out everyone else's), and a session holds at most
//! [`MAX_SUBSCRIPTIONS`] subscriptions. A session this server never saw initialize (another
//! replica did, or the server restarted) gets default state on first use: nothing known
//! about its client, level `info`.

use std::collections::VecDeque;
use std::sync::{LazyLock, Mutex};

use rustc_hash::{FxHashMap, FxHashSet};
use sha2::{Digest, Sha256};

/// Sessions remembered at once.
pub const MAX_SESSIONS: usize = 65_536;
/// Sessions of one authenticated caller remembered at once (callers without credentials
/// cannot be told apart: together they may hold all [`MAX_SESSIONS`]).
pub const MAX_SESSIONS_PER_CALLER: usize = 4_096;
/// Resource subscriptions one session may hold.
pub const MAX_SUBSCRIPTIONS: usize = 1_024;
/// Resource subscriptions of all sessions together (a reload compares each one's contents).
pub const MAX_TOTAL_SUBSCRIPTIONS: usize = 65_536;
/// Longest subscribed URI, in bytes.
pub const MAX_URI_BYTES: usize = 4_096;

pub use crate::config::LogLevel;

/// What a client declared it can do in `initialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientCaps {
    /// `capabilities.sampling`: it answers `sampling/createMessage`.
    pub sampling: bool,
    /// `capabilities.elicitation` (form mode): it answers `elicitation/create`.
    pub elicitation: bool,
    /// `capabilities.elicitation.url` (2025-11-25): it opens URLs the server names, so a call
    /// may answer `URLElicitationRequired` (`-32042`), e.g. to send the user to sign in.
    pub elicitation_url: bool,
    /// `capabilities.roots`: it answers `roots/list`.
    pub roots: bool,
    /// `capabilities.extensions["io.modelcontextprotocol/tasks"]`: it polls tasks, so a
    /// tool that opted in may answer it with a task.
    pub tasks: bool,
    /// It negotiated protocol 2025-11-25, whose core has tasks (`params.task`, `tasks/list`,
    /// `tasks/result`).
    pub core_tasks: bool,
}

#[derive(Debug, Default)]
struct State {
    /// `None` when this server did not see the session's `initialize`.
    caps: Option<ClientCaps>,
    /// Its place in [`Table::order`].
    seq: u64,
    level: LogLevel,
    subscriptions: FxHashSet<Box<str>>,
}

/// The digest of an owner in session ids (32 hex digits).
fn owner_tag(subject: &str) -> String {
    let d = Sha256::new()
        .chain_update(b"quiver session owner\0")
        .chain_update(subject.as_bytes())
        .finalize();
    hex(&d[..16])
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The owner part of callers without an identity (no client authentication).
static ANONYMOUS: LazyLock<String> = LazyLock::new(|| owner_tag(""));

/// A new session id for the caller whose [`crate::spec::access::Principal::subject`] is
/// `subject` (empty: not authenticated).
pub fn mint(subject: &str) -> String {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // Unreachable on Linux; a time-derived nonce still differs per call.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b = t.to_le_bytes();
    }
    format!("{}.{}", hex(&b), owner_tag(subject))
}

/// The key of [`tag`], drawn at random once per process.
static TAG_KEY: LazyLock<std::hash::RandomState> = LazyLock::new(std::hash::RandomState::new);

/// What spans and audit records carry for a session instead of its id: on Streamable HTTP
/// a session id is a bearer capability, so it never leaves the server. The tag is a keyed
/// hash (SipHash, 16 hex digits; stdio's session stays `stdio`) under a key drawn at random
/// once per process (cheap enough for every audit record): the same session has the same
/// tag in one replica's traces and audit records, and without the key a tag can neither be
/// turned back into an id nor computed from a guessed one.
pub fn tag(id: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    if id == "stdio" {
        return id.to_owned();
    }
    let mut h = TAG_KEY.build_hasher();
    h.write(id.as_bytes());
    format!("{:016x}", h.finish())
}

/// Whether `id` is a session id [`mint`] issued to the caller `subject`: any other id
/// (another caller's, or one a client made up) is an unknown session.
pub fn owned_by(id: &str, subject: &str) -> bool {
    let Some((nonce, owner)) = id.split_once('.') else {
        return false;
    };
    nonce.len() == 32
        && nonce.bytes().all(|b| b.is_ascii_hexdigit())
        && (if subject.is_empty() {
            owner == ANONYMOUS.as_str()
        } else {
            owner == owner_tag(subject)
        })
}

/// The owner part of a session id (empty for an id that has none: stdio's).
fn owner_of(id: &str) -> &str {
    id.split_once('.').map_or("", |(_, o)| o)
}

/// How many sessions the owner `owner` may hold.
fn cap_of(owner: &str) -> usize {
    if owner.is_empty() || owner == ANONYMOUS.as_str() {
        MAX_SESSIONS
    } else {
        MAX_SESSIONS_PER_CALLER
    }
}

/// One owner's sessions, oldest first (with stale entries, as in [`Table::order`]).
#[derive(Debug, Default)]
struct Owned {
    live: usize,
    order: VecDeque<(Box<str>, u64)>,
}

#[derive(Debug, Default)]
struct Table {
    map: FxHashMap<Box<str>, State>,
    /// Session ids in the order they were first remembered, with their `seq` (an entry
    /// whose seq no longer matches was forgotten, and maybe remembered again later).
    order: VecDeque<(Box<str>, u64)>,
    /// The same per owner.
    owners: FxHashMap<Box<str>, Owned>,
    next: u64,
    /// Subscriptions of all sessions.
    subscriptions: usize,
}

impl Table {
    fn remove(&mut self, id: &str) {
        if let Some(s) = self.map.remove(id) {
            self.subscriptions -= s.subscriptions.len();
            let owner = owner_of(id);
            if let Some(o) = self.owners.get_mut(owner) {
                o.live -= 1;
                if o.live == 0 {
                    self.owners.remove(owner);
                }
            }
        }
    }

    fn entry(&mut self, id: &str) -> &mut State {
        if !self.map.contains_key(id) {
            let owner = owner_of(id);
            let cap = cap_of(owner);
            // The caller's own oldest session goes first.
            while self.owners.get(owner).is_some_and(|o| o.live >= cap) {
                let Some((old, seq)) = self.owners.get_mut(owner).and_then(|o| o.order.pop_front()) else {
                    break;
                };
                if self.map.get(&old).is_some_and(|s| s.seq == seq) {
                    self.remove(&old);
                }
            }
            while self.map.len() >= MAX_SESSIONS {
                let Some((old, seq)) = self.order.pop_front() else {
                    break;
                };
                if self.map.get(&old).is_some_and(|s| s.seq == seq) {
                    self.remove(&old);
                }
            }
            // Ids forgotten by `close` linger in `order`; compact when they dominate.
            if self.order.len() > 2 * MAX_SESSIONS {
                let map = &self.map;
                self.order
                    .retain(|(k, seq)| map.get(k).is_some_and(|s| s.seq == *seq));
            }
            let seq = self.next;
            self.next += 1;
            self.order.push_back((id.into(), seq));
            let o = self.owners.entry(owner.into()).or_default();
            o.live += 1;
            o.order.push_back((id.into(), seq));
            if o.order.len() > 2 * o.live + 64 {
                let map = &self.map;
                o.order
                    .retain(|(k, seq)| map.get(k).is_some_and(|s| s.seq == *seq) || &**k == id);
            }
            self.map.insert(
                id.into(),
                State {
                    seq,
                    ..State::default()
                },
            );
        }
        self.map
            .get_mut(id)
            .unwrap_or_else(|| unreachable!("inserted above"))
    }
}

/// Why a subscription was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscribeError {
    /// Subscriptions are delivered per session; the request had none.
    NoSession,
    /// The session holds [`MAX_SUBSCRIPTIONS`] already.
    TooMany,
    /// All sessions together hold [`MAX_TOTAL_SUBSCRIPTIONS`].
    ServerFull,
    /// The URI is longer than [`MAX_URI_BYTES`].
    UriTooLong,
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoSession => f.write_str(
                "resource subscriptions need a session: initialize first and send its Mcp-Session-Id",
            ),
            Self::TooMany => write!(f, "a session may hold at most {MAX_SUBSCRIPTIONS} subscriptions"),
            Self::UriTooLong => write!(f, "the URI exceeds {MAX_URI_BYTES} bytes"),
            Self::ServerFull => write!(
                f,
                "this server holds {MAX_TOTAL_SUBSCRIPTIONS} subscriptions already; try again later"
            ),
        }
    }
}

/// The sessions' state. Requests without a session (empty id) are never remembered.
#[derive(Debug, Default)]
pub struct Sessions {
    table: Mutex<Table>,
}

impl Sessions {
    /// Remembers a session that just initialized, with its client's capabilities.
    pub fn open(&self, id: &str, caps: ClientCaps) {
        if id.is_empty() {
            return;
        }
        if let Ok(mut t) = self.table.lock() {
            let s = t.entry(id);
            s.caps = Some(caps);
            s.level = LogLevel::default();
            let dropped = s.subscriptions.len();
            s.subscriptions.clear();
            t.subscriptions -= dropped;
        }
    }

    /// Forgets a session (HTTP DELETE).
    pub fn close(&self, id: &str) {
        if let Ok(mut t) = self.table.lock() {
            t.remove(id);
        }
    }

    /// Sessions remembered now.
    pub fn len(&self) -> usize {
        self.table.lock().map_or(0, |t| t.map.len())
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The client's capabilities; `None` when unknown here (no session, or its `initialize`
    /// went to another server).
    pub fn caps(&self, id: &str) -> Option<ClientCaps> {
        if id.is_empty() {
            return None;
        }
        self.table.lock().ok()?.map.get(id)?.caps
    }

    /// The least severe level the session wants log messages of.
    pub fn level(&self, id: &str) -> LogLevel {
        if id.is_empty() {
            return LogLevel::default();
        }
        self.table
            .lock()
            .ok()
            .and_then(|t| t.map.get(id).map(|s| s.level))
            .unwrap_or_default()
    }

    /// Sets the session's logging level; `false` when there is no session to remember it in.
    pub fn set_level(&self, id: &str, level: LogLevel) -> bool {
        if id.is_empty() {
            return false;
        }
        if let Ok(mut t) = self.table.lock() {
            t.entry(id).level = level;
        }
        true
    }

    /// Subscribes the session to `uri`'s updates (idempotent).
    ///
    /// # Errors
    /// No session, too many subscriptions, or an overlong URI.
    pub fn subscribe(&self, id: &str, uri: &str) -> Result<(), SubscribeError> {
        if id.is_empty() {
            return Err(SubscribeError::NoSession);
        }
        if uri.len() > MAX_URI_BYTES {
            return Err(SubscribeError::UriTooLong);
        }
        let Ok(mut t) = self.table.lock() else {
            return Ok(());
        };
        let full = t.subscriptions >= MAX_TOTAL_SUBSCRIPTIONS;
        let s = t.entry(id);
        if !s.subscriptions.contains(uri) {
            if s.subscriptions.len() >= MAX_SUBSCRIPTIONS {
                return Err(SubscribeError::TooMany);
            }
            if full {
                return Err(SubscribeError::ServerFull);
            }
            s.subscriptions.insert(uri.into());
            t.subscriptions += 1;
        }
        Ok(())
    }

    /// Ends the session's subscription to `uri` (idempotent).
    pub fn unsubscribe(&self, id: &str, uri: &str) {
        if let Ok(mut t) = self.table.lock()
            && t.map.get_mut(id).is_some_and(|s| s.subscriptions.remove(uri))
        {
            t.subscriptions -= 1;
        }
    }

    /// Every (session, URI) subscription, for the reloader to check.
    pub fn subscriptions(&self) -> Vec<(Box<str>, Box<str>)> {
        let Ok(t) = self.table.lock() else {
            return Vec::new();
        };
        t.map
            .iter()
            .flat_map(|(id, s)| s.subscriptions.iter().map(|u| (id.clone(), u.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_is_stable_per_id_and_reveals_nothing_of_it() {
        let a = mint("");
        let b = mint("");
        let t = tag(&a);
        assert_eq!(t, tag(&a));
        assert_ne!(t, tag(&b));
        assert_eq!(t.len(), 16);
        assert!(t.bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(!a.contains(&t) && !t.contains(&a[..16]));
        // Not a hash anyone could compute from a guessed id: the key is the process's own.
        let mut fixed = std::hash::DefaultHasher::new();
        std::hash::Hasher::write(&mut fixed, a.as_bytes());
        assert_ne!(t, format!("{:016x}", std::hash::Hasher::finish(&fixed)));
        assert_eq!(tag("stdio"), "stdio");
    }

    #[test]
    fn levels_parse_and_order() {
        for l in LogLevel::ALL {
            assert_eq!(LogLevel::parse(l.as_str()), Some(l));
        }
        assert_eq!(LogLevel::parse("verbose"), None);
        assert!(LogLevel::Debug < LogLevel::Info && LogLevel::Alert < LogLevel::Emergency);
    }

    #[test]
    fn state_is_per_session_and_bounded() {
        let s = Sessions::default();
        s.open(
            "a",
            ClientCaps {
                sampling: true,
                elicitation: false,
                elicitation_url: false,
                roots: false,
                tasks: false,
                core_tasks: false,
            },
        );
        assert_eq!(s.caps("a").map(|c| c.sampling), Some(true));
        assert_eq!(s.caps("b"), None);
        assert!(s.set_level("b", LogLevel::Error));
        assert_eq!(s.level("b"), LogLevel::Error);
        assert_eq!(s.level("a"), LogLevel::Info);
        assert!(!s.set_level("", LogLevel::Debug));
        assert_eq!(s.subscribe("", "x://a"), Err(SubscribeError::NoSession));
        assert_eq!(
            s.subscribe("a", &"x".repeat(MAX_URI_BYTES + 1)),
            Err(SubscribeError::UriTooLong)
        );
        for i in 0..MAX_SUBSCRIPTIONS {
            s.subscribe("a", &format!("x://{i}")).unwrap();
        }
        s.subscribe("a", "x://0").unwrap();
        assert_eq!(s.subscribe("a", "x://new"), Err(SubscribeError::TooMany));
        s.unsubscribe("a", "x://0");
        s.subscribe("a", "x://new").unwrap();
        assert_eq!(s.subscriptions().len(), MAX_SUBSCRIPTIONS);
        s.close("a");
        assert!(s.subscriptions().is_empty());
        // Opening past the cap forgets the oldest sessions, never grows without bound.
        for i in 0..MAX_SESSIONS + 10 {
            s.open(&format!("s{i}"), ClientCaps::default());
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert_eq!(s.caps("s0"), None);
        assert!(s.caps(&format!("s{}", MAX_SESSIONS + 9)).is_some());
        // All sessions together hold a bounded number of subscriptions.
        let mut refused = None;
        'fill: for i in 0..MAX_SESSIONS {
            for j in 0..MAX_SUBSCRIPTIONS {
                if let Err(e) = s.subscribe(&format!("s{}", MAX_SESSIONS + 9 - i), &format!("x://{j}")) {
                    refused = Some(e);
                    break 'fill;
                }
            }
        }
        assert_eq!(refused, Some(SubscribeError::ServerFull));
        assert_eq!(s.subscriptions().len(), MAX_TOTAL_SUBSCRIPTIONS);
        s.close(&format!("s{}", MAX_SESSIONS + 9));
        assert_eq!(
            s.subscriptions().len(),
            MAX_TOTAL_SUBSCRIPTIONS - MAX_SUBSCRIPTIONS
        );
        s.subscribe("s100", "x://again").unwrap();
    }

    #[test]
    fn one_caller_cannot_push_out_anothers_sessions() {
        let s = Sessions::default();
        let id = |owner: char, n: usize| format!("{n:032x}.{}", owner.to_string().repeat(32));
        s.open(&id('a', 0), ClientCaps::default());
        // Mallory opens more sessions than the server remembers in all.
        for n in 0..MAX_SESSIONS + 10 {
            s.open(&id('b', n), ClientCaps::default());
        }
        assert!(
            s.caps(&id('a', 0)).is_some(),
            "Alice's session is still remembered"
        );
        assert_eq!(s.len(), MAX_SESSIONS_PER_CALLER + 1);
        // Mallory's own oldest went first; her newest are kept.
        assert!(s.caps(&id('b', 0)).is_none());
        assert!(s.caps(&id('b', MAX_SESSIONS + 9)).is_some());
        // Sessions first used without initialize (logging level, subscriptions) count too.
        for n in 0..MAX_SESSIONS_PER_CALLER + 5 {
            s.set_level(&id('c', n), LogLevel::Error);
        }
        assert!(s.caps(&id('a', 0)).is_some());
        assert_eq!(s.len(), 2 * MAX_SESSIONS_PER_CALLER + 1);
    }

    #[test]
    fn ids_are_minted_per_caller() {
        let a = mint("alice");
        assert!(owned_by(&a, "alice"));
        assert!(!owned_by(&a, "bob") && !owned_by(&a, ""));
        assert_ne!(mint("alice"), a, "a fresh nonce each time");
        let anon = mint("");
        assert!(owned_by(&anon, "") && !owned_by(&anon, "alice"));
        assert!(a.len() <= crate::protocol::MAX_SESSION_ID_LEN);
        for bad in [
            "",
            "x",
            "stdio",
            "abc.def",
            &format!("{}.{}", "g".repeat(32), a.split_once('.').unwrap().1),
        ] {
            assert!(!owned_by(bad, "alice"), "{bad}");
        }
    }
}

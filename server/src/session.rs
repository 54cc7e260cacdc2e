//! What the server remembers about a session: what its client can do (sampling,
//! elicitation), the logging level it asked for, and the resources it subscribed to.
//!
//! Everything here is bounded: at most [`MAX_SESSIONS`] sessions are remembered (opening one
//! more forgets the oldest) and a session holds at most [`MAX_SUBSCRIPTIONS`] subscriptions.
//! A session this server never saw initialize (another replica did, or the server restarted)
//! gets default state on first use: nothing known about its client, level `info`.

use std::collections::VecDeque;
use std::sync::Mutex;

use rustc_hash::{FxHashMap, FxHashSet};

/// Sessions remembered at once.
pub const MAX_SESSIONS: usize = 65_536;
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
    /// `capabilities.roots`: it answers `roots/list`.
    pub roots: bool,
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

#[derive(Debug, Default)]
struct Table {
    map: FxHashMap<Box<str>, State>,
    /// Session ids in the order they were first remembered, with their `seq` (an entry
    /// whose seq no longer matches was forgotten, and maybe remembered again later).
    order: VecDeque<(Box<str>, u64)>,
    next: u64,
    /// Subscriptions of all sessions.
    subscriptions: usize,
}

impl Table {
    fn remove(&mut self, id: &str) {
        if let Some(s) = self.map.remove(id) {
            self.subscriptions -= s.subscriptions.len();
        }
    }

    fn entry(&mut self, id: &str) -> &mut State {
        if !self.map.contains_key(id) {
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
                roots: false,
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
}

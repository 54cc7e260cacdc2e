//! The way back to the client while a tool call runs: notifications about the call
//! (`notifications/progress`, `notifications/message`) and requests to the client
//! (`sampling/createMessage`, `elicitation/create`), whose answers arrive later as JSON-RPC
//! responses on the same session.
//!
//! Over HTTP a call that sends anything is answered with an SSE stream (the messages, then
//! the response); over stdio the messages are written as lines. Notifications never block a
//! call: when the client reads too slowly they are dropped (counted by
//! `quiver_peer_messages_dropped_total`). A request to the client waits for its answer
//! within the call's own timeout.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::session::{ClientCaps, LogLevel};

/// Messages queued to one call's client before notifications are dropped.
pub const QUEUE: usize = 64;
/// Requests to clients awaiting an answer, server-wide.
pub const MAX_PENDING: usize = 4_096;
/// How long a request to the client waits for its answer (unless the call ends first).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// The sending end of one call's messages to its client.
#[derive(Debug, Clone)]
pub struct Peer {
    tx: mpsc::Sender<Vec<u8>>,
}

impl Peer {
    /// A peer and the receiver its transport drains.
    pub fn channel() -> (Self, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Self { tx }, rx)
    }

    /// A peer writing into an existing queue (stdio's writer).
    pub fn from_sender(tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self { tx }
    }
}

type Answer = Result<Value, String>;
/// Waiting requests by (session, id).
type Waiting = FxHashMap<(Box<str>, u64), oneshot::Sender<Answer>>;

/// Requests sent to clients, by (session, id), waiting for their answers.
#[derive(Debug, Default)]
pub struct Pending {
    map: Mutex<Waiting>,
    next: AtomicU64,
}

/// Removes a pending request when its waiter goes away (answered, timed out or dropped).
struct PendingEntry<'a> {
    pending: &'a Pending,
    key: (Box<str>, u64),
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.pending.map.lock() {
            m.remove(&self.key);
        }
    }
}

impl Pending {
    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.map.lock().map_or(0, |m| m.len())
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Delivers a client's answer to the request `id` (its raw JSON) of `session`; `false`
    /// when no such request waits (unknown, already answered, or another session's).
    pub fn answer(
        &self,
        session: &str,
        id: &RawValue,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
    ) -> bool {
        let Ok(n) = id.get().parse::<u64>() else {
            return false;
        };
        let Some(tx) = self
            .map
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&(Box::from(session), n)))
        else {
            return false;
        };
        let answer = match (result, error) {
            (Some(r), _) => serde_json::from_str::<Value>(r.get()).map_err(|e| e.to_string()),
            (None, Some(e)) => Err(serde_json::from_str::<Value>(e.get())
                .ok()
                .and_then(|e| e.get("message").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| "the client answered with an error".to_owned())),
            (None, None) => Err("the client's answer has neither result nor error".to_owned()),
        };
        let _ = tx.send(answer);
        true
    }
}

/// What a running call may use to reach its client.
#[derive(Debug)]
pub struct CallCtx<'a> {
    /// The session (empty: none).
    pub session: &'a str,
    /// Where messages go; `None` when the transport cannot carry them (a batch).
    pub peer: Option<&'a Peer>,
    /// `_meta.progressToken` of the call, raw JSON.
    pub progress_token: Option<&'a RawValue>,
    /// The least severe level the session wants log messages of.
    pub level: LogLevel,
    /// What the client declared in `initialize`, when this server saw it.
    pub caps: Option<ClientCaps>,
    /// Requests to clients awaiting answers.
    pub pending: Option<&'a Pending>,
    /// Messages dropped because the client read too slowly.
    pub dropped: Option<&'a prometheus_client::metrics::counter::Counter>,
}

impl CallCtx<'_> {
    /// A call that cannot reach its client (benchmarks, batches, tests).
    pub const DETACHED: CallCtx<'static> = CallCtx {
        session: "",
        peer: None,
        progress_token: None,
        level: LogLevel::Info,
        caps: None,
        pending: None,
        dropped: None,
    };

    fn push(&self, msg: Vec<u8>) {
        if let Some(p) = self.peer
            && p.tx.try_send(msg).is_err()
            && let Some(c) = self.dropped
        {
            c.inc();
        }
    }

    /// Sends `notifications/progress` when the caller asked for progress.
    pub fn progress(&self, progress: u64, total: Option<u64>, message: Option<&str>) {
        let (Some(token), Some(_)) = (self.progress_token, self.peer) else {
            return;
        };
        let mut params = json!({"progressToken": token, "progress": progress});
        if let Some(t) = total {
            params["total"] = t.into();
        }
        if let Some(m) = message {
            params["message"] = m.into();
        }
        self.push(notification("notifications/progress", &params));
    }

    /// Sends `notifications/message` when `level` is at least the session's level.
    pub fn log(&self, level: LogLevel, logger: &str, data: &str) {
        if level < self.level || self.peer.is_none() {
            return;
        }
        let params = json!({"level": level.as_str(), "logger": logger, "data": data});
        self.push(notification("notifications/message", &params));
    }

    /// Sends a request to the client and waits for its answer (at most [`ANSWER_TIMEOUT`]).
    ///
    /// # Errors
    /// No way to reach the client, too many requests pending, the client answered with an
    /// error, or it did not answer in time.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        let (Some(peer), Some(pending)) = (self.peer, self.pending) else {
            return Err(format!(
                "{method} needs a client connection that can receive requests (a single request in a session, not a batch)"
            ));
        };
        if self.session.is_empty() {
            return Err(format!(
                "{method} needs a session: the client must initialize and send its Mcp-Session-Id"
            ));
        }
        let n = pending.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut m) = pending.map.lock() else {
                return Err("internal error".to_owned());
            };
            if m.len() >= MAX_PENDING {
                return Err(format!(
                    "{MAX_PENDING} requests to clients are already waiting for answers; try again later"
                ));
            }
            m.insert((Box::from(self.session), n), tx);
        }
        let _entry = PendingEntry {
            pending,
            key: (Box::from(self.session), n),
        };
        let msg = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": n, "method": method, "params": params}))
            .map_err(|e| e.to_string())?;
        if peer.tx.send(msg).await.is_err() {
            return Err("the client went away".to_owned());
        }
        match tokio::time::timeout(ANSWER_TIMEOUT, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err("the client went away".to_owned()),
            Err(_) => Err(format!(
                "the client did not answer {method} within {} s",
                ANSWER_TIMEOUT.as_secs()
            )),
        }
    }
}

fn notification(method: &str, params: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": method, "params": params})).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[tokio::test]
    async fn answers_reach_only_their_session_and_request() {
        let pending = Pending::default();
        let (peer, mut rx) = Peer::channel();
        let cx = CallCtx {
            session: "s1",
            peer: Some(&peer),
            pending: Some(&pending),
            ..CallCtx::DETACHED
        };
        let call = cx.request("sampling/createMessage", json!({"maxTokens": 1}));
        let answer = async {
            let sent: Value = serde_json::from_slice(&rx.recv().await.unwrap()).unwrap();
            assert_eq!(sent["method"], "sampling/createMessage");
            let id = raw(&sent["id"].to_string());
            // Another session cannot answer it; an unknown id matches nothing.
            assert!(!pending.answer("s2", &id, Some(&raw("{}")), None));
            assert!(!pending.answer("s1", &raw("999999"), Some(&raw("{}")), None));
            assert!(!pending.answer("s1", &raw("\"x\""), Some(&raw("{}")), None));
            assert!(pending.answer("s1", &id, Some(&raw(r#"{"ok":1}"#)), None));
            assert!(
                !pending.answer("s1", &id, Some(&raw("{}")), None),
                "answered twice"
            );
        };
        let (got, ()) = tokio::join!(call, answer);
        assert_eq!(got, Ok(json!({"ok": 1})));
        assert!(pending.is_empty());
    }

    #[tokio::test]
    async fn notifications_respect_level_and_token_and_never_block() {
        let (peer, mut rx) = Peer::channel();
        let token = raw("\"tok\"");
        let cx = CallCtx {
            peer: Some(&peer),
            progress_token: Some(&token),
            level: LogLevel::Warning,
            ..CallCtx::DETACHED
        };
        cx.log(LogLevel::Info, "t", "hidden");
        cx.log(LogLevel::Error, "t", "shown");
        cx.progress(1, Some(2), None);
        let a: Value = serde_json::from_slice(&rx.recv().await.unwrap()).unwrap();
        assert_eq!(a["params"]["data"], "shown");
        let b: Value = serde_json::from_slice(&rx.recv().await.unwrap()).unwrap();
        assert_eq!(
            b["params"],
            json!({"progressToken": "tok", "progress": 1, "total": 2})
        );
        // A full queue drops, it does not wait.
        for _ in 0..QUEUE * 2 {
            cx.progress(1, None, None);
        }
        assert_eq!(rx.len(), QUEUE);
        // Without a token there is no progress.
        let quiet = CallCtx {
            peer: Some(&peer),
            ..CallCtx::DETACHED
        };
        while rx.try_recv().is_ok() {}
        quiet.progress(1, None, None);
        assert!(rx.try_recv().is_err());
    }
}

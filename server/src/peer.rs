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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
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

/// A URL the user must open before a call can succeed (URL-mode elicitation, 2025-11-25):
/// set by the call's run (an upstream the user has not signed in to), read by the
/// dispatcher, which answers `URLElicitationRequired` (`-32042`) with it to a client that
/// declared `elicitation.url`; any other client gets the call's tool error, which names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlNeeded {
    /// `elicitationId`: names nothing of the user.
    pub id: String,
    /// The URL.
    pub url: String,
    /// Why, for the user.
    pub message: String,
}

/// Where a call's run leaves the first [`UrlNeeded`] it meets.
pub type UrlSlot = OnceLock<UrlNeeded>;

/// What a running call may use to reach its client.
#[derive(Debug)]
pub struct CallCtx<'a> {
    /// The session (empty: none).
    pub session: &'a str,
    /// Where messages go; `None` when the transport cannot carry them (a batch).
    pub peer: Option<&'a Peer>,
    /// `_meta.progressToken` of the call, raw JSON.
    pub progress_token: Option<&'a RawValue>,
    /// The least severe level the client wants log messages of; `None`: none (a 2026-07-28
    /// request that named no level).
    pub level: Option<LogLevel>,
    /// What the client declared in `initialize`, when this server saw it.
    pub caps: Option<ClientCaps>,
    /// 2026-07-28: questions to the client are gathered into an `InputRequiredResult` and
    /// answered by a retry, instead of being sent as requests.
    pub inputs: Option<&'a Inputs>,
    /// Requests to clients awaiting answers.
    pub pending: Option<&'a Pending>,
    /// Messages dropped because the client read too slowly.
    pub dropped: Option<&'a prometheus_client::metrics::counter::Counter>,
    /// The caller's validated access token (OIDC), for identity to upstreams and
    /// `{{caller.CLAIM}}`; `None`: it presented none.
    pub credential: Option<&'a crate::spec::caller::Credential>,
    /// Who is calling, for the policies of a pipeline's steps; `None`: an anonymous caller
    /// (or a deferred call of a tool that needs no caller).
    pub caller: Option<&'a crate::spec::access::Principal>,
    /// A pipeline called directly stops before this step (its result is the step before's):
    /// the part of a call that runs in the request before the call becomes a task.
    pub until_step: Option<usize>,
    /// Where the call says the user must open a URL first; `None`: the dispatcher would not
    /// use it (the call's tool error says it all).
    pub url_needed: Option<&'a UrlSlot>,
    /// Where the call names the upstream account it acted as (a user's own sign-in), for
    /// its audit record; `None`: nothing records it.
    pub upstream_account: Option<&'a AccountSlot>,
}

/// Where a call's run leaves the upstream account it acted as.
pub type AccountSlot = OnceLock<Arc<str>>;

impl CallCtx<'_> {
    /// A call that cannot reach its client (benchmarks, batches, tests).
    pub const DETACHED: CallCtx<'static> = CallCtx {
        session: "",
        peer: None,
        progress_token: None,
        level: Some(LogLevel::Info),
        caps: None,
        inputs: None,
        pending: None,
        dropped: None,
        credential: None,
        caller: None,
        until_step: None,
        url_needed: None,
        upstream_account: None,
    };

    fn push(&self, msg: Vec<u8>) {
        if let Some(p) = self.peer
            && p.tx.try_send(msg).is_err()
            && let Some(c) = self.dropped
        {
            c.inc();
        }
    }

    /// Notes the upstream account the call acted as (the first one a call names is kept).
    pub fn acted_as(&self, account: &Arc<str>) {
        if let Some(slot) = self.upstream_account {
            let _ = slot.get_or_init(|| account.clone());
        }
    }

    /// Notes that the user must open `needed.url` before the call can succeed (the first
    /// such URL of a call is kept).
    pub fn need_url(&self, needed: impl FnOnce() -> UrlNeeded) {
        if let Some(slot) = self.url_needed {
            let _ = slot.get_or_init(needed);
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

    /// Whether the caller asked for progress and can be sent it.
    pub fn wants_progress(&self) -> bool {
        self.progress_token.is_some() && self.peer.is_some()
    }

    /// Whether [`CallCtx::log`] can reach the client: it asked for log messages and can
    /// receive them during this call.
    pub fn wants_logs(&self) -> bool {
        self.level.is_some() && self.peer.is_some()
    }

    /// Passes on an upstream's `notifications/progress` params under the caller's token:
    /// `progress` and `total` when numbers, `message` when a string (cut at 1,024 characters).
    pub fn forward_progress(&self, upstream: &Value) {
        let (Some(token), Some(_)) = (self.progress_token, self.peer) else {
            return;
        };
        let Some(progress) = upstream.get("progress").filter(|p| p.is_number()) else {
            return;
        };
        let mut params = json!({"progressToken": token, "progress": progress});
        if let Some(t) = upstream.get("total").filter(|t| t.is_number()) {
            params["total"] = t.clone();
        }
        if let Some(m) = upstream.get("message").and_then(Value::as_str) {
            params["message"] = m.chars().take(1024).collect::<String>().into();
        }
        self.push(notification("notifications/progress", &params));
    }

    /// Sends `notifications/message` when `level` is at least the session's level.
    pub fn log(&self, level: LogLevel, logger: &str, data: &str) {
        if self.level.is_none_or(|min| level < min) || self.peer.is_none() {
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

/// A capability a question to the client needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `sampling/createMessage`.
    Sampling,
    /// `elicitation/create`.
    Elicitation,
    /// `roots/list`.
    Roots,
}

impl Need {
    /// The JSON-RPC method that asks it.
    pub fn method(self) -> &'static str {
        match self {
            Self::Sampling => "sampling/createMessage",
            Self::Elicitation => "elicitation/create",
            Self::Roots => "roots/list",
        }
    }

    /// The question a JSON-RPC method asks, if it is one of them.
    pub fn from_method(method: &str) -> Option<Self> {
        [Self::Sampling, Self::Elicitation, Self::Roots]
            .into_iter()
            .find(|n| n.method() == method)
    }

    /// The capability's name in `ClientCapabilities`.
    pub fn capability(self) -> &'static str {
        match self {
            Self::Sampling => "sampling",
            Self::Elicitation => "elicitation",
            Self::Roots => "roots",
        }
    }

    fn declared(self, caps: ClientCaps) -> bool {
        match self {
            Self::Sampling => caps.sampling,
            Self::Elicitation => caps.elicitation,
            Self::Roots => caps.roots,
        }
    }

    /// Why `answer` is not a well-formed result of this request, if it is not.
    pub fn malformed(self, answer: &Value) -> Option<&'static str> {
        let Some(o) = answer.as_object() else {
            return Some("must be an object (the result of the request)");
        };
        match self {
            Self::Elicitation => match o.get("action").and_then(Value::as_str) {
                Some("accept" | "decline" | "cancel") => {
                    (!o.get("content").is_none_or(Value::is_object)).then_some("`content` must be an object")
                }
                _ => Some("must carry `action`: accept, decline or cancel"),
            },
            Self::Sampling => (!o.get("content").is_some_and(|c| c.is_object() || c.is_array()))
                .then_some("must carry `content` (a block or an array of blocks)"),
            Self::Roots => (!o
                .get("roots")
                .and_then(Value::as_array)
                .is_some_and(|r| r.iter().all(|x| x.get("uri").is_some_and(Value::is_string))))
            .then_some("must carry `roots`: an array of {uri, name?}"),
        }
    }
}

/// What asking the client gave.
#[derive(Debug)]
pub enum Asked {
    /// The client's answer (its result object).
    Answer(Value),
    /// An optional question the client cannot answer (it did not declare the capability).
    Skipped,
    /// 2026-07-28: the call must stop here; the question was recorded for the
    /// `InputRequiredResult` (or the answer was refused, which fails the request).
    Stop,
    /// Asking failed; the message explains why (a tool error).
    Failed(String),
}

/// The questions and answers of one 2026-07-28 call round.
#[derive(Debug)]
pub struct Inputs {
    /// What the client declared in the request's `_meta`.
    pub caps: ClientCaps,
    answers: Map<String, Value>,
    round: Mutex<Round>,
}

/// What one round of a call gathered.
#[derive(Debug, Default)]
pub struct Round {
    /// Questions still unanswered, by key: `{method, params}`.
    pub asked: Map<String, Value>,
    /// Answers the call used, by key (carried to the next round in `requestState`).
    pub used: Map<String, Value>,
    /// Capabilities required but not declared.
    pub missing: Vec<Need>,
    /// Why an answer was refused (the request then fails with -32602).
    pub invalid: Option<String>,
    auto: u32,
}

impl Round {
    /// Whether the call must answer something other than its result.
    pub fn interrupted(&self) -> bool {
        !self.asked.is_empty() || !self.missing.is_empty() || self.invalid.is_some()
    }
}

/// Longest key of a question.
pub const MAX_KEY_LEN: usize = 64;

impl Inputs {
    /// A round with the answers known so far (from `requestState` and `inputResponses`).
    pub fn new(caps: ClientCaps, answers: Map<String, Value>) -> Self {
        Self {
            caps,
            answers,
            round: Mutex::new(Round::default()),
        }
    }

    /// What the round gathered.
    pub fn finish(self) -> Round {
        self.round.into_inner().unwrap_or_default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Round) -> T) -> Option<T> {
        self.round.lock().ok().map(|mut r| f(&mut r))
    }
}

impl CallCtx<'_> {
    /// Asks the client a question: `need` names the request, `key` its name in an
    /// `InputRequiredResult` (`None`: numbered in asking order), `params` builds the request's
    /// params. Under 2026-07-28 the answer comes from the retry (or the question is recorded
    /// and the call stops); before it, the request is sent and awaited.
    pub async fn ask(
        &self,
        need: Need,
        key: Option<&str>,
        optional: bool,
        params: impl FnOnce() -> Result<Value, String>,
    ) -> Asked {
        let Some(inputs) = self.inputs else {
            if self.caps.is_some_and(|c| !need.declared(c)) {
                if optional {
                    return Asked::Skipped;
                }
                return Asked::Failed(format!(
                    "this tool needs {} ({}), and the client did not declare the {} capability",
                    match need {
                        Need::Sampling => "the client's model",
                        Need::Elicitation => "an answer from the user",
                        Need::Roots => "the client's roots",
                    },
                    need.method(),
                    need.capability()
                ));
            }
            let params = match params() {
                Ok(p) => p,
                Err(e) => return Asked::Failed(e),
            };
            return match self.request(need.method(), params).await {
                Ok(a) => Asked::Answer(a),
                Err(e) => Asked::Failed(format!("{} failed: {e}", need.method())),
            };
        };
        if !need.declared(inputs.caps) {
            if optional {
                return Asked::Skipped;
            }
            inputs.with(|r| {
                if !r.missing.contains(&need) {
                    r.missing.push(need);
                }
            });
            return Asked::Stop;
        }
        let key = match key {
            Some(k) => k.to_owned(),
            None => inputs
                .with(|r| {
                    r.auto += 1;
                    format!("{}-{}", need.capability(), r.auto)
                })
                .unwrap_or_default(),
        };
        if let Some(answer) = inputs.answers.get(&key) {
            if let Some(why) = need.malformed(answer) {
                inputs.with(|r| {
                    r.invalid
                        .get_or_insert_with(|| format!("Invalid params: inputResponses.{key} {why}"));
                });
                return Asked::Stop;
            }
            inputs.with(|r| r.used.insert(key, answer.clone()));
            return Asked::Answer(answer.clone());
        }
        let params = match params() {
            Ok(p) => p,
            Err(e) => return Asked::Failed(e),
        };
        inputs.with(|r| {
            r.asked
                .insert(key, json!({"method": need.method(), "params": params}))
        });
        Asked::Stop
    }
}

/// What a 2026-07-28 input round made of a URL the user must open (see
/// [`CallCtx::open_in_round`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// The question is in the round's `InputRequiredResult` (asked for the first time, or
    /// again because the user said they opened it and the call still lacks what it needs);
    /// or the answer was malformed, which fails the request.
    Asked,
    /// The user declined or cancelled: the call ends with a tool error, asking nothing.
    Declined,
}

impl CallCtx<'_> {
    /// 2026-07-28: asks the client, as URL-mode `elicitation/create` in the round's
    /// `InputRequiredResult` under `key`, to have the user open `needed.url`; the client's
    /// retry runs the call again, which goes through once the user has done what the URL is
    /// for. `None`: not a 2026-07-28 round, or the client did not declare
    /// `elicitation.url` (the call's tool error carries the URL instead).
    pub fn open_in_round(&self, key: &str, needed: &UrlNeeded) -> Option<Opened> {
        let inputs = self.inputs.filter(|i| i.caps.elicitation_url)?;
        if let Some(answer) = inputs.answers.get(key) {
            if let Some(why) = Need::Elicitation.malformed(answer) {
                inputs.with(|r| {
                    r.invalid
                        .get_or_insert_with(|| format!("Invalid params: inputResponses.{key} {why}"));
                });
                return Some(Opened::Asked);
            }
            if answer.get("action").and_then(Value::as_str) != Some("accept") {
                return Some(Opened::Declined);
            }
        }
        let params = json!({
            "mode": "url",
            "elicitationId": needed.id,
            "url": needed.url,
            "message": needed.message,
        });
        inputs.with(|r| {
            r.asked.insert(
                key.to_owned(),
                json!({"method": Need::Elicitation.method(), "params": params}),
            )
        });
        Some(Opened::Asked)
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

    #[test]
    fn a_url_to_open_is_a_question_of_the_round_until_declined() {
        let needed = UrlNeeded {
            id: "e1".into(),
            url: "https://gw.example/oauth/start?t=x".into(),
            message: "Sign in".into(),
        };
        let url_caps = crate::session::ClientCaps {
            elicitation: true,
            elicitation_url: true,
            ..Default::default()
        };
        let round = |caps, answers: Value| {
            let inputs = Inputs::new(caps, answers.as_object().cloned().unwrap_or_default());
            let opened = CallCtx {
                inputs: Some(&inputs),
                ..CallCtx::DETACHED
            }
            .open_in_round("sign-in-notes", &needed);
            (opened, inputs.finish())
        };
        // Not a round, or a client that opens no URLs: nothing asked here.
        assert_eq!(CallCtx::DETACHED.open_in_round("k", &needed), None);
        let form_only = crate::session::ClientCaps {
            elicitation: true,
            ..Default::default()
        };
        assert_eq!(round(form_only, json!({})).0, None);
        // Asked: a URL-mode elicitation/create under the key.
        let (opened, r) = round(url_caps, json!({}));
        assert_eq!(opened, Some(Opened::Asked));
        assert_eq!(
            r.asked["sign-in-notes"],
            json!({"method": "elicitation/create", "params": {"mode": "url", "elicitationId": "e1", "url": needed.url, "message": "Sign in"}})
        );
        // Accepted while the call still lacks what the URL is for: asked again.
        let (opened, r) = round(url_caps, json!({"sign-in-notes": {"action": "accept"}}));
        assert_eq!(opened, Some(Opened::Asked));
        assert!(r.asked.contains_key("sign-in-notes") && r.invalid.is_none());
        // Declined or cancelled: nothing asked, the call ends.
        for action in ["decline", "cancel"] {
            let (opened, r) = round(url_caps, json!({"sign-in-notes": {"action": action}}));
            assert_eq!(opened, Some(Opened::Declined));
            assert!(!r.interrupted());
        }
        // A malformed answer fails the request.
        for bad in [
            json!(1),
            json!({"action": "maybe"}),
            json!({"action": "accept", "content": 3}),
        ] {
            let (opened, r) = round(url_caps, json!({"sign-in-notes": bad}));
            assert_eq!(opened, Some(Opened::Asked));
            assert!(
                r.invalid
                    .as_deref()
                    .is_some_and(|w| w.contains("inputResponses.sign-in-notes"))
            );
        }
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
            level: Some(LogLevel::Warning),
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

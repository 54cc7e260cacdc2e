//! An upstream's questions to the client of the call it is serving (`elicitation/create`,
//! `sampling/createMessage`, `roots/list` on the call's own answer stream), relayed to that
//! client and its answer returned: over the client's session (2025-11-25 and before), or as
//! a 2026-07-28 input round (the call is made again with the answer, which is then relayed).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use super::{CallError, Link};
use crate::peer::{Asked, CallCtx, Need};

/// What a call's client is known to answer when its session was not seen here: everything
/// relayed is declared (a question it cannot answer is refused when it comes).
pub(super) const EVERY_RELAYED: crate::session::ClientCaps = crate::session::ClientCaps {
    sampling: true,
    elicitation: true,
    elicitation_url: true,
    roots: true,
    tasks: false,
    core_tasks: false,
};

/// Questions relayed per call at most; more are refused.
pub const MAX_RELAYED: u32 = 16;

/// A relayed question's answer, to come.
pub(crate) type Asking<'a> = Pin<Box<dyn Future<Output = Result<Value, Refused>> + Send + 'a>>;

/// Why a question was not answered.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The client could not answer it (it did not declare the capability, did not answer, or
    /// answered something malformed), or it was one too many: the upstream is told why.
    Error(String),
    /// 2026-07-28: the question goes to the client in an input round; this call ends here.
    Stop,
}

/// The JSON-RPC answer to the upstream's request `id`.
pub(super) fn answered(id: Value, r: Result<Value, Refused>) -> Value {
    match r {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(Refused::Error(why)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": why}})
        }
        Err(Refused::Stop) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "the client is asked first; the call will be made again"}})
        }
    }
}

/// Longest key of an upstream's input request, and longest `requestState` carried back.
const MAX_INPUT_KEY: usize = 256;
const MAX_REQUEST_STATE: usize = 64 * 1024;

/// What a 2026-07-28 upstream asks of the client: an `input_required` result, or the
/// `inputRequests` of a task waiting for input.
pub(super) struct InputRound {
    /// Key, method and params of each question, in key order.
    pub requests: Vec<(String, String, Value)>,
    /// The upstream's `requestState`, carried back with the answers.
    pub state: Option<String>,
}

impl InputRound {
    /// The round `v` asks for (`None`: `v` is no `input_required` result), checked as
    /// [`Self::asking`] checks it, and its `requestState` bounded.
    pub(super) fn of(v: &mut Value) -> Result<Option<Self>, CallError> {
        if v.get("resultType").and_then(Value::as_str) != Some("input_required") {
            return Ok(None);
        }
        let state = match v.get_mut("requestState").map(Value::take) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.len() <= MAX_REQUEST_STATE => Some(s),
            Some(_) => return bad("with a requestState that is not a string of at most 64 KiB"),
        };
        let mut round = Self::asking(v)?;
        round.state = state;
        Ok(Some(round))
    }

    /// The questions of `v`'s `inputRequests`, checked: at most [`MAX_RELAYED`], with short
    /// keys, each a relayed method with object params.
    pub(super) fn asking(v: &mut Value) -> Result<Self, CallError> {
        let Some(Value::Object(asked)) = v.get_mut("inputRequests").map(Value::take) else {
            return bad("without inputRequests");
        };
        if asked.is_empty() || asked.len() > MAX_RELAYED as usize {
            return bad("asking no question, or too many");
        }
        let mut requests = Vec::with_capacity(asked.len());
        for (key, mut q) in asked {
            if key.is_empty() || key.len() > MAX_INPUT_KEY {
                return bad("with an empty or overlong key");
            }
            let method = match q.get("method").and_then(Value::as_str) {
                Some(m) if Need::from_method(m).is_some() => m.to_owned(),
                _ => return bad("asking something other than elicitation, sampling or roots"),
            };
            let params = match q.get_mut("params").map(Value::take) {
                None | Some(Value::Null) => json!({}),
                Some(p @ Value::Object(_)) => p,
                Some(_) => return bad("with params that are not an object"),
            };
            requests.push((key, method, params));
        }
        Ok(Self {
            requests,
            state: None,
        })
    }
}

/// Asks the client of the call each question of `requests` (key, method, params) through
/// `ask`, in order: the answers by key. A question the client is asked in its own input
/// round ends the call ([`CallError::Asked`]); one it cannot answer fails it.
pub(super) async fn ask_each<'a>(
    ask: &'a (dyn Fn(String, Value) -> Asking<'a> + Sync),
    requests: Vec<(String, String, Value)>,
) -> Result<serde_json::Map<String, Value>, CallError> {
    let mut answers = serde_json::Map::new();
    for (key, method, params) in requests {
        match ask(method, params).await {
            Ok(a) => {
                answers.insert(key, a);
            }
            Err(Refused::Stop) => return Err(CallError::Asked),
            Err(Refused::Error(why)) => {
                return Err(CallError::Protocol(format!(
                    "it asked the client for input it could not have: {why}"
                )));
            }
        }
    }
    Ok(answers)
}

fn bad<T>(why: &str) -> Result<T, CallError> {
    Err(CallError::Protocol(format!("a request for input {why}")))
}

/// The questions of one call relayed so far.
#[derive(Debug, Default)]
pub(super) struct Questions {
    count: AtomicU32,
    /// Digests of the questions asked, in order.
    seen: std::sync::Mutex<Vec<u64>>,
}

impl Questions {
    /// The key of a question in a 2026-07-28 client's input round: what it asks (its
    /// method and params) and how many times this call asked the same before. A call made
    /// again with the answers finds each answer under the question it answers, whatever
    /// order the upstream asks in this time; a different question is never answered with
    /// another's answer.
    fn key(&self, need: Need, method: &str, params: &Value) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(method.as_bytes());
        h.update([0]);
        h.update(serde_json::to_vec(params).unwrap_or_default());
        let d = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        let digest = u64::from_be_bytes(first);
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = seen.iter().filter(|&&x| x == digest).count();
        seen.push(digest);
        format!("{}-{digest:016x}-{before}", need.capability())
    }
}

impl Link {
    /// Relays the upstream's request `method` (`params`) to the client of call `cx`: its
    /// Secret values redacted, the client's declared capabilities respected, its answer
    /// checked.
    /// `asked` keeps the call's questions (at most [`MAX_RELAYED`]).
    pub(super) async fn relay(
        &self,
        method: String,
        params: Value,
        cx: &CallCtx<'_>,
        asked: &Questions,
    ) -> Result<Value, Refused> {
        let r = self.ask_client(method, params, cx, asked).await;
        // A question asked in the client's input round is counted when the retry answers it.
        if !matches!(r, Err(Refused::Stop)) {
            self.shared.metrics.question(r.is_ok());
        }
        r
    }

    async fn ask_client(
        &self,
        method: String,
        mut params: Value,
        cx: &CallCtx<'_>,
        asked: &Questions,
    ) -> Result<Value, Refused> {
        let Some(need) = Need::from_method(&method) else {
            return Err(Refused::Error(format!("`{method}` is not relayed")));
        };
        if asked.count.fetch_add(1, Ordering::Relaxed) >= MAX_RELAYED {
            return Err(Refused::Error(format!(
                "more than {MAX_RELAYED} questions to the client in one call"
            )));
        }
        // A URL to open is a mode of elicitation a client declares on its own.
        let url_mode = need == Need::Elicitation && params.get("mode").and_then(Value::as_str) == Some("url");
        let caps = cx.caps.or(cx.inputs.map(|i| i.caps));
        if url_mode && caps.is_some_and(|c| !c.elicitation_url) {
            return Err(Refused::Error(
                "the client did not declare URL-mode elicitation (capabilities.elicitation.url)".into(),
            ));
        }
        // What the upstream may not send its own client: the connection's Secrets.
        self.shared.secrets.redact_json(&self.secrets, &mut params);
        // `_meta` of the upstream's request (its progress token, ...) is its own.
        if let Some(o) = params.as_object_mut() {
            o.remove("_meta");
        }
        // What its results may not carry to the client, its questions may not either.
        if let Some(g) = &*self.guard.load() {
            let (mut scan, mut v) = (
                crate::guard::Scan::default(),
                crate::config::guards::Verdict::default(),
            );
            g.check_value(&mut params, &mut scan, &mut v);
            if v.action == crate::config::guards::GuardAction::Refuse {
                return Err(Refused::Error(
                    "the question was withheld by the result guard".into(),
                ));
            }
        }
        let key = asked.key(need, &method, &params);
        match cx.ask(need, Some(&key), false, || Ok(params)).await {
            Asked::Answer(a) => match need.malformed(&a) {
                None => Ok(a),
                Some(why) => Err(Refused::Error(format!("the client's answer {why}"))),
            },
            Asked::Stop => Err(Refused::Stop),
            Asked::Skipped => Err(Refused::Error(format!(
                "the client did not declare {}",
                need.capability()
            ))),
            Asked::Failed(why) => Err(Refused::Error(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_gets_the_answer_or_why_there_is_none() {
        assert_eq!(
            answered(json!(7), Ok(json!({"action": "decline"}))),
            json!({"jsonrpc": "2.0", "id": 7, "result": {"action": "decline"}})
        );
        let e = answered(
            json!("a"),
            Err(Refused::Error("the client did not declare sampling".into())),
        );
        assert_eq!(e["id"], "a");
        assert_eq!(e["error"]["message"], "the client did not declare sampling");
        assert!(answered(json!(1), Err(Refused::Stop))["error"]["message"].is_string());
    }

    #[test]
    fn an_upstreams_input_round_is_checked_and_bounded() {
        let mut v = json!({"resultType": "complete", "content": []});
        assert!(InputRound::of(&mut v).unwrap().is_none());
        let mut v = json!({"resultType": "input_required", "requestState": "s1", "inputRequests": {
            "b": {"method": "sampling/createMessage", "params": {"messages": []}},
            "a": {"method": "elicitation/create"},
        }});
        let r = InputRound::of(&mut v).unwrap().unwrap();
        assert_eq!(r.state.as_deref(), Some("s1"));
        let keys: Vec<_> = r
            .requests
            .iter()
            .map(|(k, m, _)| (k.as_str(), m.as_str()))
            .collect();
        assert_eq!(
            keys,
            [("a", "elicitation/create"), ("b", "sampling/createMessage")]
        );
        assert_eq!(r.requests[0].2, json!({}), "missing params are empty params");
        let many: serde_json::Map<String, Value> = (0..17)
            .map(|i| (format!("k{i}"), json!({"method": "roots/list"})))
            .collect();
        for bad in [
            json!({"resultType": "input_required"}),
            json!({"resultType": "input_required", "inputRequests": {}}),
            json!({"resultType": "input_required", "inputRequests": many}),
            json!({"resultType": "input_required", "inputRequests": {"k": {"method": "tools/call"}}}),
            json!({"resultType": "input_required", "inputRequests": {"k": {"method": "roots/list", "params": [1]}}}),
            json!({"resultType": "input_required", "inputRequests": {"": {"method": "roots/list"}}}),
            json!({"resultType": "input_required", "inputRequests": {"x".repeat(257): {"method": "roots/list"}}}),
            json!({"resultType": "input_required", "requestState": 7, "inputRequests": {"k": {"method": "roots/list"}}}),
            json!({"resultType": "input_required", "requestState": "s".repeat(64 * 1024 + 1), "inputRequests": {"k": {"method": "roots/list"}}}),
        ] {
            let mut bad = bad;
            assert!(
                matches!(InputRound::of(&mut bad), Err(CallError::Protocol(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_questions_key_is_what_it_asks_and_how_often() {
        let q = Questions::default();
        let a = q.key(
            Need::Elicitation,
            "elicitation/create",
            &json!({"message": "Delete?"}),
        );
        let b = q.key(
            Need::Elicitation,
            "elicitation/create",
            &json!({"message": "Rename?"}),
        );
        let again = q.key(
            Need::Elicitation,
            "elicitation/create",
            &json!({"message": "Delete?"}),
        );
        assert!(
            a.starts_with("elicitation-") && a.ends_with("-0") && a.len() <= crate::peer::MAX_KEY_LEN,
            "{a}"
        );
        assert_ne!(a, b);
        assert_eq!(
            again,
            format!("{}1", &a[..a.len() - 1]),
            "the same question twice: two keys"
        );
        // Another call (a retry) asking in another order finds the same keys.
        let r = Questions::default();
        assert_eq!(
            r.key(
                Need::Elicitation,
                "elicitation/create",
                &json!({"message": "Rename?"})
            ),
            b
        );
        assert_eq!(
            r.key(
                Need::Elicitation,
                "elicitation/create",
                &json!({"message": "Delete?"})
            ),
            a
        );
    }
}

//! An upstream's questions to the client of the call it is serving (`elicitation/create`,
//! `sampling/createMessage`, `roots/list` on the call's own answer stream), relayed to that
//! client and its answer returned: over the client's session (2025-11-25 and before), or as
//! a 2026-07-28 input round (the call is made again with the answer, which is then relayed).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use super::Link;
use crate::peer::{Asked, CallCtx, Need};

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

impl Link {
    /// Relays the upstream's request `method` (`params`) to the client of call `cx`: its
    /// Secret values redacted, the client's declared capabilities respected, its answer
    /// checked.
    /// `asked` counts the call's questions (at most [`MAX_RELAYED`]).
    pub(super) async fn relay(
        &self,
        method: String,
        mut params: Value,
        cx: &CallCtx<'_>,
        asked: &AtomicU32,
    ) -> Result<Value, Refused> {
        let Some(need) = Need::from_method(&method) else {
            return Err(Refused::Error(format!("`{method}` is not relayed")));
        };
        if asked.fetch_add(1, Ordering::Relaxed) >= MAX_RELAYED {
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
        match cx.ask(need, None, false, || Ok(params)).await {
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
}

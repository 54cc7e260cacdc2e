//! 2026-07-28 input rounds: a tool call or prompt that needs the client (the model, the user,
//! its roots) answers with an `InputRequiredResult`; the client retries with the answers and
//! the signed `requestState` this module opens and seals.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::envelope::present;
use super::error::RpcError;
use super::request::Request;
use super::server::Server;
use crate::dispatch::stateless::{CallId, Meta};
use crate::peer::{Inputs, Round};
use crate::protocol::{self, MISSING_CAPABILITY};
use crate::registry::Snapshot;
use crate::session::LogLevel;

/// The 2026-07-28 additions to `tools/call` and `prompts/get` params: the answers of a retry
/// and the state the server handed out with its questions.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RetryParams<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    input_responses: Option<&'a RawValue>,
    #[serde(borrow, default)]
    request_state: Option<Cow<'a, str>>,
}

/// What a call gets from a 2026-07-28 request besides the call itself.
pub(super) struct StatelessArgs<'a> {
    meta: Meta<'a>,
    /// The caller's [`crate::spec::access::Principal::subject`] (empty: not known), which
    /// `requestState` is bound to.
    caller: &'a str,
    answers: Option<&'a RawValue>,
    state: Option<Cow<'a, str>>,
}

/// A 2026-07-28 call in progress: the round's questions and answers, what its state is
/// bound to, and the per-request log level and progress token.
#[derive(Debug)]
pub(super) struct StatelessCall {
    pub inputs: Inputs,
    pub call: CallId,
    pub level: Option<LogLevel>,
    pub progress: Option<Box<RawValue>>,
}

/// The round fields of a 2026-07-28 request (`None` in the handshake era).
///
/// # Errors
/// `-32602` when the params do not read.
pub(super) fn stateless_args<'a>(req: &Request<'a>) -> Result<Option<StatelessArgs<'a>>, RpcError> {
    let Some(meta) = req.meta else {
        return Ok(None);
    };
    let retry = match req
        .params
        .map(|p| serde_json::from_str::<RetryParams<'a>>(p.get()))
    {
        Some(Err(e)) => return Err(RpcError::invalid_params(format!("Invalid params: {e}"))),
        Some(Ok(r)) => Some(r),
        None => None,
    };
    let (answers, state) = retry.map_or((None, None), |r| (r.input_responses, r.request_state));
    Ok(Some(StatelessArgs {
        meta,
        caller: req.ctx.caller.map_or("", |c| &c.subject),
        answers,
        state,
    }))
}

/// A 2026-07-28 tool call's round, checked before the tool runs: a retry's `requestState`
/// and `inputResponses` are opened at once (so that a bad one is refused before anything
/// runs); a first round carries neither and cannot fail, so it is opened only when the call
/// needs it ([`CallRound::open`]): a tool that answers at once never pays for its identity.
pub(super) enum CallRound<'a> {
    /// A retry, opened.
    Opened(Box<StatelessCall>),
    /// A first round, not opened yet.
    First(StatelessArgs<'a>),
}

impl CallRound<'_> {
    /// The round, opened.
    ///
    /// # Errors
    /// None for a first round; a retry was opened (and checked) by [`Server::call_round`].
    pub(super) fn open(
        self,
        server: &Server,
        name: &str,
        args: &Value,
    ) -> Result<Box<StatelessCall>, RpcError> {
        match self {
            Self::Opened(c) => Ok(c),
            Self::First(m) => server.stateless_call("tools/call", name, args, m).map(Box::new),
        }
    }
}

impl Server {
    /// The round of a 2026-07-28 `tools/call` of `name` with `args`: see [`CallRound`].
    ///
    /// # Errors
    /// `-32602` when a retry's `requestState` or `inputResponses` are refused.
    pub(super) fn call_round<'a>(
        &self,
        name: &str,
        args: &Value,
        m: StatelessArgs<'a>,
    ) -> Result<CallRound<'a>, RpcError> {
        if m.state.is_none() && m.answers.is_none() {
            return Ok(CallRound::First(m));
        }
        self.stateless_call("tools/call", name, args, m)
            .map(|c| CallRound::Opened(Box::new(c)))
    }

    /// Opens a 2026-07-28 call's `requestState` and gathers the answers of its retry.
    pub(super) fn stateless_call(
        &self,
        method: &str,
        name: &str,
        args: &Value,
        m: StatelessArgs<'_>,
    ) -> Result<StatelessCall, RpcError> {
        let call = CallId::new(method, name, args, m.caller);
        let mut answers = match m.state.as_deref() {
            Some(s) => self
                .state_key
                .open(s, &call)
                .map_err(|e| RpcError::invalid_params(format!("Invalid params: {e}")))?,
            None => Map::new(),
        };
        if let Some(raw) = m.answers {
            match serde_json::from_str::<Value>(raw.get()) {
                Ok(Value::Object(fresh)) => answers.extend(fresh),
                _ => {
                    return Err(RpcError::invalid_params(
                        "Invalid params: `inputResponses` must be an object mapping each input request's key to the client's result",
                    ));
                }
            }
        }
        Ok(StatelessCall {
            inputs: Inputs::new(m.meta.caps, answers),
            call,
            level: m.meta.level,
            progress: m.meta.progress.map(ToOwned::to_owned),
        })
    }

    /// What a 2026-07-28 round gathered instead of a result: a refused answer (`Err`), a
    /// missing capability (`Err`), or questions (an `InputRequiredResult` is written: `true`).
    pub(super) fn interrupted(
        &self,
        round: Round,
        call: &CallId,
        snap: &Snapshot,
        id: &RawValue,
        out: &mut Vec<u8>,
    ) -> Result<bool, RpcError> {
        if let Some(why) = round.invalid {
            return Err(RpcError::invalid_params(why));
        }
        if !round.missing.is_empty() {
            let required: Map<String, Value> = round
                .missing
                .iter()
                .map(|n| (n.capability().to_owned(), json!({})))
                .collect();
            let names: Vec<&str> = round.missing.iter().map(|n| n.capability()).collect();
            return Err(RpcError::new(
                MISSING_CAPABILITY,
                format!(
                    "Missing required client capability: {} (declare it in `io.modelcontextprotocol/clientCapabilities`)",
                    names.join(", ")
                ),
            )
            .with_data(json!({"requiredCapabilities": required})));
        }
        if round.asked.is_empty() {
            return Ok(false);
        }
        let state = self.state_key.seal(call, &round.used);
        let result = json!({
            "resultType": "input_required",
            "inputRequests": round.asked,
            "requestState": state,
            "_meta": {"io.modelcontextprotocol/serverInfo": snap.server_info},
        });
        protocol::write_result(out, id, &serde_json::to_vec(&result).unwrap_or_default());
        Ok(true)
    }
}

/// The context of a request forwarded to an upstream for a 2026-07-28 client `m`, whose
/// input round gathers the upstream's questions (`None`: none are relayed).
pub(super) fn round_cx(m: Option<&StatelessCall>) -> Option<crate::peer::CallCtx<'_>> {
    m.map(|m| crate::peer::CallCtx {
        level: None,
        caps: Some(m.inputs.caps),
        inputs: Some(&m.inputs),
        ..crate::peer::CallCtx::DETACHED
    })
}

//! An answer to send: its bytes, HTTP status and what the transport adds to it.

use serde_json::value::RawValue;

use super::error::{ErrorData, RpcError};
use crate::session::ClientCaps;

/// A JSON-RPC answer (one message's, or a batch's).
#[derive(Debug)]
pub struct Reply {
    /// The response bytes.
    pub body: Vec<u8>,
    /// Its HTTP status (transports without one ignore it).
    pub status: u16,
    /// The id of the session a successful `initialize` opened with a minted id
    /// ([`super::Opens::Minted`]): HTTP sends it as `Mcp-Session-Id`.
    pub session: Option<String>,
    /// The typed data of an error answer (never [`ErrorData::Json`], which is in `body`
    /// alone), from which HTTP writes its headers: `Retry-After` of a rate-limited call,
    /// the `WWW-Authenticate` scope challenge of a forbidden one.
    pub error: Option<ErrorData>,
    /// The caps of a successful `initialize`, until dispatch opens its session.
    pub(super) opened: Option<ClientCaps>,
}

impl Reply {
    /// An answer with this status and nothing else.
    pub(super) fn new(body: Vec<u8>, status: u16) -> Self {
        Self {
            body,
            status,
            session: None,
            error: None,
            opened: None,
        }
    }

    /// The answer of an error to `id` with `status`: `e` written into `out` (after what it
    /// holds), its typed data kept for the headers a transport adds.
    pub fn failed(e: RpcError, id: Option<&RawValue>, status: u16, mut out: Vec<u8>) -> Self {
        e.write(&mut out, id);
        let mut r = Self::new(out, status);
        r.error = e.data.filter(|d| !matches!(d, ErrorData::Json(_)));
        r
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::dispatch::error::Limiter;

    /// The typed data goes with the reply; JSON-only data stays in the body.
    #[test]
    fn a_reply_keeps_typed_data_only() {
        let id = RawValue::from_string("1".into()).unwrap();
        let typed = RpcError::rate_limited("slow down", 1500, Limiter::TaskRequests);
        let r = Reply::failed(typed.clone(), Some(&id), 429, Vec::new());
        assert_eq!((r.status, r.error), (429, typed.data));
        let json = RpcError::invalid_params("x").with_data(json!({"uri": "u"}));
        let r = Reply::failed(json, Some(&id), 200, Vec::new());
        assert_eq!(r.error, None);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["data"], json!({"uri": "u"}));
    }
}

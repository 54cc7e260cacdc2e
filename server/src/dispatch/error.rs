//! The one JSON-RPC error of dispatch: `{code, message, data}`. What a transport also states
//! in headers (when to retry a rate-limited call, which scopes a refused one needs) stays
//! typed in [`ErrorData`] until the answer is written: the JSON `data` and the headers are
//! both made from it there, and nothing is read back out of JSON.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::config::governance::Limit;
use crate::protocol::{self, FORBIDDEN, INVALID_PARAMS, RATE_LIMITED};
use crate::spec::access::Denial;

/// A JSON-RPC error answer: its code, message and optional `data`.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// The JSON-RPC error code (see [`crate::protocol`]).
    pub code: i32,
    /// What went wrong, for the client.
    pub message: String,
    /// Structured detail, written as `data`.
    pub data: Option<ErrorData>,
}

/// The `data` of an error.
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorData {
    /// Detail only the client reads (what is missing, which URI, which versions are
    /// supported, which policy refused).
    Json(Value),
    /// A call a limit refused (`-32004`); over HTTP also `Retry-After`.
    RateLimited(Box<RateLimited>),
    /// A call the tool's `access` does not allow this caller (`-32003`); over HTTP also a
    /// `WWW-Authenticate` scope challenge when scopes would help.
    Forbidden(Box<Forbidden>),
}

/// Why a call was rate limited, and when it may be retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimited {
    /// Milliseconds until a retry may succeed (`data.retryAfterMs`).
    pub retry_after_ms: u64,
    /// What refused the call.
    pub by: Limiter,
}

/// What refused a rate-limited call.
#[derive(Debug, Clone, PartialEq)]
pub enum Limiter {
    /// A declared limit (`data.limit`): its scope, name and whether each caller has its own
    /// budget, and `kind`: `rate`, `concurrency` or `unavailable`.
    Limit {
        /// The limit.
        limit: Arc<Limit>,
        /// How it refused.
        kind: &'static str,
    },
    /// The caller's budget of task requests (nothing more in `data`).
    TaskRequests,
    /// The audit queue had no room for the call's record (`data.audit: "queue_full"`).
    AuditQueue,
}

/// A call of a tool whose `access` the caller's credentials do not satisfy.
#[derive(Debug, Clone, PartialEq)]
pub struct Forbidden {
    /// The tool (`data.tool`).
    pub tool: String,
    /// What the caller lacks (`data.missingScopes`, `requiredScopes`, `allowedGroups`).
    pub denial: Denial,
}

impl RateLimited {
    /// The whole seconds, rounded up, of `Retry-After` (and `data.retryAfter`).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000)
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "retryAfterMs": self.retry_after_ms,
            "retryAfter": self.retry_after_secs(),
        });
        match &self.by {
            Limiter::Limit { limit, kind } => {
                v["limit"] = json!({
                    "scope": limit.scope.label(),
                    "name": &*limit.name,
                    "kind": kind,
                    "perCaller": limit.per_caller,
                });
            }
            Limiter::TaskRequests => {}
            Limiter::AuditQueue => v["audit"] = json!("queue_full"),
        }
        v
    }
}

impl Forbidden {
    /// The scopes of its `WWW-Authenticate` challenge, space separated: every scope the tool
    /// requires when some are missing (asking for the missing ones alone could lose the
    /// others); `None` when only groups are (no scope would help).
    pub fn scope_challenge(&self) -> Option<String> {
        self.denial.scope_challenge()
    }

    fn to_json(&self) -> Value {
        json!({
            "tool": self.tool,
            "missingScopes": self.denial.missing_scopes,
            "requiredScopes": self.denial.required_scopes,
            "allowedGroups": self.denial.not_in_groups,
        })
    }
}

impl ErrorData {
    /// The JSON written as the error's `data`.
    pub fn to_json(&self) -> Cow<'_, Value> {
        match self {
            Self::Json(v) => Cow::Borrowed(v),
            Self::RateLimited(r) => Cow::Owned(r.to_json()),
            Self::Forbidden(f) => Cow::Owned(f.to_json()),
        }
    }
}

impl RpcError {
    /// An error without `data`.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// `-32602` with this message.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    /// `-32004`: a call `by` refused, to be retried after `retry_after_ms`.
    pub fn rate_limited(message: impl Into<String>, retry_after_ms: u64, by: Limiter) -> Self {
        Self {
            data: Some(ErrorData::RateLimited(Box::new(RateLimited {
                retry_after_ms,
                by,
            }))),
            ..Self::new(RATE_LIMITED, message)
        }
    }

    /// `-32003`: a call of `tool` its `access` does not allow this caller.
    pub fn forbidden(message: impl Into<String>, tool: &str, denial: Denial) -> Self {
        Self {
            data: Some(ErrorData::Forbidden(Box::new(Forbidden {
                tool: tool.to_owned(),
                denial,
            }))),
            ..Self::new(FORBIDDEN, message)
        }
    }

    /// `-32042`: the user must open `needed.url` (URL-mode elicitation) before the call can
    /// succeed; the client retries it after.
    pub fn url_required(needed: &crate::peer::UrlNeeded) -> Self {
        Self::new(protocol::URL_ELICITATION_REQUIRED, needed.message.clone()).with_data(json!({
            "elicitations": [{
                "mode": "url",
                "elicitationId": needed.id,
                "url": needed.url,
                "message": needed.message,
            }]
        }))
    }

    /// The same error carrying `data`.
    #[must_use]
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(ErrorData::Json(data));
        self
    }

    /// Writes the error response answering `id` (`null` when it is not known).
    pub fn write(&self, out: &mut Vec<u8>, id: Option<&RawValue>) {
        let data = self.data.as_ref().map(ErrorData::to_json);
        protocol::write_error(out, id, self.code, &self.message, data.as_deref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_code_message_and_data() {
        let id = RawValue::from_string("3".into()).unwrap();
        let mut out = Vec::new();
        RpcError::invalid_params("bad \"x\"")
            .with_data(json!({"uri": "u"}))
            .write(&mut out, Some(&id));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], 3);
        assert_eq!(v["error"]["code"], INVALID_PARAMS);
        assert_eq!(v["error"]["message"], "bad \"x\"");
        assert_eq!(v["error"]["data"], json!({"uri": "u"}));
        let mut out = Vec::new();
        RpcError::new(protocol::PARSE_ERROR, "p").write(&mut out, None);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v["id"].is_null() && v["error"].get("data").is_none());
    }

    #[test]
    fn a_url_the_user_must_open_is_the_spec_s_elicitations() {
        let needed = crate::peer::UrlNeeded {
            id: "n0nce".into(),
            url: "https://mcp.example/oauth/start?t=x".into(),
            message: "Sign in to upstream `github`".into(),
        };
        let id = RawValue::from_string("7".into()).unwrap();
        let mut out = Vec::new();
        RpcError::url_required(&needed).write(&mut out, Some(&id));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["code"], -32042);
        assert_eq!(v["error"]["message"], "Sign in to upstream `github`");
        assert_eq!(
            v["error"]["data"],
            json!({"elicitations": [{"mode": "url", "elicitationId": "n0nce", "url": "https://mcp.example/oauth/start?t=x", "message": "Sign in to upstream `github`"}]})
        );
    }

    fn denial(missing: &[&str]) -> Denial {
        Denial {
            missing_scopes: missing.iter().map(|&s| s.into()).collect(),
            required_scopes: vec!["a".into(), "b".into()],
            not_in_groups: missing.is_empty().then(|| vec!["ops".into()]),
            anonymous: false,
        }
    }

    /// The error of every handler's `Result` is no larger than when its `data` was JSON
    /// only: the typed data is boxed.
    #[test]
    fn typed_data_does_not_grow_the_error() {
        use std::mem::size_of;
        assert_eq!(size_of::<Option<ErrorData>>(), size_of::<Option<Value>>());
    }

    #[test]
    fn scope_challenges_name_required_scopes_only_when_some_are_missing() {
        let e = |missing: &[&str]| Forbidden {
            tool: "t".into(),
            denial: denial(missing),
        };
        assert_eq!(e(&["b"]).scope_challenge().as_deref(), Some("a b"));
        assert_eq!(e(&[]).scope_challenge(), None);
    }
}

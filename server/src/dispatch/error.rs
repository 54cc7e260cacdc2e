//! The one JSON-RPC error of dispatch: `{code, message, data}`.

use serde_json::Value;
use serde_json::value::RawValue;

use crate::protocol::{self, INVALID_PARAMS};

/// A JSON-RPC error answer: its code, message and optional `data`.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// The JSON-RPC error code (see [`crate::protocol`]).
    pub code: i32,
    /// What went wrong, for the client.
    pub message: String,
    /// Structured detail (what is missing, which URI, which versions are supported).
    pub data: Option<Value>,
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

    /// The same error carrying `data`.
    #[must_use]
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Writes the error response answering `id` (`null` when it is not known).
    pub fn write(&self, out: &mut Vec<u8>, id: Option<&RawValue>) {
        protocol::write_error(out, id, self.code, &self.message, self.data.as_ref());
    }

    /// For a rate-limited call (`-32004`): the seconds of its `Retry-After`.
    pub fn retry_after(&self) -> Option<u64> {
        (self.code == protocol::RATE_LIMITED)
            .then(|| self.data.as_ref()?.get("retryAfter")?.as_u64())
            .flatten()
    }

    /// For a call the caller may not make (`-32003`): the scopes of its `WWW-Authenticate`
    /// challenge, space separated; every required scope when some are missing, none (empty)
    /// when only groups are. `None` for any other error.
    pub fn scope_challenge(&self) -> Option<String> {
        (self.code == protocol::FORBIDDEN).then(|| {
            let names = |field: &str| -> Vec<&str> {
                self.data
                    .as_ref()
                    .and_then(|d| d.get(field))
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default()
            };
            if names("missingScopes").is_empty() {
                String::new()
            } else {
                names("requiredScopes").join(" ")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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
    fn scope_challenges_name_required_scopes_only_when_some_are_missing() {
        let e = |missing: &[&str]| {
            RpcError::new(protocol::FORBIDDEN, "no").with_data(
                json!({"missingScopes": missing, "requiredScopes": ["a", "b"], "allowedGroups": []}),
            )
        };
        assert_eq!(e(&["b"]).scope_challenge().as_deref(), Some("a b"));
        assert_eq!(e(&[]).scope_challenge().as_deref(), Some(""));
        assert_eq!(RpcError::invalid_params("x").scope_challenge(), None);
    }
}

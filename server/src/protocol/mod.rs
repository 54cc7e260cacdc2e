//! JSON-RPC 2.0 framing and MCP protocol constants, written straight into byte buffers.

pub mod output;

use serde_json::value::RawValue;

/// Handshake-era revisions this server speaks, newest first: a client opens with
/// `initialize` and (over HTTP) gets a session.
pub const SUPPORTED_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// The newest handshake-era revision; offered when `initialize` asks for one we do not speak.
pub const LATEST_VERSION: &str = SUPPORTED_VERSIONS[0];
/// Stateless-era revisions: every request carries its version, client capabilities
/// and log level in `_meta`; there is no handshake and no session (see [`crate::dispatch::stateless`]).
pub const STATELESS_VERSIONS: [&str; 1] = ["2026-07-28"];
/// Every revision this server speaks, newest first (`server/discover`, and the `supported`
/// list of an unsupported-version error).
pub const ALL_VERSIONS: [&str; 4] = ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"];
/// What a Streamable HTTP request without `MCP-Protocol-Version` is assumed to speak.
pub const DEFAULT_HTTP_VERSION: &str = "2025-03-26";

/// Invalid JSON.
pub const PARSE_ERROR: i32 = -32700;
/// Not a valid JSON-RPC request object.
pub const INVALID_REQUEST: i32 = -32600;
/// Unknown method.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// Invalid method parameters (including unknown tool, prompt or cursor).
pub const INVALID_PARAMS: i32 = -32602;
/// Internal error.
pub const INTERNAL_ERROR: i32 = -32603;
/// Resource not found (MCP).
pub const RESOURCE_NOT_FOUND: i32 = -32002;
/// HTTP headers disagree with the body, or a required header is missing (2026-07-28).
pub const HEADER_MISMATCH: i32 = -32020;
/// The request needs a client capability its `_meta` did not declare (2026-07-28).
pub const MISSING_CAPABILITY: i32 = -32021;
/// The request's protocol version is not one this server speaks (2026-07-28).
pub const UNSUPPORTED_VERSION: i32 = -32022;
/// The request was cancelled by the client.
pub const REQUEST_CANCELLED: i32 = -32800;
/// The caller's credentials do not allow this call (a tool's `access`); over HTTP the answer
/// is a 403. Quiver's own code, in the range JSON-RPC leaves to servers.
pub const FORBIDDEN: i32 = -32003;
/// A limit refused the call (`data.retryAfterMs` says when to retry); over HTTP the answer
/// is a 429 with `Retry-After`. Quiver's own code, in the range JSON-RPC leaves to servers.
pub const RATE_LIMITED: i32 = -32004;
/// The request needs the user to open a URL first (URL-mode elicitation, 2025-11-25):
/// `data.elicitations` lists them; the client retries once they are done.
pub const URL_ELICITATION_REQUIRED: i32 = -32042;

/// Longest `Mcp-Session-Id` accepted (ids this server issues are 32 characters).
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Whether `id` is an acceptable session id: 1 to [`MAX_SESSION_ID_LEN`] visible ASCII
/// characters (0x21 to 0x7E), as the Streamable HTTP transport requires.
pub fn valid_session_id(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_SESSION_ID_LEN && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The supported revision equal to `v`, if any.
pub fn supported(v: &str) -> Option<&'static str> {
    SUPPORTED_VERSIONS.iter().copied().find(|s| *s == v)
}

/// The stateless revision equal to `v`, if any.
pub fn stateless(v: &str) -> Option<&'static str> {
    STATELESS_VERSIONS.iter().copied().find(|s| *s == v)
}

/// The `UnsupportedProtocolVersionError` data: every version spoken, and the one asked for.
pub fn unsupported_version_data(requested: &str) -> serde_json::Value {
    serde_json::json!({"supported": ALL_VERSIONS, "requested": requested})
}

/// The HTTP status of a 2026-07-28 error answer, by JSON-RPC code (200 for the rest: a tool
/// or resource failure is an answer, not a transport refusal).
pub fn stateless_http_status(code: i32) -> u16 {
    match code {
        PARSE_ERROR | INVALID_REQUEST | INVALID_PARAMS | HEADER_MISMATCH | MISSING_CAPABILITY
        | UNSUPPORTED_VERSION => 400,
        METHOD_NOT_FOUND => 404,
        FORBIDDEN => 403,
        RATE_LIMITED => 429,
        _ => 200,
    }
}

/// Whether an `id` is a string or a number, as JSON-RPC requires (MCP forbids null).
pub fn valid_id(id: &RawValue) -> bool {
    matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

/// The `id` of a single JSON-RPC message, if it can be read and is a string or a number: for
/// errors found before dispatch (transport refusals), which should still name the request.
/// A batch, an unreadable body or a missing, null or structured id gives `None`.
pub fn peek_id(body: &[u8]) -> Option<&RawValue> {
    #[derive(serde::Deserialize)]
    struct IdOnly<'a> {
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
    }
    serde_json::from_slice::<IdOnly<'_>>(body)
        .ok()?
        .id
        .filter(|id| valid_id(id))
}

/// `{"jsonrpc":"2.0","id":ID,"result":RESULT}`.
pub fn write_result(out: &mut Vec<u8>, id: &RawValue, result: &[u8]) {
    out.reserve(32 + id.get().len() + result.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"result\":");
    out.extend_from_slice(result);
    out.push(b'}');
}

/// `{"jsonrpc":"2.0","id":ID|null,"error":{"code":C,"message":M[,"data":D]}}`.
pub fn write_error(
    out: &mut Vec<u8>,
    id: Option<&RawValue>,
    code: i32,
    message: &str,
    data: Option<&serde_json::Value>,
) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.map_or("null", RawValue::get).as_bytes());
    out.extend_from_slice(b",\"error\":{\"code\":");
    out.extend_from_slice(code.to_string().as_bytes());
    out.extend_from_slice(b",\"message\":");
    let _ = serde_json::to_writer(&mut *out, message);
    if let Some(d) = data {
        out.extend_from_slice(b",\"data\":");
        let _ = serde_json::to_writer(&mut *out, d);
    }
    out.extend_from_slice(b"}}");
}

/// A complete JSON-RPC error response.
pub fn error_response(id: Option<&RawValue>, code: i32, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + message.len());
    write_error(&mut out, id, code, message, None);
    out
}

/// A serialized notification with no params.
pub fn notification(method: &str) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"method\":\"{method}\"}}")
}

/// Whether `body` is a single message that asks for no answer: a notification or a response
/// to a server request. Such messages free capacity (a cancel, the answer a waiting sampling
/// call needs), so transports let them through when their request slots are full.
pub fn is_answer_or_notification(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape<'a> {
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
        #[serde(borrow, default)]
        method: Option<&'a RawValue>,
    }
    serde_json::from_slice::<Shape<'_>>(body).is_ok_and(|m| m.id.is_none() || m.method.is_none())
}

/// The fields every 2026-07-28 result carries: `resultType` and the server's identity.
pub fn stateless_result_fields(server_info: &serde_json::Value) -> Vec<u8> {
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(b"\"resultType\":\"complete\",\"_meta\":{\"io.modelcontextprotocol/serverInfo\":");
    let _ = serde_json::to_writer(&mut f, server_info);
    f.push(b'}');
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_results_and_errors() {
        let id = RawValue::from_string("7".into()).unwrap();
        let mut out = Vec::new();
        write_result(&mut out, &id, b"{}");
        assert_eq!(out, br#"{"jsonrpc":"2.0","id":7,"result":{}}"#);
        let e = error_response(None, PARSE_ERROR, "bad \"json\"");
        let v: serde_json::Value = serde_json::from_slice(&e).unwrap();
        assert_eq!(v["error"]["message"], "bad \"json\"");
        assert!(v["id"].is_null());
        assert!(valid_id(&RawValue::from_string("\"a\"".into()).unwrap()));
        assert!(!valid_id(&RawValue::from_string("null".into()).unwrap()));
        assert!(!valid_id(&RawValue::from_string("{}".into()).unwrap()));
    }

    #[test]
    fn peeks_request_ids() {
        let id = |b: &str| peek_id(b.as_bytes()).map(|r| r.get().to_owned());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).as_deref(),
            Some("7")
        );
        assert_eq!(
            id(r#"{"method":"x","id":"a b","params":{"id":1}}"#).as_deref(),
            Some("\"a b\"")
        );
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":null}"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":{"x":1}}"#), None);
        assert_eq!(id(r#"[{"jsonrpc":"2.0","id":1}]"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":1"#), None);
        assert_eq!(id("not json"), None);
    }

    #[test]
    fn session_ids_are_visible_ascii_and_bounded() {
        assert!(valid_session_id(b"0123456789abcdef0123456789abcdef"));
        assert!(valid_session_id(b"!~"));
        assert!(valid_session_id(&[b'a'; MAX_SESSION_ID_LEN]));
        assert!(!valid_session_id(b""));
        assert!(!valid_session_id(b"has space"));
        assert!(!valid_session_id(b"tab\there"));
        assert!(!valid_session_id(b"\x7f"));
        assert!(!valid_session_id("caf\u{e9}".as_bytes()));
        assert!(!valid_session_id(&[b'a'; MAX_SESSION_ID_LEN + 1]));
    }
}

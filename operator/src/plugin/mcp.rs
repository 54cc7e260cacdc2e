//! The MCP requests of `kubectl quiver`, in the stateless 2026-07-28 revision (no handshake,
//! no session: every request stands alone, so any replica behind the Service answers it), and
//! the reading of their answers (JSON or an event stream).

use base64::Engine;
use serde_json::{Value, json};

use super::Failure;

/// The revision spoken.
pub const VERSION: &str = "2026-07-28";
/// Most pages of `tools/list` followed.
pub const MAX_PAGES: usize = 1000;
/// Most bytes of `tools/list` answers read in all (the pages together).
pub const MAX_LISTING_BYTES: usize = 64 << 20;

/// A request: its headers (besides content negotiation and credentials) and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `(name, value)` pairs.
    pub headers: Vec<(&'static str, String)>,
    /// The JSON-RPC message.
    pub body: Vec<u8>,
}

/// An HTTP answer of the MCP endpoint.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: String,
    /// The body (bounded by the transport).
    pub body: Vec<u8>,
}

/// `Mcp-Name`'s encoding: plain visible ASCII, else `=?base64?...?=`.
pub fn header_text(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b)) && !s.starts_with("=?") {
        s.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
        )
    }
}

/// A 2026-07-28 request of `method` with `params` (its `_meta` added).
pub fn request(id: u64, method: &str, params: serde_json::Map<String, Value>, name: Option<&str>) -> Request {
    request_as("kubectl-quiver", id, method, params, name)
}

/// [`request`] from the client named `client` (its `clientInfo`).
pub fn request_as(
    client: &str,
    id: u64,
    method: &str,
    mut params: serde_json::Map<String, Value>,
    name: Option<&str>,
) -> Request {
    params.insert(
        "_meta".to_owned(),
        json!({
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": client, "version": env!("CARGO_PKG_VERSION")},
        }),
    );
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut headers = vec![
        ("mcp-protocol-version", VERSION.to_owned()),
        ("mcp-method", method.to_owned()),
    ];
    if let Some(n) = name {
        headers.push(("mcp-name", header_text(n)));
    }
    Request {
        headers,
        body: serde_json::to_vec(&body).unwrap_or_default(),
    }
}

/// The `result` of the response to `id` in `answer`.
///
/// # Errors
/// [`Failure::Server`] for an HTTP error, a JSON-RPC error or an unreadable answer.
pub fn result(answer: &Answer, id: u64) -> Result<Value, Failure> {
    let messages = if answer.content_type.starts_with("text/event-stream") {
        events(&answer.body)
    } else {
        serde_json::from_slice::<Value>(&answer.body)
            .into_iter()
            .collect()
    };
    let response = messages
        .into_iter()
        .find(|m| m.get("id").and_then(Value::as_u64) == Some(id));
    match (answer.status, response) {
        (_, Some(r)) if r.get("error").is_some() => {
            let e = &r["error"];
            let message = e.get("message").and_then(Value::as_str).unwrap_or("no message");
            let code = e.get("code").and_then(Value::as_i64).unwrap_or_default();
            let data = e
                .get("data")
                .map(|d| format!(" ({})", clip(&d.to_string(), 300)))
                .unwrap_or_default();
            Err(Failure::Server(format!(
                "error {code}: {}{data}",
                clip(message, 500)
            )))
        }
        (200..=299, Some(r)) => r
            .get("result")
            .cloned()
            .ok_or_else(|| Failure::Server("a response without a result".to_owned())),
        (401, _) => Err(Failure::Server(
            "401 Unauthorized: the McpServer requires a token (--token, QUIVER_TOKEN or --token-file)"
                .to_owned(),
        )),
        (403, _) => Err(Failure::Server(
            "403 Forbidden: the token lacks the scope or group this needs".to_owned(),
        )),
        (status, _) => Err(Failure::Server(format!(
            "HTTP {status}: {}",
            clip(&String::from_utf8_lossy(&answer.body), 500)
        ))),
    }
}

/// The JSON messages of an event stream (`data:` lines, joined per event).
fn events(body: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    let mut data = String::new();
    for line in text.lines().chain(std::iter::once("")) {
        if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        } else if line.is_empty() && !data.is_empty() {
            out.extend(serde_json::from_str::<Value>(&data).ok());
            data.clear();
        }
    }
    out
}

fn clip(s: &str, n: usize) -> String {
    let mut c: String = s.chars().take(n).collect();
    if s.chars().nth(n).is_some() {
        c.push('…');
    }
    c
}

/// A `tools/call` result for people: its text content, one item per line (other content as
/// JSON); `true` when the tool reported an error.
///
/// # Errors
/// [`Failure::Server`] when the tool asks the client a question (sampling, elicitation),
/// which this client cannot answer.
pub fn call_text(result: &Value) -> Result<(String, bool), Failure> {
    if result.get("resultType").and_then(Value::as_str) == Some("input_required") {
        return Err(Failure::Server(
            "the tool asks the client questions (sampling or elicitation); kubectl quiver cannot answer them: use an MCP client".to_owned(),
        ));
    }
    let is_error = result.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let mut lines = Vec::new();
    for item in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match (
            item.get("type").and_then(Value::as_str),
            item.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(t)) => lines.push(t.to_owned()),
            _ => lines.push(item.to_string()),
        }
    }
    if lines.is_empty()
        && let Some(s) = result.get("structuredContent")
    {
        lines.push(s.to_string());
    }
    Ok((lines.join("\n"), is_error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, ct: &str, body: &str) -> Answer {
        Answer {
            status,
            content_type: ct.to_owned(),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_request_carries_the_revision_in_meta_and_headers() {
        let mut p = serde_json::Map::new();
        p.insert("name".into(), json!("add"));
        let r = request(7, "tools/call", p, Some("add"));
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["id"], 7);
        assert_eq!(
            body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
            VERSION
        );
        assert!(body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"].is_object());
        assert!(r.headers.contains(&("mcp-method", "tools/call".to_owned())));
        assert!(r.headers.contains(&("mcp-name", "add".to_owned())));
        assert_eq!(header_text("plain-name_1"), "plain-name_1");
        assert_eq!(header_text("naïve tool"), "=?base64?bmHDr3ZlIHRvb2w=?=");
    }

    #[test]
    fn answers_are_read_from_json_or_an_event_stream() {
        let ok = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#;
        assert_eq!(
            result(&answer(200, "application/json", ok), 1).unwrap(),
            json!({"tools": []})
        );
        let sse = format!(
            "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}}\n\nid: 2\ndata: {ok}\n\n"
        );
        assert_eq!(
            result(&answer(200, "text/event-stream", &sse), 1).unwrap(),
            json!({"tools": []})
        );
        let err = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"unknown tool: nope"}}"#;
        assert_eq!(
            result(&answer(400, "application/json", err), 1)
                .unwrap_err()
                .to_string(),
            "error -32602: unknown tool: nope"
        );
        let e = result(&answer(401, "application/json", "{}"), 1).unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("--token"));
        let e = result(&answer(503, "text/plain", "no endpoints available"), 1).unwrap_err();
        assert_eq!(e.to_string(), "HTTP 503: no endpoints available");
        assert!(
            result(&answer(200, "application/json", "{}"), 1).is_err(),
            "no response to id 1"
        );
    }

    #[test]
    fn call_results_print_their_text_and_flag_errors() {
        let r = json!({"content": [{"type": "text", "text": "42"}, {"type": "image", "data": "AA", "mimeType": "image/png"}]});
        let (text, is_error) = call_text(&r).unwrap();
        assert_eq!(text.lines().next(), Some("42"));
        assert!(text.contains("image/png") && !is_error);
        let (text, is_error) =
            call_text(&json!({"content": [{"type": "text", "text": "boom"}], "isError": true})).unwrap();
        assert_eq!((text.as_str(), is_error), ("boom", true));
        assert_eq!(
            call_text(&json!({"structuredContent": {"a": 1}})).unwrap().0,
            r#"{"a":1}"#
        );
        assert!(call_text(&json!({"resultType": "input_required", "inputRequests": {}})).is_err());
    }
}

//! 2026-07-28 header mirroring: `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` must repeat
//! what the body says (else `-32020 HeaderMismatch`).

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use super::HttpState;
use super::reject::json_response;
use crate::protocol;

/// The body fields 2026-07-28 mirrors into headers.
#[derive(serde::Deserialize)]
struct Mirrored<'a> {
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<MirroredParams<'a>>,
}

#[derive(serde::Deserialize)]
struct MirroredParams<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, rename = "taskId")]
    task_id: Option<std::borrow::Cow<'a, str>>,
    /// Read only when the tool declares `x-mcp-header` parameters.
    #[serde(borrow, default)]
    arguments: Option<&'a serde_json::value::RawValue>,
}

/// A header value in the 2026-07-28 encoding: plain visible ASCII, or `=?base64?...?=` for
/// anything else. `None` when it is neither.
fn header_text(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    if let Some(b64) = s.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok();
    }
    s.bytes()
        .all(|b| b == b'\t' || (0x20..=0x7e).contains(&b))
        .then(|| s.to_owned())
}

/// 2026-07-28 request headers: `Mcp-Method` must repeat the body's method, and `Mcp-Name`
/// the tool or prompt name or resource URI of `tools/call`, `prompts/get`, `resources/read`
/// (and, when sent, the `taskId` of `tasks/get`, `tasks/cancel`, `tasks/update`).
/// A missing, malformed or different header is `-32020 HeaderMismatch` (HTTP 400), so that
/// a proxy routing by header and this server reading the body cannot disagree.
pub(super) fn check_mirrored(
    state: &HttpState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Box<Response>> {
    let Ok(m) = serde_json::from_slice::<Mirrored<'_>>(body) else {
        // Not a readable request: dispatch answers it.
        return Ok(());
    };
    let Some(method) = m.method else {
        return Ok(());
    };
    let mismatch = |message: String| {
        let mut out = Vec::with_capacity(160);
        protocol::write_error(
            &mut out,
            protocol::peek_id(body),
            protocol::HEADER_MISMATCH,
            &message,
            None,
        );
        Box::new(json_response(StatusCode::BAD_REQUEST, out))
    };
    match headers.get(super::METHOD_HEADER).map(header_text) {
        None => {
            return Err(mismatch(
                "Header mismatch: the Mcp-Method header is required".to_owned(),
            ));
        }
        Some(None) => {
            return Err(mismatch(
                "Header mismatch: Mcp-Method is not a valid header value".to_owned(),
            ));
        }
        Some(Some(h)) if h != method => {
            return Err(mismatch(format!(
                "Header mismatch: Mcp-Method is {:?} but the body's method is {:?}",
                clip(&h),
                clip(&method)
            )));
        }
        Some(Some(_)) => {}
    }
    let named = match &*method {
        "tools/call" | "prompts/get" => m.params.as_ref().and_then(|p| p.name.as_deref()),
        "resources/read" => m.params.as_ref().and_then(|p| p.uri.as_deref()),
        // A task's id: checked when the client sends the header (not every client does yet).
        "tasks/get" | "tasks/cancel" | "tasks/update" if headers.contains_key("mcp-name") => {
            m.params.as_ref().and_then(|p| p.task_id.as_deref())
        }
        _ => return Ok(()),
    };
    let Some(named) = named else {
        // Missing in the body: dispatch reports the invalid params.
        return Ok(());
    };
    match headers.get(super::NAME_HEADER).map(header_text) {
        None => Err(mismatch(
            "Header mismatch: the Mcp-Name header is required".to_owned(),
        )),
        Some(None) => Err(mismatch(
            "Header mismatch: Mcp-Name is not a valid header value".to_owned(),
        )),
        Some(Some(h)) if h != named => Err(mismatch(format!(
            "Header mismatch: Mcp-Name is {:?} but the body names {:?}",
            clip(&h),
            clip(named)
        ))),
        Some(Some(_)) if method == "tools/call" => {
            let args = m.params.as_ref().and_then(|p| p.arguments);
            check_param_headers(state, headers, named, args).map_err(mismatch)
        }
        Some(Some(_)) => Ok(()),
    }
}

/// Whether `text` is `n` written in decimal, without formatting it into a new string.
fn fmt_eq(text: &str, n: impl std::fmt::Display) -> bool {
    use std::fmt::Write;
    struct Cmp<'a>(&'a str, bool);
    impl Write for Cmp<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            match self.0.strip_prefix(s) {
                Some(rest) => self.0 = rest,
                None => self.1 = false,
            }
            Ok(())
        }
    }
    let mut c = Cmp(text, true);
    let _ = write!(c, "{n}");
    c.1 && c.0.is_empty()
}

/// The `Mcp-Param-*` headers of a `tools/call` (2026-07-28): each argument the tool declares
/// with `x-mcp-header` must be mirrored, decoded, equal to the body's value, and a header
/// needs its argument. Tools without such parameters cost one lookup.
fn check_param_headers(
    state: &HttpState,
    headers: &HeaderMap,
    tool: &str,
    args: Option<&serde_json::value::RawValue>,
) -> Result<(), String> {
    let snap = state.server.registry.load();
    let Some(t) = snap.tool_index(tool).map(|i| &snap.tools[i]) else {
        // Unknown tool: dispatch answers it.
        return Ok(());
    };
    let declared = t.def.input.param_headers();
    if declared.is_empty() {
        return Ok(());
    }
    // Not an object: the arguments' validation reports it.
    let args: serde_json::Map<String, serde_json::Value> = args
        .and_then(|a| serde_json::from_str(a.get()).ok())
        .unwrap_or_default();
    for (param, name) in declared {
        let display = &name["mcp-param-".len()..];
        let body = args.get(&**param).filter(|v| !v.is_null());
        let mut values = headers.get_all(&**name).iter();
        let (header, extra) = (values.next(), values.next());
        if extra.is_some() {
            return Err(format!(
                "Header mismatch: Mcp-Param-{display} is sent more than once"
            ));
        }
        match (body, header) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(format!(
                    "Header mismatch: the Mcp-Param-{display} header is required (the arguments carry `{param}`)"
                ));
            }
            (None, Some(_)) => {
                return Err(format!(
                    "Header mismatch: Mcp-Param-{display} is sent but the arguments carry no `{param}`"
                ));
            }
            (Some(v), Some(h)) => {
                let Some(text) = param_header_text(h) else {
                    return Err(format!(
                        "Header mismatch: Mcp-Param-{display} is not a valid header value \
                         (visible ASCII, or =?base64?...?= with canonical Base64 of UTF-8)"
                    ));
                };
                if !header_matches(&text, v) {
                    return Err(format!(
                        "Header mismatch: Mcp-Param-{display} does not match the argument `{param}`"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// An `Mcp-Param-*` value: `=?base64?...?=` decoded (canonical, padded Base64 of UTF-8),
/// anything else literal visible ASCII with surrounding blanks removed.
fn param_header_text(v: &HeaderValue) -> Option<std::borrow::Cow<'_, str>> {
    let s = v.to_str().ok()?;
    if let Some(b64) = s.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok().map(Into::into);
    }
    let s = s.trim_matches([' ', '\t']);
    s.bytes().all(|b| (0x20..=0x7e).contains(&b)).then_some(s.into())
}

/// Whether a header's text is the argument's value: a string itself, an integer or a
/// boolean as JSON writes it.
fn header_matches(text: &str, v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::String(s) => s == text,
        Value::Bool(b) => text == if *b { "true" } else { "false" },
        // Compared as text: `03` or `+3` is not how the argument 3 is written.
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => fmt_eq(text, i),
            (_, Some(u)) => fmt_eq(text, u),
            _ => false,
        },
        _ => false,
    }
}

fn clip(s: &str) -> &str {
    let end = s.char_indices().nth(64).map_or(s.len(), |(i, _)| i);
    &s[..end]
}

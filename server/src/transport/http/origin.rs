//! The Origin and Host checks every route takes first ([`Allowed`]): a page on another
//! site or a rebinding DNS name is refused before anything else is read.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::HttpState;
use super::reject::Reject;

fn is_loopback_origin(origin: &str) -> bool {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    let host = if rest.starts_with('[') {
        rest.split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default()
    } else {
        rest.split(':').next().unwrap_or("").to_owned()
    };
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

fn check_origin(state: &HttpState, headers: &HeaderMap) -> Result<(), Reject> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let allowed = is_loopback_origin(origin)
        || state
            .options
            .allowed_origins
            .iter()
            .any(|a| a == "*" || a == origin);
    if allowed {
        Ok(())
    } else {
        Err(Reject(
            StatusCode::FORBIDDEN,
            format!("Origin {origin} is not allowed"),
        ))
    }
}

/// The host part of a `Host` value (`[::1]` keeps its brackets), without the port.
/// The name part of a Host value, `uri-host [":" port]` (RFC 9110 section 7.2), or `None`
/// when the value is not one: userinfo (`localhost:1@evil.example`), a path, a space, a
/// port that is not digits. A reg-name keeps its case; callers compare without case.
fn host_name(host: &str) -> Option<&str> {
    let (name, port) = if let Some(inside) = host.strip_prefix('[') {
        let end = inside.find(']')?;
        let literal = &inside[..end];
        if literal.is_empty()
            || !literal
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return None;
        }
        host.split_at(end + 2)
    } else {
        host.split_at(host.find(':').unwrap_or(host.len()))
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let name_ok = name.starts_with('[')
        || (!name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&b)));
    (port_ok && name_ok).then_some(name)
}

fn check_host(state: &HttpState, headers: &HeaderMap) -> Result<(), Reject> {
    let Some(allowed) = &state.options.allowed_hosts else {
        return Ok(());
    };
    // Over HTTP/2 the listener copies `:authority` into Host when the header is absent, so
    // one check covers both versions. hyper serves an HTTP/1.x request without Host; with an
    // allow-list in force such a request names no host that could be allowed.
    let Some(host) = headers.get(header::HOST) else {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            "a Host header is required (this listener checks it, see --allowed-host)".into(),
        ));
    };
    let host = host.to_str().unwrap_or("");
    let Some(name) = host_name(host) else {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            format!(
                "malformed Host header {:?}: expected host[:port]",
                host.chars().take(64).collect::<String>()
            ),
        ));
    };
    // Compared without case, in place (no lowercase copy per request).
    let ok = ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .any(|l| name.eq_ignore_ascii_case(l))
        || allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(name));
    if ok {
        Ok(())
    } else {
        Err(Reject(
            StatusCode::FORBIDDEN,
            format!("Host {host} is not allowed (see --allowed-host)"),
        ))
    }
}

/// A request whose Origin and Host this listener allows (a page on another site, a
/// rebinding DNS name: refused before anything else is read).
pub(super) struct Allowed;

impl FromRequestParts<Arc<HttpState>> for Allowed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<HttpState>) -> Result<Self, Response> {
        allowed(state, &parts.headers)
            .map(|()| Allowed)
            .map_err(IntoResponse::into_response)
    }
}

/// The Origin check, then the Host check; the first refusal.
pub(super) fn allowed(state: &HttpState, headers: &HeaderMap) -> Result<(), Reject> {
    check_origin(state, headers).and_then(|()| check_host(state, headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins() {
        assert!(is_loopback_origin("http://localhost:3000"));
        assert!(is_loopback_origin("http://127.0.0.1"));
        assert!(is_loopback_origin("http://[::1]:8080"));
        assert!(!is_loopback_origin("http://evil.example"));
        assert!(!is_loopback_origin("http://localhost.evil.example"));
    }

    #[test]
    fn host_names() {
        for (host, name) in [
            ("localhost:8080", "localhost"),
            ("[::1]:8080", "[::1]"),
            ("[::1]", "[::1]"),
            ("mcp.example", "mcp.example"),
            ("MCP.Example:", "MCP.Example"),
            ("[::ffff:127.0.0.1]:1", "[::ffff:127.0.0.1]"),
        ] {
            assert_eq!(host_name(host), Some(name), "{host}");
        }
        // Everything that is not `host[:port]` is refused rather than guessed at: userinfo
        // (which once read as `localhost`), paths, spaces, odd ports, broken literals.
        for bad in [
            "",
            ":80",
            "localhost:1@evil.example",
            "user@localhost",
            "localhost/evil",
            "localhost evil",
            "localhost:80:80",
            "localhost:x",
            "localhost:123456",
            "[::1",
            "[]",
            "[::1]x",
            "[::1]:8o",
            "[evil.example]",
            "local\\host",
        ] {
            assert_eq!(host_name(bad), None, "{bad:?}");
        }
    }
}

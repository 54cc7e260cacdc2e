//! `identity:` of an http tool or a remote upstream: which credential a call carries to the
//! API or MCP server behind it. The server's own (the configured headers, the default), the
//! caller's validated access token when that token names the target as an audience (RFC
//! 8707), or a token the issuer exchanges for the caller's (RFC 8693). Declaration and
//! validation only; the runtime is `crate::identity`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::Problems;

/// Most scopes one `identity` may request.
pub const MAX_SCOPES: usize = 32;
/// Longest audience or scope.
pub const MAX_NAME: usize = 1024;

/// Whose credential a call carries to the API or upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IdentityMode {
    /// The server's own: the configured headers (the default; no caller credential leaves
    /// the server).
    #[default]
    Server,
    /// The caller's own access token, only when its `aud` names `audience`; otherwise the
    /// call fails.
    Forward,
    /// A token the issuer exchanges for the caller's (RFC 8693 token exchange), addressed to
    /// `audience`; needs the server's token-exchange client. A failed exchange fails the call.
    Exchange,
}

/// Which credential calls carry (`Authorization: Bearer ...`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdentitySpec {
    /// `server` (default), `forward` or `exchange`.
    #[serde(default)]
    pub mode: IdentityMode,
    /// The target's name at the issuer (RFC 8707 resource or OAuth audience), e.g. its client
    /// id or URL: `forward` requires the caller's token to list it in `aud`; `exchange` asks
    /// for a token addressed to it. Required by both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Scopes asked for in the exchange (`exchange` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
}

/// A compiled `identity` that sends something other than the server's own credential.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// `forward` or `exchange`.
    pub mode: IdentityMode,
    /// The audience.
    pub audience: Box<str>,
    /// Scopes of an exchange, space-separated (empty: none asked for).
    pub scopes: Box<str>,
}

fn plain(s: &str) -> bool {
    (1..=MAX_NAME).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

/// Compiles `identity` at `at`; `None` for the server's own credential (or a problem).
pub(crate) fn compile(spec: &IdentitySpec, at: &str, p: &mut Problems) -> Option<Identity> {
    if spec.mode == IdentityMode::Server {
        if spec.audience.is_some() || !spec.scopes.is_empty() {
            p.push(
                at,
                "`audience` and `scopes` are for modes `forward` and `exchange`; `server` sends the server's own credential",
            );
        }
        return None;
    }
    let audience = match spec.audience.as_deref() {
        None => {
            p.push(
                format!("{at}.audience"),
                "required: the name the issuer gives this API or upstream (a token must be addressed to it)",
            );
            return None;
        }
        Some(a) if !plain(a) => {
            p.push(
                format!("{at}.audience"),
                format!("1-{MAX_NAME} printable characters without spaces or quotes"),
            );
            return None;
        }
        Some(a) => a,
    };
    if spec.mode == IdentityMode::Forward && !spec.scopes.is_empty() {
        p.push(
            format!("{at}.scopes"),
            "a forwarded token carries the scopes it has; `scopes` is for `exchange`",
        );
    }
    if spec.scopes.len() > MAX_SCOPES {
        p.push(format!("{at}.scopes"), format!("at most {MAX_SCOPES}"));
    }
    for (i, s) in spec.scopes.iter().enumerate() {
        if !plain(s) {
            p.push(
                format!("{at}.scopes[{i}]"),
                format!("1-{MAX_NAME} printable characters without spaces or quotes"),
            );
        }
    }
    let mut scopes: Vec<&str> = spec.scopes.iter().map(String::as_str).collect();
    // The same scopes in another order are the same request (and the same cache entry).
    scopes.sort_unstable();
    scopes.dedup();
    Some(Identity {
        mode: spec.mode,
        audience: audience.into(),
        scopes: scopes.join(" ").into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(yaml: &str) -> (Option<Identity>, Vec<String>) {
        let spec: IdentitySpec = serde_saphyr::from_str(yaml).unwrap();
        let mut p = Problems::default();
        let id = compile(&spec, "identity", &mut p);
        (id, p.0.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn forward_and_exchange_need_an_audience_and_scopes_are_for_exchange() {
        assert_eq!(run("{}"), (None, vec![]));
        let (id, p) = run("{mode: exchange, audience: notes, scopes: [b, a, b]}");
        assert!(p.is_empty(), "{p:?}");
        let id = id.unwrap();
        assert_eq!((&*id.audience, &*id.scopes), ("notes", "a b"));
        assert!(run("{mode: forward}").1[0].contains("identity.audience: required"));
        assert!(run("{mode: forward, audience: x, scopes: [a]}").1[0].contains("identity.scopes"));
        assert!(run("{mode: server, audience: x}").1[0].contains("`server` sends"));
        assert!(run("{mode: exchange, audience: \"a b\"}").1[0].contains("without spaces"));
        assert!(run("{mode: exchange, audience: x, scopes: [\"\"]}").1[0].contains("scopes[0]"));
        assert!(serde_saphyr::from_str::<IdentitySpec>("{mode: other}").is_err());
        assert!(serde_saphyr::from_str::<IdentitySpec>("{mode: forward, extra: 1}").is_err());
    }
}

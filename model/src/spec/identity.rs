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

/// `url` with its scheme and authority lowercased, and the rest as written.
fn normalized(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !(scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("http")) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return None;
    }
    Some(format!(
        "{}://{}{path}",
        scheme.to_ascii_lowercase(),
        authority.to_ascii_lowercase()
    ))
}

/// The origin of an http(s) `url`: its scheme and authority, lowercased.
pub fn origin(url: &str) -> Option<String> {
    let n = normalized(url)?;
    let scheme_end = n.find("://")? + 3;
    let end = n[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(n.len(), |i| scheme_end + i);
    Some(n[..end].to_owned())
}

/// Whether two http(s) URLs have the same scheme, host and port.
pub fn same_origin(a: &str, b: &str) -> bool {
    matches!((origin(a), origin(b)), (Some(x), Some(y)) if x == y)
}

/// Whether a request to `target` (a URL, or the literal start of a URL template) goes to
/// the resource `audience` names (RFC 8707): the same URL, or one below it at a path
/// boundary. `None`: `audience` is not a URL (a client id, say).
pub fn addressed(audience: &str, target: &str) -> Option<bool> {
    let a = normalized(audience)?;
    let Some(t) = normalized(target) else {
        return Some(false);
    };
    let a = a.trim_end_matches('/');
    Some(match t.strip_prefix(a) {
        None => false,
        Some(rest) => rest.is_empty() || rest.starts_with(['/', '?', '#']),
    })
}

/// Compiles `identity` at `at`, for requests to `target` (a URL, or the literal start of a
/// URL template); `None` for the server's own credential (or a problem).
///
/// A token addressed to a resource goes to that resource only: `forward` needs `audience`
/// to be the target's URL (the caller's token is sent as it came, so where it may go is what
/// it names), and a URL `audience` of `exchange` must name the target too. An `exchange`
/// audience that is not a URL (a client id) is the issuer's to grant or refuse.
pub fn compile(spec: &IdentitySpec, at: &str, target: &str, p: &mut Problems) -> Option<Identity> {
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
    match addressed(audience, target) {
        Some(true) => {}
        Some(false) => {
            p.push(
                format!("{at}.audience"),
                format!(
                    "names the resource {audience:?}, and this target's URL is not that URL or below it: a token addressed to one resource is never sent to another"
                ),
            );
            return None;
        }
        None if spec.mode == IdentityMode::Forward => {
            p.push(
                format!("{at}.audience"),
                "`forward` sends the caller's token only to the resource it is addressed to: the audience must be this target's URL (or a URL it is below, RFC 8707), e.g. https://api.example.com; for an API the issuer knows by another name, use `mode: exchange`",
            );
            return None;
        }
        None => {}
    }
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
        let id = compile(&spec, "identity", "https://notes.example/api/v1?q=1", &mut p);
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
        assert!(
            run("{mode: forward, audience: \"https://notes.example\", scopes: [a]}").1[0]
                .contains("identity.scopes")
        );
        assert!(run("{mode: server, audience: x}").1[0].contains("`server` sends"));
        assert!(run("{mode: exchange, audience: \"a b\"}").1[0].contains("without spaces"));
        assert!(run("{mode: exchange, audience: x, scopes: [\"\"]}").1[0].contains("scopes[0]"));
        assert!(serde_saphyr::from_str::<IdentitySpec>("{mode: other}").is_err());
        assert!(serde_saphyr::from_str::<IdentitySpec>("{mode: forward, extra: 1}").is_err());
    }

    #[test]
    fn a_token_goes_only_to_the_resource_it_names() {
        // forward: the audience must be the target's URL, or one it is below.
        for ok in [
            "https://notes.example",
            "https://notes.example/",
            "HTTPS://Notes.Example/api",
            "https://notes.example/api/v1",
        ] {
            let (id, p) = run(&format!("{{mode: forward, audience: \"{ok}\"}}"));
            assert!(p.is_empty() && id.is_some(), "{ok}: {p:?}");
        }
        for bad in [
            "https://notes.example.evil",
            "https://notes.example:8443",
            "https://notes.example/ap",
            "https://notes.example/api/v2",
            "http://notes.example",
            "https://other.example",
        ] {
            let (id, p) = run(&format!("{{mode: forward, audience: \"{bad}\"}}"));
            assert!(
                id.is_none() && p[0].contains("never sent to another"),
                "{bad}: {p:?}"
            );
        }
        // A client id cannot be checked against the URL: forward refuses it, exchange leaves
        // it to the issuer; a URL audience of exchange must name the target too.
        let (id, p) = run("{mode: forward, audience: quiver}");
        assert!(id.is_none() && p[0].contains("use `mode: exchange`"), "{p:?}");
        assert!(run("{mode: exchange, audience: notes-api}").1.is_empty());
        assert!(run("{mode: exchange, audience: \"https://other.example\"}").1[0].contains("never sent"));
        // A target whose origin is not literal matches no URL audience.
        assert_eq!(addressed("https://a.example", ""), Some(false));
        assert_eq!(addressed("https://a.example", "ftp://a.example"), Some(false));
        assert_eq!(addressed("notes", "https://a.example"), None);
        assert_eq!(addressed("https://", "https://a.example"), None);
        assert!(same_origin(
            "https://Login.example/realms/corp",
            "https://login.example/token"
        ));
        assert!(!same_origin(
            "https://login.example",
            "https://login.example:8443/token"
        ));
        assert!(!same_origin(
            "https://login.example",
            "https://login.example.evil/token"
        ));
        assert!(!same_origin("https://login.example", "not a url"));
    }
}

//! `identity:` of an http tool or a remote upstream: which credential a call carries to the
//! API or MCP server behind it. The server's own (the configured headers, the default), the
//! caller's validated access token when that token names the target as an audience (RFC
//! 8707), a token the issuer exchanges for the caller's (RFC 8693), or (remote upstreams
//! only) the token each user got by signing in at the upstream's own authorization server.
//! Declaration and validation only; the runtime is `crate::identity` and `crate::oauth`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::{Names, Problems, SecretRef, check_secret_template};
use crate::template::{Authored, Template};

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
    /// Remote upstreams only: the token each user obtained by signing in at the upstream's
    /// own OAuth authorization server (GitHub's, Atlassian's, ...) through this server. A
    /// user without one is sent a sign-in link; needs the server's upstream sign-in (its
    /// `--upstream-sign-in-*` flags; see docs/upstreams.md).
    User,
}

impl IdentityMode {
    /// The mode as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Forward => "forward",
            Self::Exchange => "exchange",
            Self::User => "user",
        }
    }
}

/// Which credential calls carry (`Authorization: Bearer ...`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdentitySpec {
    /// `server` (default), `forward`, `exchange` or `user` (remote upstreams only).
    #[serde(default)]
    pub mode: IdentityMode,
    /// The target's name at the issuer (RFC 8707 resource or OAuth audience), e.g. its client
    /// id or URL: `forward` requires the caller's token to list it in `aud`; `exchange` asks
    /// for a token addressed to it. Required by both; not for `user` (the resource is the
    /// upstream's URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Scopes asked for: in the exchange (`exchange`), or when the user signs in (`user`;
    /// without, those the upstream names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// `user` only: the issuer identifier of the one authorization server to sign in at
    /// (any other the upstream names is refused). Required with `client`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// `user` only: a client registered for this server at the upstream's authorization
    /// server beforehand; needs `issuer` (its secret and codes go to that server only).
    /// Without, the server registers itself (Client ID Metadata Document or Dynamic Client
    /// Registration) where the authorization server allows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<UserClientSpec>,
}

/// A client registered out of band at an upstream's authorization server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserClientSpec {
    /// The client id.
    pub id: String,
    /// The client secret of a confidential client, as exactly one Secret reference
    /// `{{secret.NAME.KEY}}` (never literal); leave out for a public client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// A compiled [`UserClientSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserClient {
    /// The client id.
    pub id: Box<str>,
    /// Where its secret is (`None`: a public client).
    pub secret: Option<SecretRef>,
}

/// A compiled `identity` that sends something other than the server's own credential.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// `forward`, `exchange` or `user`.
    pub mode: IdentityMode,
    /// The audience (`user`: the upstream's URL, the resource signed in for).
    pub audience: Box<str>,
    /// Scopes of an exchange or a sign-in, space-separated (empty: none asked for).
    pub scopes: Box<str>,
    /// `user`: the one authorization server to accept.
    pub issuer: Option<Box<str>>,
    /// `user`: the client registered beforehand.
    pub client: Option<UserClient>,
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
/// URL template); `None` for the server's own credential (or a problem). `user` is refused
/// here: it is for remote upstreams ([`compile_upstream`]).
///
/// A token addressed to a resource goes to that resource only: `forward` needs `audience`
/// to be the target's URL (the caller's token is sent as it came, so where it may go is what
/// it names), and a URL `audience` of `exchange` must name the target too. An `exchange`
/// audience that is not a URL (a client id) is the issuer's to grant or refuse.
pub fn compile(spec: &IdentitySpec, at: &str, target: &str, p: &mut Problems) -> Option<Identity> {
    if spec.mode != IdentityMode::User && (spec.issuer.is_some() || spec.client.is_some()) {
        p.push(
            at,
            "`issuer` and `client` are for mode `user` (each user's own sign-in to an upstream)",
        );
    }
    match spec.mode {
        IdentityMode::Server => {
            if spec.audience.is_some() || !spec.scopes.is_empty() {
                p.push(
                    at,
                    "`audience` and `scopes` are for modes `forward`, `exchange` and `user`; `server` sends the server's own credential",
                );
            }
            return None;
        }
        IdentityMode::User => {
            p.push(
                format!("{at}.mode"),
                "`user` (each user's own sign-in at the target's authorization server) is for `http` upstreams: an MCP server announces where its users sign in, an API does not",
            );
            return None;
        }
        IdentityMode::Forward | IdentityMode::Exchange => {}
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
            "a forwarded token carries the scopes it has; `scopes` is for `exchange` and `user`",
        );
    }
    Some(Identity {
        mode: spec.mode,
        audience: audience.into(),
        scopes: scopes(spec, at, p),
        issuer: None,
        client: None,
    })
}

/// The scopes of `spec`, checked, sorted and without repeats, space-separated.
fn scopes(spec: &IdentitySpec, at: &str, p: &mut Problems) -> Box<str> {
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
    scopes.join(" ").into()
}

/// Compiles the `identity` of an upstream at `at`: `target` is its `http.url` (empty for a
/// stdio upstream, which has no headers to carry a token in). Mode `user` is compiled here;
/// the Secret its client's secret reads is added to `secrets`, the upstream's own.
pub fn compile_upstream(
    spec: &IdentitySpec,
    at: &str,
    target: &str,
    p: &mut Problems,
    secrets: &mut Vec<SecretRef>,
) -> Option<Identity> {
    if spec.mode != IdentityMode::User {
        return compile(spec, at, target, p);
    }
    if target.is_empty() {
        p.push(
            format!("{at}.mode"),
            "`user` is for `http` upstreams: a stdio program has no request headers to carry a token in",
        );
        return None;
    }
    if spec.audience.is_some() {
        p.push(
            format!("{at}.audience"),
            "not for `user`: the token is asked for the upstream's own URL (RFC 8707 resource)",
        );
    }
    let issuer = spec.issuer.as_deref().and_then(|i| {
        let ok = plain(i) && origin(i).is_some() && !i.contains(['#', '?']);
        if !ok {
            p.push(
                format!("{at}.issuer"),
                "an authorization server's issuer identifier: an http(s) URL without query or fragment",
            );
        }
        ok.then(|| i.into())
    });
    if spec.client.is_some() && spec.issuer.is_none() {
        p.push(
            format!("{at}.issuer"),
            "required with `client`: a client's secret and codes go only to the authorization server it was registered at, so name that server's issuer identifier (any other server the upstream names is refused)",
        );
    }
    let client = spec
        .client
        .as_ref()
        .and_then(|c| user_client(c, &format!("{at}.client"), p, secrets));
    Some(Identity {
        mode: IdentityMode::User,
        audience: target.into(),
        scopes: scopes(spec, at, p),
        issuer,
        client,
    })
}

/// A pre-registered client: a plain id, and a secret that is exactly one Secret reference.
fn user_client(
    c: &UserClientSpec,
    at: &str,
    p: &mut Problems,
    secrets: &mut Vec<SecretRef>,
) -> Option<UserClient> {
    let mut ok = true;
    if !plain(&c.id) {
        p.push(
            format!("{at}.id"),
            format!("1-{MAX_NAME} printable characters without spaces or quotes"),
        );
        ok = false;
    }
    let secret = match &c.secret {
        None => None,
        Some(text) => {
            let path = format!("{at}.secret");
            let before = p.0.len();
            let mut refs = Vec::new();
            let sole = match Template::compile(Authored::new(text)) {
                Ok(t) => {
                    check_secret_template(&t, &Names::arguments(Vec::new()), &path, p, &mut refs);
                    t.shape() == "{}"
                }
                Err(e) => {
                    p.push(&path, e);
                    false
                }
            };
            match refs.as_slice() {
                [one] if sole && p.0.len() == before => {
                    secrets.push(one.clone());
                    Some(one.clone())
                }
                _ => {
                    if p.0.len() == before {
                        p.push(
                            &path,
                            "must be exactly one Secret reference `{{secret.NAME.KEY}}`: a client secret is never written in the ToolSet",
                        );
                    }
                    ok = false;
                    None
                }
            }
        }
    };
    ok.then(|| UserClient {
        id: c.id.as_str().into(),
        secret,
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

    fn run_upstream(yaml: &str, target: &str) -> (Option<Identity>, Vec<String>, Vec<SecretRef>) {
        let spec: IdentitySpec = serde_saphyr::from_str(yaml).unwrap();
        let (mut p, mut secrets) = (Problems::default(), Vec::new());
        let id = compile_upstream(&spec, "identity", target, &mut p, &mut secrets);
        (id, p.0.iter().map(ToString::to_string).collect(), secrets)
    }

    #[test]
    fn user_is_for_http_upstreams_with_a_client_secret_only_from_a_secret() {
        const URL: &str = "https://api.githubcopilot.com/mcp/";
        let (id, p, secrets) = run_upstream(
            "{mode: user, scopes: [repo, read:org, repo], issuer: \"https://github.com/login/oauth\", client: {id: Iv1.abc, secret: \"{{ secret.github-app.client-secret }}\"}}",
            URL,
        );
        assert!(p.is_empty(), "{p:?}");
        let id = id.unwrap();
        assert_eq!(
            (id.mode, &*id.audience, &*id.scopes),
            (IdentityMode::User, URL, "read:org repo")
        );
        assert_eq!(id.issuer.as_deref(), Some("https://github.com/login/oauth"));
        let client = id.client.unwrap();
        let want = SecretRef {
            name: "github-app".into(),
            key: "client-secret".into(),
        };
        assert_eq!((&*client.id, client.secret.as_ref()), ("Iv1.abc", Some(&want)));
        assert_eq!(secrets, vec![want]);
        // Nothing but the mode: discovery and registration decide the rest.
        let (id, p, _) = run_upstream("{mode: user}", URL);
        assert!(p.is_empty() && id.is_some_and(|i| i.client.is_none() && i.scopes.is_empty()));
        // A public client: no secret.
        let (id, p, secrets) = run_upstream(
            "{mode: user, issuer: \"https://as.example\", client: {id: quiver}}",
            URL,
        );
        assert!(p.is_empty() && secrets.is_empty() && id.unwrap().client.unwrap().secret.is_none());
        for (yaml, want) in [
            (
                "{mode: user, audience: \"https://x.example\"}",
                "identity.audience: not for `user`",
            ),
            ("{mode: user, issuer: \"not a url\"}", "identity.issuer"),
            (
                "{mode: user, issuer: \"https://as.example/?tenant=1\"}",
                "identity.issuer",
            ),
            (
                "{mode: user, issuer: \"https://as.example\", client: {id: \"a b\"}}",
                "identity.client.id",
            ),
            (
                "{mode: user, client: {id: q, secret: plaintext}}",
                "exactly one Secret reference",
            ),
            (
                "{mode: user, client: {id: q, secret: \"x{{secret.a.b}}\"}}",
                "exactly one Secret reference",
            ),
            (
                "{mode: user, client: {id: q, secret: \"{{secret.a.b}}{{secret.a.c}}\"}}",
                "exactly one Secret reference",
            ),
            (
                "{mode: user, client: {id: q, secret: \"{{secret.a}}\"}}",
                "identity.client.secret",
            ),
            ("{mode: user, scopes: [\"a b\"]}", "identity.scopes[0]"),
            // A client without the server it was registered at: its secret would go to
            // whichever server the upstream names.
            (
                "{mode: user, client: {id: q}}",
                "identity.issuer: required with `client`",
            ),
        ] {
            let (_, p, secrets) = run_upstream(yaml, URL);
            assert!(p.iter().any(|m| m.contains(want)), "{yaml}: {p:?}");
            assert!(secrets.is_empty(), "{yaml}: {secrets:?}");
        }
        let (_, p, _) = run_upstream("{mode: user, client: {id: q, secret: \"{{secret.a.b}}\"}}", URL);
        assert!(
            p.iter()
                .any(|m| m.contains("identity.issuer: required with `client`")),
            "{p:?}"
        );
        assert!(serde_saphyr::from_str::<IdentitySpec>("{mode: user, client: {id: q, other: 1}}").is_err());
        // A stdio upstream, an http tool: refused with what `user` is for.
        let (id, p, _) = run_upstream("{mode: user}", "");
        assert!(
            id.is_none() && p[0].contains("`user` is for `http` upstreams"),
            "{p:?}"
        );
        let (id, p) = run("{mode: user}");
        assert!(id.is_none() && p[0].contains("is for `http` upstreams"), "{p:?}");
        // `issuer` and `client` belong to `user`.
        let (_, p) = run("{mode: exchange, audience: notes, issuer: \"https://as.example\"}");
        assert!(p[0].contains("are for mode `user`"), "{p:?}");
        let (_, p, _) = run_upstream("{client: {id: q}}", URL);
        assert!(p[0].contains("are for mode `user`"), "{p:?}");
    }
}

//! Security schemes of an OpenAPI source: which of the document's schemes
//! (`components.securitySchemes`, Swagger 2.0 `securityDefinitions`) an operation uses, and
//! the request parts that carry its credential, read from Secrets.
//!
//! An API key or bearer token becomes a header, query or cookie template reading the Secret,
//! so it is checked, read, redacted and granted (the pods' Role) like any http tool's Secret;
//! HTTP basic and OAuth2 client credentials are built per call
//! ([`crate::handlers::http::auth`]). The document's text (a parameter's name, a token URL)
//! is literal in these templates: it never reads a Secret.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::document::{Version, deref, shown};
use crate::handlers::http::auth::{Auth, OAuth2};
use crate::spec::context::{Problems, SECRET_ROOT, SecretRef, valid_secret_part};
use crate::template::{Filter, Template};

/// At most this many entries in `security`.
pub const MAX_SCHEMES: usize = 16;
/// Alternatives of an operation's `security` considered (the rest are ignored).
const MAX_ALTERNATIVES: usize = 32;

/// Where the credential of one of the document's security schemes comes from: a Secret and
/// the keys of it that the scheme needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchemeCredential {
    /// The Secret holding the credential (in the namespace of the McpServer).
    pub secret: String,
    /// The key of the API key (`apiKey`) or of the token (`http` `bearer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key of the user name (`http` `basic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_key: Option<String>,
    /// The key of the password (`http` `basic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_key: Option<String>,
    /// The key of the client id (`oauth2` client credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id_key: Option<String>,
    /// The key of the client secret (`oauth2` client credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_key: Option<String>,
    /// The token endpoint (`oauth2`), instead of the flow's `tokenUrl` in the document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_url: Option<String>,
    /// Scopes requested (`oauth2`); default: those the operation's requirement lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    /// Accept an `http` token endpoint (`oauth2`): the client secret then travels in clear
    /// text. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
}

/// What the compile step knows of where a source's document came from: a document read
/// from `url` or `configMap` chooses no credential's destination.
#[derive(Debug, Clone, Default)]
pub(super) struct Trust {
    /// The document was read from `url` or `configMap`.
    pub fetched: bool,
    /// The origin requests go to (`scheme://authority`, lower case).
    pub origin: String,
}

/// The token endpoint of a client credentials grant: the author's `tokenUrl`, else the
/// document's when it is at the server's origin (or the document is the author's own).
///
/// # Errors
/// No usable token URL, one of another origin given by a fetched document, or an `http`
/// one without `allowHttp`.
fn token_endpoint<'a>(
    c: &'a SchemeCredential,
    from_doc: Option<&'a str>,
    trust: &Trust,
) -> Result<&'a str, String> {
    let (url, doc) = match (&c.token_url, from_doc) {
        (Some(u), _) => (u.as_str(), false),
        (None, Some(u)) => (u, true),
        (None, None) => return Err("the document gives no `tokenUrl`; set `tokenUrl`".to_owned()),
    };
    if let Err(e) = check_token_url(url) {
        return Err(if doc {
            format!("the document's tokenUrl `{}` {e}; set `tokenUrl`", shown(url))
        } else {
            e.to_owned()
        });
    }
    if doc && trust.fetched && super::origin_of(url).as_deref() != Some(trust.origin.as_str()) {
        return Err(format!(
            "the document's tokenUrl `{}` is not at the server's origin `{}`: a document read from \
             `url` or `configMap` does not choose where the client secret goes; set `tokenUrl`",
            shown(url),
            shown(&trust.origin)
        ));
    }
    if url.starts_with("http://") && !c.allow_http {
        return Err(format!(
            "`{}` is an `http` token URL, which sends the client secret in clear text; use https, or set `allowHttp: true`",
            shown(url)
        ));
    }
    Ok(url)
}

/// The credential parts of an operation's request.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// Header name and value template.
    pub headers: Vec<(String, Template)>,
    /// `name=value` pairs appended to the URL's query.
    pub query: Vec<Template>,
    /// `name=value` pairs of the `Cookie` header.
    pub cookies: Vec<Template>,
    /// A credential built per call.
    pub auth: Option<Auth>,
}

/// What a scheme of the document is, as far as Quiver applies it.
enum Kind<'a> {
    ApiKey { name: &'a str, place: &'a str },
    Bearer,
    Basic,
    ClientCredentials { token_url: Option<&'a str> },
    Unsupported(String),
}

/// The schemes the document declares.
pub(super) fn schemes(root: &Value, version: Version) -> Option<&Map<String, Value>> {
    if version == Version::Swagger2 {
        root.get("securityDefinitions")?.as_object()
    } else {
        root.get("components")?.get("securitySchemes")?.as_object()
    }
}

fn kind<'a>(root: &'a Value, scheme: &'a Value) -> Kind<'a> {
    let Ok(scheme) = deref(root, scheme) else {
        return Kind::Unsupported("an unresolvable `$ref`".to_owned());
    };
    let s = |k: &str| scheme.get(k).and_then(Value::as_str);
    match s("type").unwrap_or_default() {
        "apiKey" => match (s("name"), s("in")) {
            (Some(name), Some(place @ ("header" | "query" | "cookie"))) if !name.is_empty() => {
                Kind::ApiKey { name, place }
            }
            _ => Kind::Unsupported("an apiKey scheme without a `name` in header, query or cookie".to_owned()),
        },
        "basic" => Kind::Basic,
        "http" => match s("scheme").map(str::to_ascii_lowercase).as_deref() {
            Some("bearer") => Kind::Bearer,
            Some("basic") => Kind::Basic,
            other => Kind::Unsupported(format!("http scheme `{}`", shown(other.unwrap_or("")))),
        },
        "oauth2" => {
            // 3.x: flows.clientCredentials.tokenUrl; 2.0: flow "application" with tokenUrl.
            let flow = scheme
                .get("flows")
                .and_then(|f| f.get("clientCredentials"))
                .or_else(|| (s("flow") == Some("application")).then_some(scheme));
            match flow {
                Some(f) => Kind::ClientCredentials {
                    token_url: f.get("tokenUrl").and_then(Value::as_str),
                },
                None => Kind::Unsupported("an oauth2 scheme without a client credentials flow".to_owned()),
            }
        }
        other => Kind::Unsupported(format!("type `{}`", shown(other))),
    }
}

fn key_ref(c: &SchemeCredential, key: Option<&String>) -> Option<SecretRef> {
    Some(SecretRef {
        name: c.secret.clone(),
        key: key?.clone(),
    })
}

/// Every Secret value `security` names (what the pods must be allowed to read even before
/// the document is fetched).
pub(super) fn refs(security: &BTreeMap<String, SchemeCredential>) -> Vec<SecretRef> {
    let mut out = Vec::new();
    for c in security.values() {
        for k in [
            &c.key,
            &c.username_key,
            &c.password_key,
            &c.client_id_key,
            &c.client_secret_key,
        ] {
            if let Some(r) = key_ref(c, k.as_ref()) {
                out.push(r);
            }
        }
    }
    out
}

/// Problems of `security` that need no document: names of Secrets and keys, and limits.
pub(super) fn check_spec(security: &BTreeMap<String, SchemeCredential>, at: &str, p: &mut Problems) {
    if security.len() > MAX_SCHEMES {
        p.push(
            format!("{at}.security"),
            format!("{} schemes; at most {MAX_SCHEMES}", security.len()),
        );
        return;
    }
    for (name, c) in security {
        let here = format!("{at}.security.{name}");
        if !valid_secret_part(&c.secret) {
            p.push(
                format!("{here}.secret"),
                "not a Secret name (letters, digits, `-`, `_`)",
            );
        }
        for (field, k) in [
            ("key", &c.key),
            ("usernameKey", &c.username_key),
            ("passwordKey", &c.password_key),
            ("clientIdKey", &c.client_id_key),
            ("clientSecretKey", &c.client_secret_key),
        ] {
            if k.as_ref().is_some_and(|k| !valid_secret_part(k)) {
                p.push(
                    format!("{here}.{field}"),
                    "not a Secret key (letters, digits, `-`, `_`)",
                );
            }
        }
        if let Some(u) = &c.token_url
            && let Err(e) = check_token_url(u)
        {
            p.push(format!("{here}.tokenUrl"), e);
        }
        if c.scopes.as_ref().is_some_and(|s| {
            s.len() > 64 || s.iter().any(|s| s.is_empty() || s.len() > 256 || !scope_chars(s))
        }) {
            p.push(
                format!("{here}.scopes"),
                "at most 64 scopes of 1-256 printable characters without spaces",
            );
        }
    }
}

fn scope_chars(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

/// A token URL must be an absolute `http(s)` URL without credentials or fragment.
fn check_token_url(u: &str) -> Result<(), &'static str> {
    let rest = u
        .strip_prefix("https://")
        .or_else(|| u.strip_prefix("http://"))
        .ok_or("must be an `https` (or `http`) URL")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if u.len() > 2048 || authority.is_empty() || authority.contains('@') || u.contains('#') {
        return Err("an absolute URL of at most 2048 characters, with a host and no credentials or fragment");
    }
    if u.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("has spaces or control characters");
    }
    Ok(())
}

/// Problems of `security` against the document: every scheme named is declared, supported,
/// and given the keys it needs; an API key header is not also in `headers`.
pub(super) fn check_against(
    security: &BTreeMap<String, SchemeCredential>,
    headers: &BTreeMap<String, String>,
    doc: (&Value, Version),
    trust: &Trust,
    at: &str,
    p: &mut Problems,
) {
    let (root, version) = doc;
    let declared = schemes(root, version);
    for (name, c) in security {
        let here = format!("{at}.security.{name}");
        let Some(scheme) = declared.and_then(|d| d.get(name)) else {
            p.push(here, "the document declares no security scheme of this name");
            continue;
        };
        let missing = |fields: &[(&str, &Option<String>)]| {
            fields
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(f, _)| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let k = kind(root, scheme);
        let sets = match &k {
            Kind::ApiKey {
                name,
                place: "header",
            } => Some(*name),
            Kind::Bearer | Kind::Basic | Kind::ClientCredentials { .. } => Some("Authorization"),
            _ => None,
        };
        if let Some(h) = sets.filter(|h| headers.keys().any(|k| k.eq_ignore_ascii_case(h))) {
            p.push(
                &here,
                format!(
                    "`headers` sets `{}` too, which this scheme sets; remove it there",
                    shown(h)
                ),
            );
        }
        let need = match k {
            Kind::ApiKey { .. } => missing(&[("key", &c.key)]),
            Kind::Bearer => missing(&[("key", &c.key)]),
            Kind::Basic => missing(&[("usernameKey", &c.username_key), ("passwordKey", &c.password_key)]),
            Kind::ClientCredentials { token_url } => {
                // The author's own `tokenUrl` was checked by `check_spec`, but for `allowHttp`.
                if let Err(e) = token_endpoint(c, token_url, trust) {
                    p.push(&here, e);
                }
                missing(&[
                    ("clientIdKey", &c.client_id_key),
                    ("clientSecretKey", &c.client_secret_key),
                ])
            }
            Kind::Unsupported(what) => {
                p.push(&here, format!("{what} is not supported"));
                continue;
            }
        };
        if !need.is_empty() {
            p.push(here, format!("this scheme needs {need}"));
        }
    }
}

/// The requirement that applies to an operation: its own `security`, else the document's.
fn requirements<'a>(root: &'a Value, op: &'a Map<String, Value>) -> Option<&'a Vec<Value>> {
    op.get("security")
        .or_else(|| root.get("security"))
        .and_then(Value::as_array)
}

/// The credential parts of an operation's request: of the first alternative of its
/// requirement whose schemes all have a credential. With no `security` given, none (the
/// source's `headers` carry what the API needs). An operation whose requirement no
/// configured alternative meets is refused, naming what it requires.
pub(super) fn resolve(
    security: &BTreeMap<String, SchemeCredential>,
    doc: (&Value, Version),
    trust: &Trust,
    op: &Map<String, Value>,
) -> Result<Applied, String> {
    let (root, version) = doc;
    let Some(alternatives) = requirements(root, op) else {
        return Ok(Applied::default());
    };
    if security.is_empty() || alternatives.is_empty() {
        return Ok(Applied::default());
    }
    let declared = schemes(root, version);
    let mut wanted = Vec::new();
    for alt in alternatives.iter().take(MAX_ALTERNATIVES) {
        let Some(alt) = alt.as_object() else { continue };
        if alt.keys().all(|k| security.contains_key(k)) {
            let mut out = Applied::default();
            for (name, scopes) in alt {
                let scheme = declared.and_then(|d| d.get(name)).unwrap_or(&Value::Null);
                apply(name, &security[name], (root, scheme), scopes, trust, &mut out)?;
            }
            return Ok(out);
        }
        let names: Vec<String> = alt.keys().take(4).map(|k| format!("`{}`", shown(k))).collect();
        wanted.push(names.join(" + "));
    }
    Err(format!(
        "requires the security scheme {}, which `security` gives no credential for (add it, or exclude the operation)",
        wanted.join(" or ")
    ))
}

/// The template of a Secret value, trimmed, then `filters`: `{{secret.NAME.KEY | trim ...}}`.
fn secret_value(
    c: &SchemeCredential,
    key: Option<&String>,
    prefix: &str,
    filters: &[Filter],
) -> Result<Template, String> {
    let key = key.map_or("", String::as_str);
    Template::builder()
        .lit(prefix)
        .var(&[SECRET_ROOT, &c.secret, key], filters)
        .map(crate::template::TemplateBuilder::build)
}

/// Adds the parts of one scheme's credential to `out`; `doc` is the document's root and the
/// scheme's object.
fn apply(
    name: &str,
    c: &SchemeCredential,
    doc: (&Value, &Value),
    scopes: &Value,
    trust: &Trust,
    out: &mut Applied,
) -> Result<(), String> {
    let (root, scheme) = doc;
    match kind(root, scheme) {
        Kind::ApiKey {
            name: n,
            place: "query",
        } => {
            // The value is percent-encoded as the URL is rendered.
            let pair = format!("{}=", encode(n));
            out.query
                .push(secret_value(c, c.key.as_ref(), &pair, &[Filter::Trim])?);
        }
        Kind::ApiKey {
            name: n,
            place: "cookie",
        } => {
            let pair = format!("{}=", encode(n));
            out.cookies.push(secret_value(
                c,
                c.key.as_ref(),
                &pair,
                &[Filter::Trim, Filter::Url],
            )?);
        }
        Kind::ApiKey { name: n, .. } => out.headers.push((
            n.to_owned(),
            secret_value(c, c.key.as_ref(), "", &[Filter::Trim])?,
        )),
        Kind::Bearer => out.headers.push((
            "Authorization".to_owned(),
            secret_value(c, c.key.as_ref(), "Bearer ", &[Filter::Trim])?,
        )),
        Kind::Basic => {
            out.auth = Some(Auth::Basic {
                user: key_ref(c, c.username_key.as_ref()).ok_or("no usernameKey")?,
                password: key_ref(c, c.password_key.as_ref()).ok_or("no passwordKey")?,
            });
        }
        Kind::ClientCredentials { token_url } => {
            let url = token_endpoint(c, token_url, trust)
                .map_err(|e| format!("security scheme `{}`: {e}", shown(name)))?;
            let scopes: Vec<String> = match &c.scopes {
                Some(s) => s.clone(),
                // A fetched document does not choose what the author's client asks for: no
                // scope is sent, and the token endpoint grants the client's defaults.
                None if trust.fetched => Vec::new(),
                None => scopes
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .filter(|s| !s.is_empty() && s.len() <= 256 && scope_chars(s))
                    .take(64)
                    .map(str::to_owned)
                    .collect(),
            };
            out.auth = Some(Auth::OAuth2(std::sync::Arc::new(OAuth2::new(
                url.to_owned(),
                key_ref(c, c.client_id_key.as_ref()).ok_or("no clientIdKey")?,
                key_ref(c, c.client_secret_key.as_ref()).ok_or("no clientSecretKey")?,
                scopes.join(" "),
            ))));
        }
        Kind::Unsupported(what) => {
            return Err(format!(
                "security scheme `{}`: {what} is not supported",
                shown(name)
            ));
        }
    }
    Ok(())
}

/// Percent-encodes all but unreserved characters (a parameter or cookie name).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
#[path = "security_tests.rs"]
mod tests;

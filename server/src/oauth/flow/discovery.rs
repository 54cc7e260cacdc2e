//! Discovery: from an upstream's URL to the authorization server its users sign in at.
//!
//! The protected resource metadata (RFC 9728) comes from the `resource_metadata` of the
//! upstream's `Bearer` challenge when there is one, else from its well-known URL with the
//! path inserted, then the root one; its `resource` must be the upstream (section 3.3). Of its
//! `authorization_servers`, the configured one (or the first that answers well) is used; that
//! server's metadata is read from the RFC 8414 well-known URL, then OpenID discovery's two
//! forms (the order of the MCP authorization specification); its `issuer` must be the
//! server's identifier (RFC 8414 section 3.3) and it must support PKCE with `S256`.

use std::sync::Arc;

use http::Uri;
use serde_json::Value;

use super::challenge::{Challenge, scope_ok};
use super::wire::{self, canonical, origin, parse_url, scheme_ok, well_known};
use super::{Error, Flow, MAX_SCOPE, MAX_URL, Result, Upstream};
use crate::net::http::redacted;

/// Most authorization servers of one upstream tried.
const MAX_SERVERS: usize = 4;
/// Most client authentication methods kept of a server's metadata.
const MAX_METHODS: usize = 16;

/// What Quiver uses of an upstream's protected resource metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceMetadata {
    /// The resource the metadata is for: the upstream, canonical.
    pub resource: String,
    /// Its authorization servers' identifiers (at most a few, well-formed URLs only).
    pub authorization_servers: Vec<String>,
    /// `scopes_supported`, space-separated (well-formed scope tokens, bounded).
    pub scopes_supported: Option<String>,
}

/// What Quiver uses of an authorization server's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMetadata {
    /// The server's identifier, equal to the one the upstream named.
    pub issuer: String,
    /// Where users are sent to sign in.
    pub authorization_endpoint: String,
    /// Where codes and refresh tokens are exchanged.
    pub token_endpoint: String,
    /// Where clients register themselves (RFC 7591), when the server allows it.
    pub registration_endpoint: Option<String>,
    /// Where tokens are revoked (RFC 7009), when the server says.
    pub revocation_endpoint: Option<String>,
    /// Whether a client id may be the URL of a client metadata document.
    pub client_id_metadata_document_supported: bool,
    /// Whether the server puts `iss` in its redirects (RFC 9207).
    pub authorization_response_iss_parameter_supported: bool,
    /// `token_endpoint_auth_methods_supported` (empty: not said).
    pub token_endpoint_auth_methods_supported: Vec<String>,
}

/// Where an upstream's users sign in.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// The upstream's protected resource metadata.
    pub resource: Arc<ResourceMetadata>,
    /// The authorization server chosen and its metadata.
    pub server: Arc<ServerMetadata>,
    /// The scopes to ask for: the upstream's configured ones, else those of its challenge,
    /// else all it lists as supported; `None`: ask for none.
    pub scope: Option<String>,
}

/// Why one URL of a discovery gave nothing usable, for the error when none did.
fn attempts_error(what: &str, tried: &[String]) -> Error {
    Error::Discovery(format!("no {what}: {}", tried.join("; ")))
}

fn object(body: &[u8], shown: &str) -> Result<serde_json::Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        _ => Err(Error::Discovery(format!("{shown} is not a JSON object"))),
    }
}

/// The upstream's protected resource metadata, checked against it.
pub(super) fn read_resource(body: &[u8], shown: &str, upstream: &Uri) -> Result<ResourceMetadata> {
    let doc = object(body, shown)?;
    let resource = doc
        .get("resource")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::Discovery(format!("{shown} names no `resource`")))?;
    let named = parse_url(resource)
        .map_err(|_| Error::Discovery(format!("the `resource` of {shown} is not a usable URL")))?;
    if canonical(&named) != canonical(upstream) {
        return Err(Error::Discovery(format!(
            "{shown} is the metadata of {}, not of the upstream {} (RFC 9728 section 3.3)",
            redacted(&named),
            redacted(upstream)
        )));
    }
    let servers: Vec<String> = doc
        .get("authorization_servers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|s| parse_url(s).is_ok_and(|u| u.query().is_none()))
        .take(MAX_SERVERS)
        .map(str::to_owned)
        .collect();
    if servers.is_empty() {
        return Err(Error::Discovery(format!(
            "{shown} names no usable `authorization_servers`"
        )));
    }
    let mut scopes = String::new();
    for s in doc
        .get("scopes_supported")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|s| !s.contains(' ') && scope_ok(s))
    {
        if scopes.len() + 1 + s.len() > MAX_SCOPE {
            break;
        }
        if !scopes.is_empty() {
            scopes.push(' ');
        }
        scopes.push_str(s);
    }
    Ok(ResourceMetadata {
        resource: canonical(upstream),
        authorization_servers: servers,
        scopes_supported: (!scopes.is_empty()).then_some(scopes),
    })
}

/// An endpoint of a server's metadata: a URL, `https` unless the issuer itself is `http`.
fn endpoint(doc: &serde_json::Map<String, Value>, key: &str, issuer: &Uri) -> Option<String> {
    let plain_ok = issuer.scheme_str() == Some("http");
    doc.get(key)
        .and_then(Value::as_str)
        .filter(|s| s.len() <= MAX_URL && parse_url(s).is_ok_and(|u| scheme_ok(&u, plain_ok)))
        .map(str::to_owned)
}

fn strings<'a>(doc: &'a serde_json::Map<String, Value>, key: &str) -> Option<Vec<&'a str>> {
    doc.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
}

/// An authorization server's metadata, checked against the identifier it was read for.
pub(super) fn read_server(
    body: &[u8],
    shown: &str,
    issuer: &str,
    issuer_uri: &Uri,
) -> Result<ServerMetadata> {
    let doc = object(body, shown)?;
    if doc.get("issuer").and_then(Value::as_str) != Some(issuer) {
        return Err(Error::Discovery(format!(
            "{shown} names another issuer than {} (RFC 8414 section 3.3)",
            redacted(issuer_uri)
        )));
    }
    let need = |key: &str| {
        endpoint(&doc, key, issuer_uri).ok_or_else(|| {
            Error::Discovery(format!(
                "{shown} names no usable `{key}` (an https URL, or http when the issuer is)"
            ))
        })
    };
    let authorization_endpoint = need("authorization_endpoint")?;
    let token_endpoint = need("token_endpoint")?;
    if !strings(&doc, "code_challenge_methods_supported").is_some_and(|m| m.contains(&"S256")) {
        return Err(Error::Discovery(format!(
            "{} does not say it supports PKCE with S256 (`code_challenge_methods_supported`): \
             the MCP authorization specification forbids signing in there",
            redacted(issuer_uri)
        )));
    }
    for (key, needed) in [
        ("response_types_supported", "code"),
        ("grant_types_supported", "authorization_code"),
    ] {
        if strings(&doc, key).is_some_and(|v| !v.contains(&needed)) {
            return Err(Error::Discovery(format!(
                "{} does not support `{needed}` (`{key}`)",
                redacted(issuer_uri)
            )));
        }
    }
    let flag = |key: &str| doc.get(key).and_then(Value::as_bool) == Some(true);
    Ok(ServerMetadata {
        issuer: issuer.to_owned(),
        authorization_endpoint,
        token_endpoint,
        registration_endpoint: endpoint(&doc, "registration_endpoint", issuer_uri),
        revocation_endpoint: endpoint(&doc, "revocation_endpoint", issuer_uri),
        client_id_metadata_document_supported: flag("client_id_metadata_document_supported"),
        authorization_response_iss_parameter_supported: flag(
            "authorization_response_iss_parameter_supported",
        ),
        token_endpoint_auth_methods_supported: strings(&doc, "token_endpoint_auth_methods_supported")
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.len() <= 64)
            .take(MAX_METHODS)
            .map(str::to_owned)
            .collect(),
    })
}

impl Flow {
    /// Where the users of `upstream` sign in. `challenge`: the `WWW-Authenticate` value of
    /// the upstream's `401`, when there was one.
    ///
    /// # Errors
    /// The upstream's URL or scopes are unusable ([`Error::Config`]), no metadata could be
    /// read, or what was read is refused ([`Error::Discovery`]).
    pub async fn discover(&self, upstream: &Upstream, challenge: Option<&str>) -> Result<Discovered> {
        let up = parse_url(&upstream.url).map_err(|e| Error::Config(format!("the upstream's URL: {e}")))?;
        if let Some(s) = &upstream.scope
            && !scope_ok(s)
        {
            return Err(Error::Config(
                "the upstream's scope is not a list of scope tokens".into(),
            ));
        }
        let challenge = challenge.and_then(Challenge::parse).unwrap_or_default();
        let trusted = upstream.trusted();
        // Every exchange is timed out; the whole walk is too (several URLs, several servers).
        let limit = self.cfg.timeout * 4;
        let walk = async {
            let resource = self.resource_metadata(&up, &challenge, &trusted).await?;
            let server = self.pick_server(upstream, &up, &resource, &trusted).await?;
            Ok::<_, Error>((resource, server))
        };
        let (resource, server) = tokio::time::timeout(limit, walk).await.unwrap_or_else(|_| {
            Err(Error::Unreachable(format!(
                "discovery for {} took longer than {limit:?}",
                redacted(&up)
            )))
        })?;
        let scope = upstream
            .scope
            .clone()
            .or(challenge.scope)
            .or_else(|| resource.scopes_supported.clone());
        Ok(Discovered {
            resource,
            server,
            scope,
        })
    }

    async fn resource_metadata(
        &self,
        up: &Uri,
        challenge: &Challenge,
        trusted: &[String],
    ) -> Result<Arc<ResourceMetadata>> {
        let plain_ok = up.scheme_str() == Some("http");
        let urls = match &challenge.resource_metadata {
            Some(given) => {
                let u = parse_url(given)
                    .ok()
                    .filter(|u| scheme_ok(u, plain_ok))
                    .ok_or_else(|| {
                        Error::Discovery(
                            "the upstream's challenge names an unusable `resource_metadata` URL".into(),
                        )
                    })?;
                vec![u]
            }
            None => {
                let mut urls = vec![well_known(up, "oauth-protected-resource", false)];
                let root = format!("{}/.well-known/oauth-protected-resource", origin(up));
                if urls[0] != root {
                    urls.push(root);
                }
                urls.iter().filter_map(|u| parse_url(u).ok()).collect()
            }
        };
        let key = format!(
            "{}|{}",
            canonical(up),
            urls.first().map(Uri::to_string).unwrap_or_default()
        );
        if let Some(found) = self.resources.get(&key) {
            return Ok(found);
        }
        let mut tried = Vec::new();
        for u in &urls {
            let shown = redacted(u);
            match self.get(u, self.guard(u, trusted)).await {
                Ok(a) if a.status.is_success() => {
                    let found = Arc::new(read_resource(&a.body, &shown, up)?);
                    self.resources.put(key, found.clone());
                    return Ok(found);
                }
                Ok(a) => tried.push(format!("{shown} answered {}", a.status)),
                Err(e) => tried.push(e.to_string()),
            }
        }
        Err(attempts_error("protected resource metadata", &tried))
    }

    async fn pick_server(
        &self,
        upstream: &Upstream,
        up: &Uri,
        resource: &ResourceMetadata,
        trusted: &[String],
    ) -> Result<Arc<ServerMetadata>> {
        let candidates: Vec<&String> = match &upstream.issuer {
            Some(pinned) => {
                let named = resource.authorization_servers.iter().find(|s| *s == pinned);
                vec![named.ok_or_else(|| {
                    Error::Discovery(format!(
                        "the upstream does not name the configured authorization server among its \
                         `authorization_servers` ({})",
                        resource.authorization_servers.len()
                    ))
                })?]
            }
            None => resource.authorization_servers.iter().collect(),
        };
        let mut failed = Vec::new();
        for issuer in candidates {
            match self.server_metadata(issuer, up, trusted).await {
                Ok(m) => return Ok(m),
                Err(e) => failed.push(e.to_string()),
            }
        }
        Err(Error::Discovery(format!(
            "no usable authorization server: {}",
            failed.join("; ")
        )))
    }

    /// The metadata of the authorization server `issuer` (cached by issuer), read for the
    /// resource `up` (an `http` one may name `http` servers); calls off the `trusted`
    /// origins are guarded.
    pub(super) async fn server_metadata(
        &self,
        issuer: &str,
        up: &Uri,
        trusted: &[String],
    ) -> Result<Arc<ServerMetadata>> {
        let plain_ok = up.scheme_str() == Some("http");
        let iu = parse_url(issuer)
            .ok()
            .filter(|u| scheme_ok(u, plain_ok) && u.query().is_none())
            .ok_or_else(|| {
                Error::Discovery(
                    "an authorization server identifier is not an https URL without query".into(),
                )
            })?;
        if let Some(found) = self.servers.get(issuer) {
            return Ok(found);
        }
        let has_path = !iu.path().trim_end_matches('/').is_empty();
        let mut urls = vec![
            well_known(&iu, "oauth-authorization-server", false),
            well_known(&iu, "openid-configuration", false),
        ];
        if has_path {
            urls.push(well_known(&iu, "openid-configuration", true));
        }
        let mut tried = Vec::new();
        for u in urls.iter().filter_map(|u| wire::parse_url(u).ok()) {
            let shown = redacted(&u);
            match self.get(&u, self.guard(&u, trusted)).await {
                Ok(a) if a.status.is_success() => {
                    let found = Arc::new(read_server(&a.body, &shown, issuer, &iu)?);
                    self.servers.put(issuer.to_owned(), found.clone());
                    return Ok(found);
                }
                Ok(a) => tried.push(format!("{shown} answered {}", a.status)),
                Err(e) => tried.push(e.to_string()),
            }
        }
        Err(attempts_error("authorization server metadata", &tried))
    }
}

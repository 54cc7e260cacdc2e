//! OpenAPI sources: every operation of an OpenAPI 3.0/3.1 (or Swagger 2.0) document becomes
//! an `http` tool, compiled into the same form as a hand-written one, so a call costs the
//! same and carries the same Secrets, TLS and caller identity.
//!
//! This module owns the declaration (`openapi:` of a ToolSet) and its compilation; the
//! document is parsed and bounded by `document`, schemas are converted by `schema`, and each
//! operation is compiled by `operation`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::upstream::{Glob, ImportSpec};
use crate::handlers::http::TlsSpec;
use crate::spec::identity::IdentitySpec;

mod document;
mod operation;
pub use operation::compile;
mod pin;
pub use pin::PinnedSource;
mod schema;
mod security;
pub use security::{MAX_SCHEMES, SchemeCredential};

pub use document::{MAX_OPENAPI_BYTES, MAX_OPENAPI_DEPTH, MAX_OPERATIONS};
pub use schema::MAX_DEFS;

/// At most this many `openapi` sources per ToolSet.
pub const MAX_OPENAPI_SOURCES: usize = 16;

/// An OpenAPI document whose operations are served as http tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenApiSpec {
    /// 1-63 characters of `a-z 0-9 -`, starting with a letter; names the source in errors.
    pub name: String,
    /// The document itself, JSON or YAML text. Exclusive with `file` and `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<String>,
    /// A file holding the document, read by quiver-server whenever it loads the config.
    /// Exclusive with `document` and `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// An `https` URL the document is fetched from whenever quiver-server loads the config
    /// (and every `fetch.refresh`), e.g.
    /// `https://kubernetes.default.svc/openapi/v3/api/v1`. At most 16 MiB, redirects refused;
    /// a fetch that fails keeps the tools serving as they are. Exclusive with `document` and
    /// `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A ConfigMap key holding the document, e.g. `{name: petstore-api, key: openapi.yaml}`:
    /// read through the server's Secret and ConfigMap source (in a cluster, the watch of its
    /// namespace), so an edit of the ConfigMap swaps the tools. Exclusive with `document`,
    /// `file` and `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKey>,
    /// How `url` is fetched: the CA to trust, the token to present, the time limit and the
    /// refresh interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch: Option<FetchSpec>,
    /// The base URL requests go to (`http` or `https`, literal), instead of the document's
    /// first `servers` entry. Needed when the document names no server or a relative one,
    /// and (or `allowedOrigins`) when a document read from `url` or `configMap` gets
    /// credentials: such a document never chooses where they go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Origins requests may go to, as `scheme://host[:port]` (e.g.
    /// `[https://api.example.com]`): the server the document names (or `server`) must be one
    /// of them. With it, a document read from `url` or `configMap` may choose among these
    /// servers and its operations may carry credentials; without it (and without `server`)
    /// such a document's operations carry none, and their server may not be this host, a
    /// link-local or a cloud metadata address. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub allowed_origins: Vec<String>,
    /// Which entry of the document's `servers` requests go to when `server` is unset
    /// (default 0, the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_index: Option<u32>,
    /// Values of the chosen server's variables (e.g. `region: us`), instead of their
    /// defaults; a value must be one the variable's `enum` allows.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_variables: BTreeMap<String, String>,
    /// The URL the document was fetched from (set by the fetch, never by hand): a relative
    /// server URL, or none, means requests go where the document is served.
    #[serde(skip)]
    #[schemars(skip)]
    pub fetched_from: Option<String>,
    /// The document was read from `url` or `configMap` (set by quiver-server when it reads
    /// it, never by hand): its text is not this ToolSet author's, so it chooses no
    /// credential's destination.
    #[serde(skip)]
    #[schemars(skip)]
    pub fetched: bool,
    /// Headers of every request; values are templates that may read Secrets and the caller's
    /// claims, e.g. `Authorization: "Bearer {{secret.api.token}}"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// TLS towards a server of a private CA, optionally with a client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// Which credential the requests carry as `Authorization: Bearer ...`, as for http tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentitySpec>,
    /// Credentials of the document's security schemes (`components.securitySchemes`, Swagger
    /// 2.0 `securityDefinitions`), by scheme name: each operation carries those of the first
    /// alternative of its `security` requirement that is given here. Once set, an operation
    /// that requires a scheme not given here is refused (a problem naming it). See
    /// docs/openapi.md.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub security: BTreeMap<String, SchemeCredential>,
    /// Time limit of each request (default 10s, at most 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Largest response body accepted, in bytes (default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// Which operations are served, besides `tools.include`/`tools.exclude` (which match
    /// operationIds).
    #[serde(default, skip_serializing_if = "OperationFilter::is_empty")]
    pub operations: OperationFilter,
    /// Which operations are served (`include`/`exclude` match operationIds), under which
    /// names (`prefix`, `rename` by operationId), with which descriptions and annotations,
    /// to whom, under which limits: as for an upstream's tools.
    #[serde(default, skip_serializing_if = "ImportSpec::is_empty")]
    pub tools: ImportSpec,
    /// Per operation (by operationId, as `tools.rename`): the fields of its JSON answer
    /// kept, as an http tool's `project`, e.g.
    /// `listCoreV1NamespacedPod: [items[].metadata.name, items[].status.phase]`. The
    /// tool's output schema is projected alike (or left out when it cannot be).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub project: BTreeMap<String, Vec<String>>,
    /// Pinned operations, for a document read from `url` or `configMap` that someone else
    /// may change: `warn` or `enforce` records what the document says of each served
    /// operation (its description, input and output schemas, method, path, server and
    /// security) when first read; an operation that changes later, or appears later, awaits
    /// approval (`kubectl quiver approve NAME --upstream openapi.SOURCE`). `enforce` does
    /// not list its tool and refuses its calls meanwhile; `warn` serves it and reports it.
    /// Default `off`. See docs/pinning.md.
    #[serde(default, skip_serializing_if = "super::upstream::is_off")]
    pub pin: super::upstream::pin::PinMode,
}

/// A key of a ConfigMap in the server's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKey {
    /// The ConfigMap's name.
    pub name: String,
    /// The key holding the document.
    pub key: String,
}

impl ConfigMapKey {
    /// The store reference of the key (ConfigMaps are kept under their prefix).
    pub fn store_ref(&self) -> crate::spec::context::SecretRef {
        crate::spec::context::SecretRef {
            name: format!("{}{}", crate::spec::context::CONFIG_MAP_PREFIX, self.name),
            key: self.key.clone(),
        }
    }

    /// Problems of the name and key, at `at`.
    pub fn check(&self, at: &str, p: &mut crate::spec::context::Problems) {
        if !crate::spec::context::valid_config_map_name(&self.name) {
            p.push(
                format!("{at}.configMap.name"),
                "not a ConfigMap name (1-253 lower-case letters, digits, `-` and `.`)",
            );
        }
        let key_ok = (1..=253).contains(&self.key.len())
            && self
                .key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !key_ok {
            p.push(
                format!("{at}.configMap.key"),
                "not a ConfigMap key (1-253 letters, digits, `-`, `_` and `.`)",
            );
        }
    }
}

/// How an OpenAPI document is fetched from its `url`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchSpec {
    /// A file of PEM certificates of the CAs to trust instead of the public roots, e.g.
    /// `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt` for the cluster's API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// A file whose content is sent as `Authorization: Bearer ...` with the request, read
    /// at each fetch (a projected ServiceAccount token rotates), e.g.
    /// `/var/run/secrets/kubernetes.io/serviceaccount/token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// A Secret whose `ca.crt` key holds the PEM certificates of the CAs to trust instead of
    /// the public roots. Exclusive with `caFile` and `caConfigMap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<String>,
    /// A ConfigMap whose `ca.crt` key holds the PEM certificates of the CAs to trust (e.g.
    /// `kube-root-ca.crt`). Exclusive with `caFile` and `caSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map: Option<String>,
    /// Headers of the request, e.g. `Authorization: "Bearer {{secret.docs.token}}"`: literal
    /// text and `{{secret.NAME.KEY}}` references only, read at each fetch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Accept an `http` URL (the token then travels in clear text). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
    /// Time limit of a fetch (default 10s, at most 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Fetch again this often (at least 10s, at most 24h), sending the last answer's ETag
    /// as `If-None-Match`; a changed document swaps the tools like any reload. Unset: the
    /// document is fetched when the config is loaded or changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
}

/// At most this many `fetch.headers`.
pub const MAX_FETCH_HEADERS: usize = 32;

/// The compiled credentials of a fetch ([`FetchSpec::credentials`]).
#[derive(Debug, Default)]
pub struct FetchCredentials {
    /// The Secret or ConfigMap holding the CAs to trust.
    pub ca: Option<crate::spec::context::SecretRef>,
    /// The headers, as templates over `secret`.
    pub headers: Vec<(String, crate::template::Template)>,
    /// Every Secret and ConfigMap read.
    pub refs: Vec<crate::spec::context::SecretRef>,
}

/// Default time limit of a document fetch.
pub const DEFAULT_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest time limit of a document fetch.
pub const MAX_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Shortest and longest `fetch.refresh`.
pub const REFRESH_RANGE: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_secs(10),
    std::time::Duration::from_secs(24 * 3600),
);

impl FetchSpec {
    /// The time limit of a fetch (the default when unset or invalid; compile reports it).
    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
            .as_deref()
            .and_then(|t| super::parse_duration(t).ok())
            .filter(|d| !d.is_zero() && *d <= MAX_FETCH_TIMEOUT)
            .unwrap_or(DEFAULT_FETCH_TIMEOUT)
    }

    /// The refresh interval, when set and valid.
    pub fn refresh(&self) -> Option<std::time::Duration> {
        self.refresh
            .as_deref()
            .and_then(|t| super::parse_duration(t).ok())
            .filter(|d| (REFRESH_RANGE.0..=REFRESH_RANGE.1).contains(d))
    }

    /// The CA and headers of a fetch, compiled: the Secrets (and ConfigMaps, under their
    /// prefix) they read, in `refs`; their problems in `p`, at `at.fetch`.
    pub fn credentials(&self, at: &str, p: &mut crate::spec::context::Problems) -> FetchCredentials {
        use crate::spec::context::{
            CONFIG_MAP_PREFIX, Names, SecretRef, valid_config_map_name, valid_secret_part,
        };
        let at = format!("{at}.fetch");
        let mut out = FetchCredentials::default();
        let cas = [
            self.ca_file.is_some(),
            self.ca_secret.is_some(),
            self.ca_config_map.is_some(),
        ];
        if cas.iter().filter(|b| **b).count() > 1 {
            p.push(
                &at,
                "caFile, caSecret and caConfigMap each name the CAs to trust: set one",
            );
        }
        if let Some(n) = &self.ca_secret {
            if !valid_secret_part(n) {
                p.push(
                    format!("{at}.caSecret"),
                    "not a Secret name (letters, digits, `-`, `_`)",
                );
            }
            out.ca = Some(SecretRef {
                name: n.clone(),
                key: "ca.crt".to_owned(),
            });
        } else if let Some(n) = &self.ca_config_map {
            if !valid_config_map_name(n) {
                p.push(
                    format!("{at}.caConfigMap"),
                    "not a ConfigMap name (1-253 lower-case letters, digits, `-` and `.`)",
                );
            }
            out.ca = Some(SecretRef {
                name: format!("{CONFIG_MAP_PREFIX}{n}"),
                key: "ca.crt".to_owned(),
            });
        }
        out.refs.extend(out.ca.clone());
        if self.headers.len() > MAX_FETCH_HEADERS {
            p.push(
                format!("{at}.headers"),
                format!("{} headers; at most {MAX_FETCH_HEADERS}", self.headers.len()),
            );
            return out;
        }
        for (name, value) in &self.headers {
            let hat = format!("{at}.headers.{}", document::shown(name));
            if !crate::spec::checks::valid_header_name(name) {
                p.push(&hat, "not a header name");
                continue;
            }
            if name.eq_ignore_ascii_case("authorization") && self.token_file.is_some() {
                p.push(&hat, "tokenFile already sends `Authorization`: set one");
            }
            if value.len() > 8192 {
                p.push(&hat, "longer than 8192 characters");
                continue;
            }
            let t = match crate::template::Template::compile(crate::template::Authored::new(value)) {
                Ok(t) => t,
                Err(e) => {
                    p.push(&hat, e);
                    continue;
                }
            };
            if t.roots()
                .any(|(root, _)| root != crate::spec::context::SECRET_ROOT)
            {
                p.push(&hat, "literal text and `{{secret.NAME.KEY}}` references only");
            }
            let names = Names {
                props: None,
                steps: None,
            };
            crate::spec::context::check_secret_template(&t, &names, &hat, p, &mut out.refs);
            out.headers.push((name.clone(), t));
        }
        out
    }

    /// Problems of the settings and of `url`, at `at`.
    fn check(&self, url: Option<&str>, at: &str, p: &mut crate::spec::context::Problems) {
        if let Some(t) = &self.timeout
            && !super::parse_duration(t).is_ok_and(|d| !d.is_zero() && d <= MAX_FETCH_TIMEOUT)
        {
            p.push(
                format!("{at}.fetch.timeout"),
                "a duration above 0 and at most 60s",
            );
        }
        if let Some(t) = &self.refresh
            && self.refresh().is_none()
        {
            p.push(
                format!("{at}.fetch.refresh"),
                format!("`{}` is not a duration between 10s and 24h", document::shown(t)),
            );
        }
        for (field, f) in [("caFile", &self.ca_file), ("tokenFile", &self.token_file)] {
            if f.as_ref().is_some_and(|f| !f.starts_with('/') || f.len() > 4096) {
                p.push(format!("{at}.fetch.{field}"), "an absolute path");
            }
        }
        self.credentials(at, p);
        if url.is_none() {
            p.push(format!("{at}.fetch"), "only a source with a `url` is fetched");
        }
    }
}

/// Problems of a `url` (and its `fetch`) at `at`: https (http only with `allowHttp`), an
/// authority, no credentials or fragment, at most 2048 characters.
pub fn check_url(s: &OpenApiSpec, at: &str, p: &mut crate::spec::context::Problems) {
    let fetch = s.fetch.clone().unwrap_or_default();
    if let Some(f) = &s.fetch {
        f.check(s.url.as_deref(), at, p);
    }
    let Some(url) = &s.url else { return };
    // The tools are compiled once the document is fetched; where a caller's token may go is
    // checked now, against `server` (the document's own servers are not known yet).
    if let Some(id) = s
        .identity
        .as_ref()
        .filter(|i| i.mode != crate::spec::identity::IdentityMode::Server)
    {
        match &s.server {
            Some(server) => {
                crate::spec::identity::compile(id, &format!("{at}.identity"), server, p);
            }
            None => p.push(
                format!("{at}.server"),
                "required with `url` and `identity`: the caller's token may only go to a server named here",
            ),
        }
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://").filter(|_| fetch.allow_http));
    let problem = match rest {
        _ if url.len() > 2048 => Some("longer than 2048 characters"),
        None if url.starts_with("http://") => Some("an `http` URL needs `fetch.allowHttp: true`"),
        None => Some("must be an `https` URL"),
        Some(r) => {
            let authority = r.split(['/', '?', '#']).next().unwrap_or("");
            if authority.is_empty() {
                Some("names no host")
            } else if authority.contains('@') {
                Some("must not carry credentials (use `fetch.tokenFile`)")
            } else if url.contains('#') || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
                Some("must have no fragment, spaces or control characters")
            } else {
                None
            }
        }
    };
    if let Some(m) = problem {
        p.push(format!("{at}.url"), m);
    }
}

/// At most this many `allowedOrigins`.
pub const MAX_ALLOWED_ORIGINS: usize = 16;

/// Whether requests of the source carry a credential: a `security` scheme's, `headers` that
/// read a Secret or a claim or whose name says they carry one (`Authorization`, `Cookie`,
/// `X-Api-Key`, ...), the caller's token (`identity`), or a TLS client certificate
/// (whichever server trusts it would take the document's requests as the author's).
pub fn has_credentials(s: &OpenApiSpec) -> bool {
    use crate::template::{Authored, Template};
    !s.security.is_empty()
        || s.tls.as_ref().is_some_and(|t| t.client_cert_secret.is_some())
        || s.identity
            .as_ref()
            .is_some_and(|i| i.mode != crate::spec::identity::IdentityMode::Server)
        || s.headers.iter().any(|(k, v)| {
            credential_header(k) || Template::compile(Authored::new(v)).map_or(true, |t| !t.is_literal())
        })
}

/// Whether a header of this name carries a credential even when its value is literal
/// (`Authorization`, `Cookie`, an API key or token header).
fn credential_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(n.as_str(), "authorization" | "proxy-authorization" | "cookie")
        || [
            "key",
            "token",
            "secret",
            "auth",
            "session",
            "password",
            "signature",
        ]
        .iter()
        .any(|w| n.contains(w))
}

/// `scheme://authority` of an absolute http(s) URL, lower case (what `allowedOrigins` holds).
pub fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (matches!(scheme, "http" | "https") && !authority.is_empty() && !authority.contains('@'))
        .then(|| format!("{scheme}://{authority}").to_ascii_lowercase())
}

/// The origins of `allowedOrigins`; problems of the list at `at.allowedOrigins`.
pub fn allowed_origins(s: &OpenApiSpec, at: &str, p: &mut crate::spec::context::Problems) -> Vec<String> {
    if s.allowed_origins.len() > MAX_ALLOWED_ORIGINS {
        p.push(
            format!("{at}.allowedOrigins"),
            format!("at most {MAX_ALLOWED_ORIGINS} origins"),
        );
        return Vec::new();
    }
    let mut out = Vec::with_capacity(s.allowed_origins.len());
    for (i, o) in s.allowed_origins.iter().enumerate() {
        let trimmed = o.strip_suffix('/').unwrap_or(o);
        match origin_of(trimmed).filter(|origin| origin.len() == trimmed.len() && trimmed.len() <= 2048) {
            Some(origin) if !trimmed.contains(|c: char| c.is_whitespace() || c.is_control()) => {
                out.push(origin)
            }
            _ => p.push(
                format!("{at}.allowedOrigins[{i}]"),
                "an origin: `http://` or `https://` and a host[:port], nothing after it",
            ),
        }
    }
    out
}

/// Problems of where a source's credentials may go, known before its document is read: a
/// `url` or `configMap` source with credentials names `server` or `allowedOrigins`.
pub fn check_pinning(s: &OpenApiSpec, at: &str, p: &mut crate::spec::context::Problems) {
    let allowed = allowed_origins(s, at, p);
    if let Some(server) = &s.server
        && !allowed.is_empty()
        && !origin_of(server).is_some_and(|o| allowed.contains(&o))
    {
        p.push(format!("{at}.server"), "not at one of `allowedOrigins`");
    }
    let untrusted = s.url.is_some() || s.config_map.is_some() || s.fetched;
    if untrusted && s.server.is_none() && allowed.is_empty() && has_credentials(s) {
        p.push(
            format!("{at}.server"),
            "required (or `allowedOrigins`) when a document read from `url` or `configMap` gets \
             credentials (`security`, `headers` reading a Secret or claim, `identity`, a TLS client \
             certificate): \
             such a document does not choose where they go",
        );
    }
}

/// Problems of `serverIndex` and `serverVariables` at `at` (their fit with the document is
/// checked when it is compiled).
pub fn check_server_choice(s: &OpenApiSpec, at: &str, p: &mut crate::spec::context::Problems) {
    if s.server.is_some() && (s.server_index.is_some() || !s.server_variables.is_empty()) {
        p.push(
            format!("{at}.server"),
            "`server` replaces the document's servers: set it, or serverIndex/serverVariables",
        );
    }
    if s.server_index.is_some_and(|i| i > 255) {
        p.push(format!("{at}.serverIndex"), "at most 255");
    }
    if s.server_variables.len() > 32 {
        p.push(format!("{at}.serverVariables"), "at most 32 variables");
        return;
    }
    for (name, value) in &s.server_variables {
        let bad = |c: char| c.is_whitespace() || c.is_control() || matches!(c, '?' | '#' | '@' | '{' | '}');
        if name.is_empty() || name.len() > 64 || value.is_empty() || value.len() > 256 || value.contains(bad)
        {
            p.push(
                format!("{at}.serverVariables.{}", document::shown(name)),
                "a name of 1-64 characters and a value of 1-256, without spaces, `?`, `#`, `@` or braces",
            );
        }
    }
}

/// Operations served, by tag, method and path: an operation must match every list that is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationFilter {
    /// Tags; an operation with one of them is served.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// HTTP methods (`GET`, `POST`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Path templates as the document writes them; `*` matches any run of characters, e.g.
    /// `/api/v1/namespaces/{namespace}/pods*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

impl OperationFilter {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn selects(&self, method: &str, path: &str, tags: &[&str]) -> bool {
        (self.tags.is_empty() || tags.iter().any(|t| self.tags.iter().any(|f| f == t)))
            && (self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method)))
            && (self.paths.is_empty() || self.paths.iter().any(|g| Glob::new(g).matches(path)))
    }
}

fn valid_source_name(n: &str) -> bool {
    // An upstream's rule: neither has a `.`, which pinned sources' names rely on.
    super::upstream::valid_upstream_name(n)
}

/// Reads the `file` of every source into its `document` (what quiver-server does when it
/// loads a config; compiling then needs no filesystem). A file that cannot be read is left
/// for the compile step to report.
pub fn read_files(specs: &mut [OpenApiSpec]) {
    for s in specs.iter_mut().filter(|s| s.document.is_none()) {
        let Some(path) = &s.file else { continue };
        if let Ok(text) = document::read_bounded(std::path::Path::new(path)) {
            s.document = Some(text);
            s.file = None;
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
#[path = "trust_tests.rs"]
mod trust_tests;

//! One McpServer as a catalog entry: its registry name, version, times, and the
//! `ServerResponse` of the MCP Registry API (`server.json` and the registry's metadata).
//! Pure: no client, no clock; every field of the McpServer is the tenant's and is bounded
//! here before it is written (the registry's limits: description and title 100 characters,
//! version 255).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

pub use quiver_model::published::cut;
use quiver_model::published::{hidden, one_line};

use crate::crd::McpServer;

/// The `server.json` schema this catalog's entries follow.
pub const SCHEMA: &str = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json";
/// The key of Quiver's own metadata in an entry's `_meta`.
pub const META_KEY: &str = "dev.quiver/catalog";
/// The registry's own metadata key (status, times, latest).
pub const OFFICIAL_KEY: &str = "io.modelcontextprotocol.registry/official";
/// The MCP port of a Service when `service.port` is unset.
const MCP_PORT: i32 = 8080;

/// An entry's lifecycle status in the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Listed and served.
    Active,
    /// `catalog.deprecated` is set.
    Deprecated,
    /// The McpServer was deleted (kept a while for clients that sync with `updated_since`).
    Deleted,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Deprecated => "deprecated",
            Self::Deleted => "deleted",
        }
    }
}

/// One server of the catalog.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its namespace: whoever may list McpServers there may see it.
    pub namespace: String,
    /// Its registry name, `PREFIX.NAMESPACE/NAME`.
    pub name: String,
    /// Its version (`spec.server.version`).
    pub version: String,
    /// When its spec last changed (or it was deleted).
    pub updated: Timestamp,
    /// Its lifecycle status.
    pub status: Status,
    /// The `ServerResponse` object.
    pub json: Value,
}

/// The registry name of McpServer `name` in `namespace`: `PREFIX.NAMESPACE/NAME`. The
/// namespace is part of the name's reverse-DNS half, so two namespaces never share a name
/// and no McpServer can choose another's.
pub fn registry_name(prefix: &str, namespace: &str, name: &str) -> String {
    format!("{prefix}.{namespace}/{name}")
}

/// Whether `name` is a name the registry's schema admits (3-200 characters,
/// `^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$`): the same check as quiver-server's
/// `--server-card-name`.
pub fn valid_name(name: &str) -> bool {
    quiver_flags::is_registry_name(name)
}

/// Whether `prefix` can start registry names: one or more DNS labels (letters, digits, `-`),
/// dot-separated, at most 60 characters, so that with a namespace and a name (63 each) the
/// whole stays within the registry's 200.
pub fn valid_prefix(prefix: &str) -> bool {
    (1..=60).contains(&prefix.len())
        && prefix
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

/// The URL clients outside the cluster connect to: `catalog.url`, else the Ingress's or the
/// HTTPRoute's host. A URL the registry's pattern refuses (white space: only from a field
/// the CRD did not check, e.g. an older CRD) is left out rather than served.
pub fn public_urls(mcp: &McpServer) -> Vec<String> {
    let url = if let Some(u) = mcp.spec.catalog.as_ref().and_then(|c| c.url.as_deref()) {
        Some(u.to_owned())
    } else if let Some(i) = &mcp.spec.ingress {
        let scheme = if i.tls_secret_name.is_some() {
            "https"
        } else {
            "http"
        };
        Some(format!("{scheme}://{}/mcp", i.host))
    } else {
        mcp.spec
            .http_route
            .as_ref()
            .and_then(|r| r.hostnames.first())
            .map(|h| format!("https://{h}/mcp"))
    };
    url.into_iter()
        .filter(|u| {
            (u.starts_with("http://") || u.starts_with("https://"))
                && !u.chars().any(|c| c.is_whitespace() || c.is_control())
                && u.len() <= 2048
        })
        .collect()
}

/// The URLs clients connect to, the preferred first: [`public_urls`], and the in-cluster
/// Service URL last.
pub fn urls(mcp: &McpServer) -> Vec<String> {
    let name = mcp.metadata.name.as_deref().unwrap_or_default();
    let ns = mcp.metadata.namespace.as_deref().unwrap_or_default();
    let port = mcp.spec.service.as_ref().and_then(|s| s.port).unwrap_or(MCP_PORT);
    let mut out = public_urls(mcp);
    let inside = format!("http://{name}.{ns}.svc:{port}/mcp");
    if !out.contains(&inside) {
        out.push(inside);
    }
    out
}

/// How a client authenticates to the server, for the entry's headers and metadata.
fn auth(mcp: &McpServer, url: Option<&str>) -> (Option<Value>, Value) {
    let Some(a) = &mcp.spec.auth else {
        return (None, json!({"type": "none"}));
    };
    let (description, meta) = match (&a.oidc, &a.bearer_token_secret_ref) {
        (Some(o), bearer) => {
            let resource = url
                .and_then(origin)
                .map(|o| format!("{o}/.well-known/oauth-protected-resource/mcp"));
            let mut m = json!({
                "type": "oauth",
                "issuer": cut(&one_line(&o.issuer), 1024),
                "audience": cut(&one_line(&o.audience), 1024),
                "bearerKeys": bearer.is_some(),
            });
            if let Some(r) = resource {
                m["resourceMetadata"] = Value::String(r);
            }
            (
                format!(
                    "An OAuth access token from {} for audience {}",
                    cut(&one_line(&o.issuer), 200),
                    cut(&one_line(&o.audience), 200)
                ),
                m,
            )
        }
        (None, Some(_)) => (
            "A key the server's owners give out".to_owned(),
            json!({"type": "bearer"}),
        ),
        (None, None) => return (None, json!({"type": "none"})),
    };
    let header = json!({
        "name": "Authorization",
        "description": description,
        "value": "Bearer {token}",
        "isRequired": true,
        "isSecret": true,
        "variables": {"token": {"description": description, "isRequired": true, "isSecret": true}},
    });
    (Some(header), meta)
}

/// `scheme://host[:port]` of an http(s) URL.
fn origin(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let end = rest.find('/').unwrap_or(rest.len());
    Some(&url[..url.len() - rest.len() + end])
}

/// When the McpServer's spec last changed: the newest time of its managed fields outside the
/// status subresource, else its creation; never after `now` (a client may write managed
/// fields' times, and a time in the future would stop every syncing client's clock).
pub fn updated(mcp: &McpServer, now: Timestamp) -> Timestamp {
    let created = mcp
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    mcp.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| f.subresource.as_deref().is_none_or(str::is_empty))
        .filter_map(|f| f.time.as_ref().map(|t| t.0))
        .fold(created, Timestamp::max)
        .min(now)
}

/// Quiver's metadata of an entry: where the McpServer is, whether it is Ready, its tool
/// count and how clients authenticate.
fn quiver_meta(mcp: &McpServer, auth: Value) -> Value {
    let ready = mcp
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map_or("Unknown", |c| c.status.as_str());
    json!({
        "namespace": mcp.metadata.namespace,
        "name": mcp.metadata.name,
        "ready": match ready { "True" => "True", "False" => "False", _ => "Unknown" },
        "toolCount": mcp.status.as_ref().and_then(|s| s.tool_count),
        "auth": auth,
    })
}

/// Whether the McpServer is listed (`catalog.listed` is not false).
pub fn listed(mcp: &McpServer) -> bool {
    mcp.spec.catalog.as_ref().and_then(|c| c.listed) != Some(false)
}

/// The entry of `mcp` under `prefix`, or `None` when it has no name or namespace or its
/// registry name does not fit the registry's pattern. `deleted` is when it was deleted;
/// `now` bounds the times it reports.
pub fn entry(mcp: &McpServer, prefix: &str, deleted: Option<Timestamp>, now: Timestamp) -> Option<Entry> {
    let name = mcp.metadata.name.as_deref()?;
    let namespace = mcp.metadata.namespace.as_deref()?;
    let registry = registry_name(prefix, namespace, name);
    if !valid_name(&registry) {
        return None;
    }
    let info = mcp.spec.server.as_ref();
    let version = info
        .map(|s| one_line(&s.version))
        .filter(|v| !v.is_empty())
        .map_or_else(|| "1.0.0".to_owned(), |v| cut(&v, 255));
    let title = info
        .and_then(|s| s.title.as_deref())
        .map(one_line)
        .filter(|t| !t.is_empty())
        .map(|t| cut(&t, 100));
    let catalog = mcp.spec.catalog.as_ref();
    let description = catalog
        .and_then(|c| c.description.as_deref())
        .map(one_line)
        .filter(|d| !d.is_empty())
        .or_else(|| title.clone())
        .unwrap_or_else(|| format!("MCP server {name} in namespace {namespace}"));
    let updated_at = updated(mcp, now);
    let published = mcp
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(updated_at, |t| t.0.min(now));
    let status = match (deleted, catalog.and_then(|c| c.deprecated.as_deref())) {
        (Some(_), _) => Status::Deleted,
        (None, Some(_)) => Status::Deprecated,
        (None, None) => Status::Active,
    };
    let updated_at = deleted.unwrap_or(updated_at);
    let urls = urls(mcp);
    let (header, auth_meta) = auth(mcp, urls.first().map(String::as_str));
    let remotes: Vec<Value> = urls
        .iter()
        .map(|u| {
            let mut r = json!({"type": "streamable-http", "url": u});
            if let Some(h) = &header {
                r["headers"] = json!([h]);
            }
            r
        })
        .collect();
    let mut server = Map::new();
    server.insert("$schema".into(), SCHEMA.into());
    server.insert("name".into(), registry.clone().into());
    server.insert("description".into(), cut(&description, 100).into());
    if let Some(t) = title {
        server.insert("title".into(), t.into());
    }
    server.insert("version".into(), version.clone().into());
    let website = catalog.and_then(|c| c.website_url.as_deref()).filter(|w| {
        !w.chars()
            .any(|c| c.is_whitespace() || c.is_control() || hidden(c))
    });
    if let Some(w) = website {
        server.insert("websiteUrl".into(), cut(w, 2048).into());
    }
    server.insert("remotes".into(), remotes.into());
    let mut official = json!({
        "status": status.as_str(),
        "statusChangedAt": updated_at.to_string(),
        "publishedAt": published.to_string(),
        "updatedAt": updated_at.to_string(),
        "isLatest": true,
    });
    if let (Status::Deprecated, Some(m)) = (status, catalog.and_then(|c| c.deprecated.as_deref())) {
        official["statusMessage"] = cut(&one_line(m), 500).into();
    }
    let json = json!({
        "server": server,
        "_meta": {
            OFFICIAL_KEY: official,
            META_KEY: quiver_meta(mcp, auth_meta),
        },
    });
    Some(Entry {
        namespace: namespace.to_owned(),
        name: registry,
        version,
        updated: updated_at,
        status,
        json,
    })
}

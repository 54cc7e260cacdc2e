//! The server card (the draft MCP server-card extension, off unless `--server-card-name` is
//! set): `GET /mcp/server-card` describes this server (name, version, description, the
//! public endpoints with the protocol revisions each serves, the header a client sends when
//! authentication is on), and `GET /.well-known/ai-catalog.json` lists the card for clients
//! that discover servers by domain.
//!
//! Both are public and cross-origin (`Access-Control-Allow-Origin: *`), cacheable for an
//! hour, with an ETag answered by 304. The card never holds what the request says about
//! itself (no URL from `Host`), credentials or internal addresses: its endpoints are the
//! `--server-card-url`s the operator of the server gave. Its version and title follow the
//! served ToolSet's `server` through hot reloads.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_model::published::{cut, etag, held, one_line};
use serde_json::{Value, json};

use super::HttpState;
use crate::protocol::ALL_VERSIONS;

/// The card's schema (the draft's `v1`).
pub const SCHEMA: &str = "https://static.modelcontextprotocol.io/schemas/v1/server-card.schema.json";
/// The card's media type.
const CARD_TYPE: &str = "application/mcp-server-card+json";

/// What the card says that the ToolSet does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardOptions {
    /// Its name, reverse DNS with one slash (checked by the flag's parser).
    pub name: String,
    /// Its one-line description.
    pub description: Option<String>,
    /// Public URLs of the MCP endpoint.
    pub urls: Vec<String>,
    /// Documentation or home page.
    pub website_url: Option<String>,
}

/// The card of `card`, with the served `server_info` and whether clients must authenticate.
pub fn card(card: &CardOptions, server_info: &Value, auth: bool) -> Value {
    let line = |v: &Value| v.as_str().map(one_line).filter(|s| !s.is_empty());
    let title = line(&server_info["title"]).map(|t| cut(&t, 100));
    let version = line(&server_info["version"]).map_or_else(|| "1.0.0".to_owned(), |v| cut(&v, 255));
    let description = card
        .description
        .clone()
        .or_else(|| title.clone())
        .unwrap_or_else(|| format!("MCP server {}", card.name));
    let header = auth.then(|| {
        json!([{
            "name": "Authorization",
            "description": "A bearer token this server accepts",
            "value": "Bearer {token}",
            "isRequired": true,
            "isSecret": true,
            "variables": {"token": {"description": "A bearer token this server accepts", "isRequired": true, "isSecret": true}},
        }])
    });
    let remotes: Vec<Value> = card
        .urls
        .iter()
        .map(|u| {
            let mut r =
                json!({"type": "streamable-http", "url": u, "supportedProtocolVersions": ALL_VERSIONS});
            if let Some(h) = &header {
                r["headers"] = h.clone();
            }
            r
        })
        .collect();
    let mut out = json!({
        "$schema": SCHEMA,
        "name": card.name,
        "version": version,
        "description": cut(&description, 100),
    });
    if let Some(t) = title {
        out["title"] = t.into();
    }
    if let Some(w) = &card.website_url {
        out["websiteUrl"] = w.as_str().into();
    }
    if !remotes.is_empty() {
        out["remotes"] = remotes.into();
    }
    out
}

/// The AI Catalog entry of the card: `urn:air:{publisher}:mcp:{name}` from the card's
/// `publisher/name`, and the card's URL under the first endpoint (none without one).
pub fn ai_catalog(card: &CardOptions) -> Value {
    let (publisher, name) = card.name.split_once('/').unwrap_or((&card.name, ""));
    let mut entry = json!({
        "identifier": format!("urn:air:{publisher}:mcp:{name}"),
        "type": CARD_TYPE,
    });
    if let Some(u) = card.urls.first() {
        entry["url"] = format!("{}/server-card", u.trim_end_matches('/')).into();
    }
    json!({"specVersion": "1.0", "entries": [entry]})
}

/// The CORS and cache headers of both documents.
fn public(resp: &mut Response) {
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("Content-Type, If-None-Match"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("ETag"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
}

/// `body` as `content_type`, with its ETag, or 304 when the client holds it.
fn tagged(body: &Value, content_type: &'static str, headers: &HeaderMap) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let tag = etag(&bytes);
    let values = headers.get_all(header::IF_NONE_MATCH);
    let held = held(values.iter().filter_map(|v| v.to_str().ok()), &tag);
    let mut resp = if held {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, content_type)], bytes).into_response()
    };
    if let Ok(v) = HeaderValue::from_str(&tag) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    public(&mut resp);
    resp
}

/// `GET /mcp/server-card`.
pub(super) async fn server_card(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    let Some(c) = &state.options.card else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let snap = state.server.registry.load();
    let body = card(c, &snap.server_info, state.options.auth.is_some());
    tagged(&body, CARD_TYPE, &headers)
}

/// `GET /.well-known/ai-catalog.json`.
pub(super) async fn catalog(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    let Some(c) = &state.options.card else {
        return StatusCode::NOT_FOUND.into_response();
    };
    tagged(&ai_catalog(c), "application/ai-catalog+json", &headers)
}

/// `OPTIONS` of both (a browser asks before a GET with `If-None-Match`).
pub(super) async fn preflight(State(state): State<Arc<HttpState>>) -> Response {
    if state.options.card.is_none() {
        return StatusCode::NOT_FOUND.into_response();
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    public(&mut resp);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> CardOptions {
        CardOptions {
            name: "com.example.team-a/weather".into(),
            description: None,
            urls: vec!["https://weather.example.com/mcp".into()],
            website_url: Some("https://docs.example.com".into()),
        }
    }

    #[test]
    fn a_card_names_the_endpoints_and_revisions_and_follows_the_served_server_info() {
        let c = card(
            &options(),
            &json!({"name": "quiver", "version": "2.1.0", "title": "Weather"}),
            true,
        );
        assert_eq!(c["$schema"], SCHEMA);
        assert_eq!(c["name"], "com.example.team-a/weather");
        assert_eq!(
            (c["version"].as_str(), c["title"].as_str()),
            (Some("2.1.0"), Some("Weather"))
        );
        assert_eq!(c["description"], "Weather", "the title, without a description");
        assert_eq!(c["remotes"][0]["url"], "https://weather.example.com/mcp");
        assert_eq!(c["remotes"][0]["supportedProtocolVersions"], json!(ALL_VERSIONS));
        assert_eq!(c["remotes"][0]["headers"][0]["value"], "Bearer {token}");
        let open = card(&options(), &json!({"version": "1"}), false);
        assert!(open["remotes"][0].get("headers").is_none());
        assert_eq!(open["description"], "MCP server com.example.team-a/weather");
    }

    #[test]
    fn served_text_is_bounded_to_what_a_card_may_hold() {
        let info = json!({"version": format!("1.{}\n", "0".repeat(400)), "title": format!("a\u{7}b{}", "é".repeat(200))});
        let c = card(
            &CardOptions {
                urls: vec![],
                ..options()
            },
            &info,
            false,
        );
        assert_eq!(c["version"].as_str().unwrap().chars().count(), 255);
        let t = c["title"].as_str().unwrap();
        assert!(t.starts_with("a b") && t.chars().count() == 100, "{t}");
        assert!(c["description"].as_str().unwrap().chars().count() <= 100);
        assert!(c.get("remotes").is_none(), "no endpoint is guessed");
        let c = card(&options(), &json!({"version": " "}), false);
        assert_eq!(c["version"], "1.0.0");
    }

    #[test]
    fn the_ai_catalog_points_at_the_card() {
        let c = ai_catalog(&options());
        assert_eq!(
            c["entries"][0]["identifier"],
            "urn:air:com.example.team-a:mcp:weather"
        );
        assert_eq!(c["entries"][0]["type"], CARD_TYPE);
        assert_eq!(
            c["entries"][0]["url"],
            "https://weather.example.com/mcp/server-card"
        );
        let none = ai_catalog(&CardOptions {
            urls: vec![],
            ..options()
        });
        assert!(none["entries"][0].get("url").is_none());
    }

    #[test]
    fn an_unchanged_card_is_a_304_with_the_cors_headers() {
        let body = json!({"a": 1});
        let r = tagged(&body, CARD_TYPE, &HeaderMap::new());
        let tag = r.headers()[header::ETAG].to_str().unwrap().to_owned();
        assert_eq!(r.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert_eq!(r.headers()[header::CACHE_CONTROL], "public, max-age=3600");
        let mut h = HeaderMap::new();
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(&format!("W/{tag}")).unwrap(),
        );
        let r = tagged(&body, CARD_TYPE, &h);
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(r.headers()[header::ACCESS_CONTROL_EXPOSE_HEADERS], "ETag");
    }
}

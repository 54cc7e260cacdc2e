//! The list of the MCP Registry API: its query (`cursor`, `limit`, `search`,
//! `updated_since`, `version`, `include_deleted`), the page of entries it selects, and the
//! page's JSON. Pure; every query value is bounded and a malformed one is an error the
//! caller answers with 400.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::entry::{Entry, Status};

/// Entries per page when the query names no `limit`.
pub const DEFAULT_LIMIT: usize = 30;
/// The largest page; a larger `limit` is served this many (with a cursor to the rest).
pub const MAX_LIMIT: usize = 100;
/// The longest value of any query parameter.
const MAX_VALUE: usize = 512;

/// A parsed list query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Entries after this registry name.
    pub after: Option<String>,
    /// Entries per page (1..=[`MAX_LIMIT`]).
    pub limit: usize,
    /// A substring of the names wanted (compared without case).
    pub search: Option<String>,
    /// Entries changed after this time (deleted ones included).
    pub updated_since: Option<Timestamp>,
    /// `latest` or an exact version.
    pub version: Option<String>,
    /// Whether deleted entries are listed.
    pub include_deleted: bool,
}

impl Default for Query {
    fn default() -> Self {
        Self {
            after: None,
            limit: DEFAULT_LIMIT,
            search: None,
            updated_since: None,
            version: None,
            include_deleted: false,
        }
    }
}

/// The opaque cursor after registry name `name`.
pub fn cursor(name: &str) -> String {
    URL_SAFE_NO_PAD.encode(name)
}

fn boolean(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("{key} must be true or false")),
    }
}

/// Parses a URL query string; unknown parameters are ignored, as the registry does.
///
/// # Errors
/// A message naming the parameter that is malformed or too long.
pub fn parse(query: &str) -> Result<Query, String> {
    let mut q = Query::default();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if v.len() > MAX_VALUE {
            return Err(format!("{k} is longer than {MAX_VALUE} bytes"));
        }
        match &*k {
            "cursor" if !v.is_empty() => {
                let name = URL_SAFE_NO_PAD
                    .decode(v.as_bytes())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or("cursor is not one this registry returned")?;
                q.after = Some(name);
            }
            "limit" => {
                let n: usize = v.parse().map_err(|_| "limit must be a positive integer")?;
                if n == 0 {
                    return Err("limit must be a positive integer".into());
                }
                q.limit = n.min(MAX_LIMIT);
            }
            "search" if !v.is_empty() => q.search = Some(v.to_lowercase()),
            "updated_since" if !v.is_empty() => {
                let t: Timestamp = v
                    .parse()
                    .map_err(|_| "updated_since must be an RFC 3339 time, e.g. 2025-08-07T13:15:04Z")?;
                q.updated_since = Some(t);
                q.include_deleted = true;
            }
            "version" if !v.is_empty() => q.version = Some(v.into_owned()),
            "include_deleted" => q.include_deleted |= boolean("include_deleted", &v)?,
            _ => {}
        }
    }
    Ok(q)
}

/// Whether `e` is one the query asks for (the cursor aside).
pub fn wanted(e: &Entry, q: &Query) -> bool {
    (q.include_deleted || e.status != Status::Deleted)
        && q.search
            .as_deref()
            .is_none_or(|s| e.name.to_lowercase().contains(s))
        && q.updated_since.is_none_or(|t| e.updated > t)
        && q.version
            .as_deref()
            .is_none_or(|v| v == "latest" || v == e.version)
}

/// One page: the wanted entries of `entries` (sorted by name, one per name) after the
/// cursor, and the cursor of the next page when more are left.
pub fn page<'a>(entries: &[&'a Entry], q: &Query) -> (Vec<&'a Entry>, Option<String>) {
    let start = q
        .after
        .as_deref()
        .map_or(0, |a| entries.partition_point(|e| e.name.as_str() <= a));
    let mut out = Vec::with_capacity(q.limit.min(entries.len()));
    let mut rest = entries[start..].iter().filter(|e| wanted(e, q));
    for e in rest.by_ref() {
        out.push(*e);
        if out.len() == q.limit {
            break;
        }
    }
    let next = (out.len() == q.limit && rest.next().is_some())
        .then(|| out.last().map(|e| cursor(&e.name)))
        .flatten();
    (out, next)
}

/// The `ServerList` JSON of a page.
pub fn render(items: &[&Entry], next: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + items.len() * 768);
    out.extend_from_slice(br#"{"servers":["#);
    for (i, e) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // A Value always serializes.
        let _ = serde_json::to_writer(&mut out, &e.json);
    }
    out.extend_from_slice(br#"],"metadata":"#);
    let metadata = match next {
        Some(c) => json!({"nextCursor": c, "count": items.len()}),
        None => json!({"count": items.len()}),
    };
    let _ = serde_json::to_writer(&mut out, &metadata);
    out.push(b'}');
    out
}

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

use super::identity::IdentitySpec;
use super::upstream::{Glob, ImportSpec};
use crate::handlers::http::TlsSpec;

mod document;
mod operation;
pub(crate) use operation::compile;
mod schema;

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
    /// The document itself, JSON or YAML text. Exclusive with `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<String>,
    /// A file holding the document, read by quiver-server whenever it loads the config.
    /// Exclusive with `document`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The base URL requests go to (`http` or `https`, literal), instead of the document's
    /// first `servers` entry. Needed when the document names no server or a relative one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
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
    (1..=63).contains(&n.len())
        && n.starts_with(|c: char| c.is_ascii_lowercase())
        && !n.ends_with('-')
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
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

//! Rich content blocks (MCP `ContentBlock`): compiled from [`ContentSpec`] and rendered into
//! the JSON a tool result or a prompt message carries. Every string is a template; base64
//! fields are checked when literal at compile time, and after rendering at run time. The
//! `content` handler answers with such blocks.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::spec::context::{Cx, Names, Problems, checked_template};
use crate::template::{Authored, Budget, Scope, Template};

/// One block of MCP content. Every string in it is a template over the arguments (of the
/// tool, or of the prompt); `data` and `blob` are base64.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum ContentSpec {
    /// A text block.
    Text(String),
    /// An image: base64 `data` and its `mimeType` (e.g. `image/png`).
    Image(MediaSpec),
    /// Audio: base64 `data` and its `mimeType` (e.g. `audio/wav`).
    Audio(MediaSpec),
    /// A resource embedded whole: `uri`, and `text` or base64 `blob`.
    Resource(EmbeddedResourceSpec),
    /// A link to a resource the client may read (`resource_link`).
    ResourceLink(ResourceLinkSpec),
}

/// Image or audio content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MediaSpec {
    /// Base64 data (standard alphabet, padded).
    pub data: String,
    /// MIME type, e.g. `image/png`, `audio/wav`.
    pub mime_type: String,
}

/// An embedded resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmbeddedResourceSpec {
    /// The resource's URI.
    pub uri: String,
    /// MIME type of the contents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Text contents. Exclusive with `blob`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Base64 binary contents. Exclusive with `text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
}

/// A resource link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceLinkSpec {
    /// The resource's URI.
    pub uri: String,
    /// The resource's name.
    pub name: String,
    /// What the resource holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// MIME type of the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

/// A compiled content block.
#[derive(Debug)]
pub enum Content {
    /// `{"type":"text","text":...}`.
    Text(Template),
    /// `{"type":"image"|"audio","data":...,"mimeType":...}`.
    Media {
        /// `image` or `audio`.
        kind: &'static str,
        /// Base64 data.
        data: Template,
        /// MIME type.
        mime_type: Template,
    },
    /// `{"type":"resource","resource":{"uri","mimeType","text"|"blob"}}`.
    Resource {
        /// URI.
        uri: Template,
        /// MIME type.
        mime_type: Option<Template>,
        /// Text contents, or base64 when `blob`.
        body: Template,
        /// Whether `body` is base64 (`blob`) rather than `text`.
        blob: bool,
    },
    /// `{"type":"resource_link","uri","name",...}`.
    Link {
        /// URI.
        uri: Template,
        /// Fixed fields: name, description, mimeType.
        fixed: Map<String, Value>,
    },
}

/// Why a block could not be rendered.
#[derive(Debug)]
pub enum RenderError {
    /// The rendered output would exceed the budget.
    TooLarge,
    /// A base64 field is not base64 after rendering.
    NotBase64(&'static str),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge => write!(f, "{}", crate::template::TooLarge),
            Self::NotBase64(field) => write!(f, "`{field}` is not valid base64 (standard alphabet, padded)"),
        }
    }
}

impl From<crate::template::TooLarge> for RenderError {
    fn from(_: crate::template::TooLarge) -> Self {
        Self::TooLarge
    }
}

/// The problem reported for a literal that is not base64.
pub const NOT_BASE64: &str = "must be base64 (standard alphabet, padded)";

/// Whether `s` is standard, padded base64.
pub fn is_base64(s: &str) -> bool {
    s.len().is_multiple_of(4) && STANDARD.decode(s).is_ok()
}

/// Base64 of `bytes` (standard alphabet, padded).
pub fn to_base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// A content block's field of the ToolSet, compiled and checked.
fn checked(src: &str, path: &str, names: &Names<'_>, p: &mut Problems) -> Option<Template> {
    checked_template(Authored::new(src), path, names, p)
}

fn base64_template(src: &str, path: &str, names: &Names<'_>, p: &mut Problems) -> Option<Template> {
    let t = checked(src, path, names, p)?;
    if t.is_literal() && !is_base64(src) {
        p.push(path, NOT_BASE64);
    }
    Some(t)
}

/// Compiles one block; problems are reported under `path`.
pub fn compile(spec: &ContentSpec, path: &str, names: &Names<'_>, p: &mut Problems) -> Option<Content> {
    Some(match spec {
        ContentSpec::Text(t) => Content::Text(checked(t, &format!("{path}.text"), names, p)?),
        ContentSpec::Image(m) | ContentSpec::Audio(m) => {
            let kind = if matches!(spec, ContentSpec::Image(_)) {
                "image"
            } else {
                "audio"
            };
            let at = format!("{path}.{kind}");
            if m.mime_type.trim().is_empty() {
                p.push(format!("{at}.mimeType"), "must not be empty");
            }
            Content::Media {
                kind,
                data: base64_template(&m.data, &format!("{at}.data"), names, p)?,
                mime_type: checked(&m.mime_type, &format!("{at}.mimeType"), names, p)?,
            }
        }
        ContentSpec::Resource(r) => compile_embedded(r, &format!("{path}.resource"), names, p)?,
        ContentSpec::ResourceLink(l) => {
            let at = format!("{path}.resourceLink");
            if l.name.trim().is_empty() {
                p.push(format!("{at}.name"), "must not be empty");
            }
            let mut fixed = Map::new();
            fixed.insert("name".into(), Value::String(l.name.clone()));
            if let Some(d) = &l.description {
                fixed.insert("description".into(), Value::String(d.clone()));
            }
            if let Some(m) = &l.mime_type {
                fixed.insert("mimeType".into(), Value::String(m.clone()));
            }
            Content::Link {
                uri: checked(&l.uri, &format!("{at}.uri"), names, p)?,
                fixed,
            }
        }
    })
}

fn compile_embedded(
    r: &EmbeddedResourceSpec,
    at: &str,
    names: &Names<'_>,
    p: &mut Problems,
) -> Option<Content> {
    let (body, blob) = match (&r.text, &r.blob) {
        (Some(t), None) => (checked(t, &format!("{at}.text"), names, p)?, false),
        (None, Some(b)) => (base64_template(b, &format!("{at}.blob"), names, p)?, true),
        _ => {
            p.push(at, "set exactly one of `text` and `blob`");
            return None;
        }
    };
    Some(Content::Resource {
        uri: checked(&r.uri, &format!("{at}.uri"), names, p)?,
        mime_type: match &r.mime_type {
            Some(m) => Some(checked(m, &format!("{at}.mimeType"), names, p)?),
            None => None,
        },
        body,
        blob,
    })
}

impl Content {
    /// The block as JSON, rendered against `scope` within `budget`.
    pub fn render(&self, scope: &dyn Scope, budget: &mut Budget) -> Result<Value, RenderError> {
        let mut o = Map::new();
        match self {
            Self::Text(t) => {
                o.insert("type".into(), "text".into());
                o.insert("text".into(), t.render_with(scope, budget)?.into());
            }
            Self::Media {
                kind,
                data,
                mime_type,
            } => {
                let data = data.render_with(scope, budget)?;
                if !is_base64(&data) {
                    return Err(RenderError::NotBase64("data"));
                }
                o.insert("type".into(), (*kind).into());
                o.insert("data".into(), data.into());
                o.insert("mimeType".into(), mime_type.render_with(scope, budget)?.into());
            }
            Self::Resource {
                uri,
                mime_type,
                body,
                blob,
            } => {
                let mut r = Map::new();
                r.insert("uri".into(), uri.render_with(scope, budget)?.into());
                if let Some(m) = mime_type {
                    r.insert("mimeType".into(), m.render_with(scope, budget)?.into());
                }
                let body = body.render_with(scope, budget)?;
                if *blob {
                    if !is_base64(&body) {
                        return Err(RenderError::NotBase64("blob"));
                    }
                    r.insert("blob".into(), body.into());
                } else {
                    r.insert("text".into(), body.into());
                }
                o.insert("type".into(), "resource".into());
                o.insert("resource".into(), Value::Object(r));
            }
            Self::Link { uri, fixed } => {
                o.insert("type".into(), "resource_link".into());
                o.insert("uri".into(), uri.render_with(scope, budget)?.into());
                o.extend(fixed.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        Ok(Value::Object(o))
    }
}

/// Compiles the blocks of a `content` handler.
pub fn compile_blocks(blocks: &[ContentSpec], cx: &mut Cx<'_>) -> Vec<Content> {
    let at = cx.at.clone();
    if blocks.is_empty() {
        cx.p.push(&at, "must have at least one block");
    }
    let (names, p) = (cx.names, &mut *cx.p);
    blocks
        .iter()
        .enumerate()
        .filter_map(|(j, b)| compile(b, &format!("{at}[{j}]"), names, p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_checked() {
        assert!(is_base64(""));
        assert!(is_base64("aGk="));
        assert!(!is_base64("aGk"));
        assert!(!is_base64("a*k="));
        assert_eq!(to_base64(b"hi"), "aGk=");
    }
}

//! What every tool call returns ([`ToolOutput`], the MCP `CallToolResult`), whoever runs it:
//! a handler kind, an upstream server, or a policy or limit that refused the call.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

/// The result of a tool call (MCP `CallToolResult`): one text block (or rich content blocks),
/// optional structured content, and whether the tool reported an error.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// The text content (with `content`: the text of its text blocks, for pipelines).
    pub text: String,
    /// `structuredContent`.
    pub structured: Option<Value>,
    /// Content blocks sent instead of the one text block.
    pub content: Option<Vec<Value>>,
    /// `isError`.
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            structured: None,
            content: None,
            is_error: false,
        }
    }

    /// A tool execution error the client's model can read and act on.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            structured: None,
            content: None,
            is_error: true,
        }
    }

    /// Appends the serialized `CallToolResult` object.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        if let Some(blocks) = &self.content {
            out.extend_from_slice(b"{\"content\":");
            let _ = serde_json::to_writer(&mut *out, blocks);
        } else {
            out.extend_from_slice(b"{\"content\":[{\"type\":\"text\",\"text\":");
            let _ = serde_json::to_writer(&mut *out, &self.text);
            out.extend_from_slice(b"}]");
        }
        if let Some(s) = &self.structured {
            out.extend_from_slice(b",\"structuredContent\":");
            let _ = serde_json::to_writer(&mut *out, s);
        }
        out.extend_from_slice(if self.is_error {
            b",\"isError\":true}"
        } else {
            b",\"isError\":false}"
        });
    }
}

/// A boxed future of a tool result (pipelines recurse, so the async path is boxed).
pub type OutputFuture<'a> = Pin<Box<dyn Future<Output = ToolOutput> + Send + 'a>>;

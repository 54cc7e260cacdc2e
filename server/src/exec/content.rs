//! The `content` handler: content blocks (text, image, audio, embedded resource, resource
//! link) rendered from the arguments. Runs synchronously, like a template.

use serde_json::Value;

use crate::handlers::content::Content;
use crate::protocol::output::ToolOutput;
use crate::template::Budget;

/// Renders the blocks; the result's `text` (what a later pipeline step sees as
/// `steps.N.text`) is the text blocks joined by newlines.
pub fn run(blocks: &[Content], args: &Value) -> ToolOutput {
    let mut budget = Budget::new();
    let mut rendered = Vec::with_capacity(blocks.len());
    let mut text = String::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.render(args, &mut budget) {
            Ok(v) => {
                if let Some(t) = v
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|_| matches!(b, Content::Text(_)))
                {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(t);
                }
                rendered.push(v);
            }
            Err(e) => return ToolOutput::error(format!("content[{i}]: {e}")),
        }
    }
    ToolOutput {
        text,
        structured: None,
        content: Some(rendered),
        is_error: false,
    }
}

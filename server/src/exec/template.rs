//! The run step of the `template` and `error` handlers: render the compiled template over
//! the arguments, as the result or as the error message.

use quiver_model::template::Template;

use crate::protocol::output::ToolOutput;

/// The result of a `template` handler.
pub fn run(t: &Template, args: &serde_json::Value) -> ToolOutput {
    match t.render(args) {
        Ok(text) => ToolOutput::text(text),
        Err(e) => ToolOutput::error(e.to_string()),
    }
}

/// The result of an `error` handler.
pub fn fail(t: &Template, args: &serde_json::Value) -> ToolOutput {
    ToolOutput::error(match t.render(args) {
        Ok(text) => text,
        Err(e) => e.to_string(),
    })
}

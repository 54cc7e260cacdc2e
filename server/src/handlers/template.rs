//! The `template` handler (a text template over the arguments is the result) and the
//! `error` handler (a template over the arguments is the error message of a failed call,
//! e.g. a retired tool that tells the model what to use instead). Both run synchronously.

use crate::config::context::{Cx, checked_template};
#[cfg(feature = "runtime")]
use crate::handlers::output::ToolOutput;
use crate::template::Template;

/// Compiles the template of a `template` or `error` handler.
pub(crate) fn compile(src: &str, cx: &mut Cx<'_>) -> Template {
    checked_template(crate::template::Authored::new(src), &cx.at, cx.names, cx.p)
        .unwrap_or_else(Template::empty)
}

/// The result of a `template` handler.
#[cfg(feature = "runtime")]
pub fn run(t: &Template, args: &serde_json::Value) -> ToolOutput {
    match t.render(args) {
        Ok(text) => ToolOutput::text(text),
        Err(e) => ToolOutput::error(e.to_string()),
    }
}

/// The result of an `error` handler.
#[cfg(feature = "runtime")]
pub fn fail(t: &Template, args: &serde_json::Value) -> ToolOutput {
    ToolOutput::error(match t.render(args) {
        Ok(text) => text,
        Err(e) => e.to_string(),
    })
}

//! The `template` handler (a text template over the arguments is the result) and the
//! `error` handler (a template over the arguments is the error message of a failed call,
//! e.g. a retired tool that tells the model what to use instead). Both run synchronously.

use crate::spec::context::{Cx, checked_template};
use crate::template::Template;

/// Compiles the template of a `template` or `error` handler.
pub fn compile(src: &str, cx: &mut Cx<'_>) -> Template {
    checked_template(crate::template::Authored::new(src), &cx.at, cx.names, cx.p)
        .unwrap_or_else(Template::empty)
}

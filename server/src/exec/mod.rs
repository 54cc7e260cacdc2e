//! Running a compiled tool: the [`Executor`] and each handler kind's run step.

pub(crate) mod ask;
mod budget;
pub(crate) mod builtin;
pub(crate) mod command;
pub(crate) mod content;
mod executor;
mod hooks;
pub(crate) mod http;
mod output;
pub(crate) mod pipeline;
pub(crate) mod template;
mod user;

pub use self::executor::*;
pub use self::output::{Checked, check_output, guard_output};

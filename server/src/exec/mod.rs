//! Running a compiled tool: the [`Executor`] and each handler kind's run step, the HTTP
//! client, child processes and their output.

pub(crate) mod ask;
pub(crate) mod builtin;
pub(crate) mod command;
pub(crate) mod content;
mod executor;
pub(crate) mod http;
pub(crate) mod output;
pub(crate) mod pipeline;
#[allow(unsafe_code)] // kill(2), waitpid(2), prctl(2): every unsafe block states its contract
pub(crate) mod process;
pub(crate) mod template;

pub use self::executor::*;
pub use self::http::HttpClient;
pub(crate) use self::output::WithSecrets;
pub use self::output::{OutputFuture, ToolOutput};
pub use self::process::start_reaper;

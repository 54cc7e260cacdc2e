//! Tool execution, one module per handler kind. Each kind's module owns its YAML spec, its
//! compile step (over the shared context of `config::compile`) and its run step (with the
//! `runtime` feature); a new kind is one module plus a line in `config::Handler`,
//! `config::CompiledHandler`, `config::compile` and [`Executor`].

pub mod ask;
pub mod builtin;
pub mod content;
pub mod exec;
pub mod http;
pub mod pipeline;
pub mod template;

#[cfg(feature = "runtime")]
mod executor;
#[cfg(feature = "runtime")]
pub(crate) mod output;
#[cfg(feature = "runtime")]
#[allow(unsafe_code)] // kill(2), waitpid(2), prctl(2): every unsafe block states its contract
pub(crate) mod process;

#[cfg(feature = "runtime")]
pub use self::executor::*;
#[cfg(feature = "runtime")]
pub use self::http::run::HttpClient;
#[cfg(feature = "runtime")]
pub(crate) use self::output::WithSecrets;
#[cfg(feature = "runtime")]
pub use self::output::{OutputFuture, ToolOutput};
#[cfg(feature = "runtime")]
pub use self::process::start_reaper;

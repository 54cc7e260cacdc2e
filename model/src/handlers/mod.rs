//! The handler kinds, one module per kind: its YAML spec and its compile step (over the
//! shared context of `config::compile`) into the typed form the server runs. The run step
//! of each kind lives in the server (`quiver_server::exec`); a new kind is one module here,
//! a line in `config::Handler`, `config::CompiledHandler` and `config::compile`, and its run
//! step in the server's executor.

pub mod ask;
pub mod builtin;
pub mod content;
pub mod exec;
pub mod http;
pub mod pipeline;
pub mod template;

//! quiver-server: the MCP server runtime and gateway. It compiles ToolSets (the
//! [`quiver_model`] crate) into an immutable registry, serves it over Streamable HTTP and
//! stdio, runs each call through the admission chain and the handler's run step, and swaps
//! the registry on reload. docs/architecture.md maps the folders.

#[cfg(feature = "jemalloc")]
#[allow(unsafe_code)] // a GlobalAlloc implementation; every unsafe block states its contract
pub mod alloc;

pub use quiver_model::{config, guard, handlers, redact, schema, search, spec, template};
pub use quiver_otel as otel;

pub mod admin;
pub mod audit;
pub mod cli;
pub mod dispatch;
pub mod exec;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod net;
pub mod oauth;
pub mod peer;
pub mod policies;
pub mod protocol;
pub mod registry;
pub mod reload;
pub mod secrets;
pub mod session;
pub mod sys;
pub mod tokens;
pub mod transport;
pub mod tuning;
pub mod upstream;

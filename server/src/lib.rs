//! quiver-server: an MCP server whose tools are declared in YAML.
//!
//! Without the `runtime` feature this crate is the ToolSet model ([`config`]), its JSON-Schema
//! compiler ([`schema`]) and templates ([`template`]): what the operator needs to validate
//! tool configs. With it, the registry, dispatch, handlers, transports and reload sources.

#[cfg(feature = "jemalloc")]
#[allow(unsafe_code)] // a GlobalAlloc implementation; every unsafe block states its contract
pub mod alloc;
pub mod config;
pub mod handlers;
pub mod redact;
pub mod schema;
pub mod search;
pub mod template;

#[cfg(feature = "runtime")]
pub mod admin;
#[cfg(feature = "runtime")]
pub mod audit;
#[cfg(feature = "runtime")]
pub mod cli;
#[cfg(feature = "runtime")]
pub mod dispatch;
#[cfg(feature = "runtime")]
pub mod gov_metrics;
#[cfg(feature = "runtime")]
pub mod identity;
#[cfg(feature = "runtime")]
pub mod limits;
#[cfg(feature = "runtime")]
pub mod metrics;
#[cfg(feature = "runtime")]
pub mod modern;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "runtime")]
pub mod peer;
#[cfg(feature = "runtime")]
pub mod policies;
#[cfg(feature = "runtime")]
pub mod protocol;
#[cfg(feature = "runtime")]
pub mod registry;
#[cfg(feature = "runtime")]
pub mod reload;
#[cfg(feature = "runtime")]
pub mod resp;
#[cfg(feature = "runtime")]
#[allow(unsafe_code)] // prctl(2) and the Landlock syscalls: every unsafe block states its contract
pub mod sandbox;
#[cfg(feature = "runtime")]
pub mod secrets;
#[cfg(feature = "runtime")]
pub mod session;
#[cfg(feature = "runtime")]
pub mod transport;
#[cfg(feature = "runtime")]
pub mod tuning;
#[cfg(feature = "runtime")]
pub mod upstream;

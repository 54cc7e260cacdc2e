//! quiver-server: an MCP server whose tools are declared in YAML.
//!
//! Without the `runtime` feature this crate is the ToolSet model ([`config`]), its JSON-Schema
//! compiler ([`schema`]) and templates ([`template`]): what the operator needs to validate
//! tool configs. With it, the registry, dispatch, handlers, transports and reload sources.

pub mod config;
pub mod schema;
pub mod template;

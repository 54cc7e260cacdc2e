//! The Quiver operator: reconciles `McpServer` objects into tuned quiver-server Deployments.
//!
//! The controller itself is tracked in its own issue; this crate already depends on the
//! server's ToolSet model (default features off) so both share one definition of a tool.

pub use quiver_server::config::ToolSet;

//! The Quiver operator: reconciles `McpServer` objects into tuned quiver-server Deployments,
//! a ConfigMap of tools the pods hot-reload, and the objects around them.

pub mod admin;
pub mod backoff;
pub mod build;
pub mod catalog;
pub mod console;
pub mod controller;
pub mod crd;
pub mod guard;
pub mod leader;
pub mod metrics;
pub mod plugin;
pub mod probe;
pub mod reconcile;
pub mod render;
pub mod telemetry;

pub use quiver_model::config::ToolSet;

//! Transports: Streamable HTTP (axum over our own hyper accept loop) and stdio, and the
//! limits they enforce.

pub mod auth;
pub mod forwarded;
pub mod http;
pub mod jwt;
pub mod limits;
pub mod listen;
pub mod per_core;
pub mod resume;
pub mod sessions;
pub mod stdio;

#[cfg(test)]
mod client_addr_tests;

//! Transports: Streamable HTTP (axum) and stdio.

pub mod http;
pub mod stdio;

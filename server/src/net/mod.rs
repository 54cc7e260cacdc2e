//! What the server talks to the outside with, below everything that uses it: the shared
//! outbound HTTP client and its trust roots, the Redis (RESP2) client, file-change events,
//! and time formatting.

pub mod events;
pub mod http;
pub mod resp;
pub mod time;
pub mod trust;

//! What the server talks to the outside with, below everything that uses it: the shared
//! outbound HTTP client and its trust roots, the Redis (RESP2) client and its TLS, file-change events,
//! the watch of one ConfigMap, and time formatting.

#[cfg(feature = "kube")]
pub mod configmap;
pub mod events;
pub mod http;
pub mod resp;
pub mod resp_tls;
pub mod time;
pub mod trust;

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

/// Reads a request's head (up to its blank line) from a test's loopback server connection;
/// `None` when the peer closed or failed first.
#[cfg(test)]
pub(crate) async fn read_head(conn: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

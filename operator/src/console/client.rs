//! The console's outgoing HTTP: the OpenID provider (discovery, the token endpoint) and the
//! MCP endpoints of the servers it shows. Every answer is bounded in size and time.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// An answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Its `Content-Type`, empty when absent.
    pub content_type: String,
    /// Its body.
    pub body: Bytes,
}

/// An HTTP/1.1 client over TCP or TLS (the Web PKI's roots).
#[derive(Clone)]
pub struct Http {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Http")
    }
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    /// A client with a connection pool.
    pub fn new() -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(Duration::from_secs(5)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(8)
                .build(https),
        }
    }

    /// Sends `req`; reads at most `max` bytes of the answer, all within `timeout`.
    ///
    /// # Errors
    /// A sentence: unreachable, timed out, or a body over `max`.
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
        max: usize,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let host = req.uri().host().unwrap_or_default().to_owned();
        let work = async {
            let r = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("{host} could not be reached: {}", error_chain(&e)))?;
            let status = r.status().as_u16();
            let content_type = r
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = Limited::new(r.into_body(), max)
                .collect()
                .await
                .map_err(|_| format!("the answer of {host} was cut off or larger than {max} bytes"))?
                .to_bytes();
            Ok(Reply {
                status,
                content_type,
                body,
            })
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| Err(format!("{host} did not answer within {} s", timeout.as_secs())))
    }
}

/// An error and its causes, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
